#!/usr/bin/env bash
# Prepared GPU check for a lent device machine (one H200): the vLLM generation profile of a
# Qwen2.5-0.5B-shaped model with random weights, then the GPU-marked tests. NOT RUN YET: no GPU was
# available when it was written (see docs/profile-gen.md, "GPU check").
#
#   bash benchmarks/gpu_profile.sh            # on the device machine, from the repository root
#
# - Wheels carried in .whl/ (if any) are installed offline into /tmp/site and put on PYTHONPATH;
#   batchtune itself comes from the working tree (PYTHONPATH=$PWD), no install needed.
# - If vllm still cannot be imported, the same recipe runs on the transformers backend instead
#   (HF generate on the GPU, same shape), so the session still gets a GPU profile; the summary says so.
# - Everything lands in $OUT (default /tmp/bt-gpu-out): versions, nvidia-smi, the profile JSON, the
#   results directory (throughput.jsonl, plots), the pytest log, and summary.txt.
# Budget: about 5 minutes of device time after the machine is up (vLLM start-up with CUDA graphs
# ~1-2 min, the sweep ~2-3 min, tests ~1 min); each step has its own timeout.
set -uo pipefail

OUT="${OUT:-/tmp/bt-gpu-out}"
mkdir -p "$OUT"
RECIPE=recipes/vllm-qwen-0.5b-shape.toml
SHAPE_DIR=bt-shapes/qwen2.5-0.5b
RESULTS=bt-results/vllm-qwen-0.5b-shape

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    > "$OUT/pip.txt" 2>&1 || echo "pip install of .whl/ failed (see pip.txt)" | tee -a "$OUT/summary.txt"
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
python3 - > "$OUT/versions.txt" 2>&1 <<'EOF'
import importlib.util, torch, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("transformers", transformers.__version__)
if importlib.util.find_spec("vllm"):
    import vllm
    print("vllm", vllm.__version__)
else:
    print("vllm missing")
EOF
cat "$OUT/versions.txt"

python3 -c "from batchtune.backends.gen_vllm import write_shape_dir; write_shape_dir('$SHAPE_DIR')"
rm -rf "$RESULTS"

SET=()
if ! python3 -c "import vllm" > /dev/null 2>&1; then
  echo "vllm not importable: profiling with the transformers backend instead" | tee -a "$OUT/summary.txt"
  SET=(--set generation.backend=transformers --set "generation.concurrency=[8, 16, 32, 64, 128, 256, 512]")
fi

start=$(date +%s)
timeout 420 python3 -m batchtune profile-gen "$RECIPE" --json "${SET[@]}" \
  > "$OUT/profile.json" 2> "$OUT/profile.stderr"
rc=$?
echo "profile-gen rc=$rc wall_s=$(( $(date +%s) - start ))" | tee -a "$OUT/summary.txt"
tail -n 30 "$OUT/profile.stderr"
[ -d "$RESULTS" ] && cp -r "$RESULTS" "$OUT/results"

python3 - "$OUT/profile.json" >> "$OUT/summary.txt" 2>&1 <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:  # the CLI failed or printed no JSON
    print("no profile JSON:", exc)
    sys.exit(0)
print("device", d.get("device"), "backend", d.get("backend"), "hardware", (d.get("hardware") or {}).get("name"))
for mode, m in (d.get("modes") or {}).items():
    print(mode, "knee", m.get("critical_concurrency"), "fraction_of_bound_at_knee", m.get("knee_fraction_of_bound"),
          "ceiling", m.get("ceiling"))
    for p in m.get("points", []):
        print("  c", p["concurrency"], p["status"], "responses_per_s", round(p["responses_per_s"], 1),
              "output_tokens_per_s", round(p["output_tokens_per_s"], 1), "preemptions", p["preemptions"])
print("target: fixed-mode fraction_of_bound at the knee >= 0.70")
EOF

if python3 -c "import pytest" > /dev/null 2>&1; then
  timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests > "$OUT/pytest-gpu.txt" 2>&1
  echo "pytest -m gpu rc=$?" | tee -a "$OUT/summary.txt"
  tail -n 5 "$OUT/pytest-gpu.txt"
else
  echo "pytest not installed on the device: GPU tests not run" | tee -a "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
