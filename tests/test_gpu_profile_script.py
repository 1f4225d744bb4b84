"""benchmarks/gpu_profile.sh, the prepared GPU check, in its --dry-run mode (no GPU needed): it plans
the CPU path's own tests on CUDA, the same profile-gen --json check with hardware.device=cuda, and
the GPU tests, inside its time limit, and what it names exists and loads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # three Python start-ups and a pytest collection: 8 s at load 4.6, 24 s at load 10
def test_dry_run_plans_the_cpu_path_on_cuda_within_its_limit(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_profile.sh", "--dry-run"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text()
    plans = re.findall(r"^plan (\S+) \(timeout (\d+) s\): (.*)$", summary, re.M)
    lines = {name: cmd for name, _, cmd in plans}
    assert list(lines) == ["cuda-tests", "profile", "gpu-tests"]
    assert "BATCHTUNE_TEST_DEVICE=cuda" in lines["cuda-tests"]
    assert "-m vllm" in lines["cuda-tests"] and "tests/backends/test_vllm.py" in lines["cuda-tests"]
    assert "profile-gen" in lines["profile"] and "--json" in lines["profile"]
    assert "hardware.device=cuda" in lines["profile"]
    assert "-m gpu" in lines["gpu-tests"]
    total = sum(int(t) for _, t, _ in plans)
    assert total <= 540  # one device command may run 600 s
    # the tests it names collect here, and the recipe loads with its overrides
    collected = re.search(r"dry run: collected (\d+)", proc.stdout)
    assert collected and int(collected[1]) > 0
    assert "loads with" in proc.stdout and "device cuda" in proc.stdout
