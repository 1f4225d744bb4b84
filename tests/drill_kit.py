"""Shared by the kill drills (tests/test_drills.py) and their long version (benchmarks/drills.py): a slow
fake trainer for the command backend, a recipe that runs it, and helpers to kill and inspect.

The fake trainer is honest about what it is: a deterministic learning curve with a known critical
batch (samples to target grow as 1 + N / N_crit, McCandlish et al. 2018), seeded noise, one JSON line
per step, a sleep per step so a kill lands mid-run, and its pid written beside the log. It runs as a
grandchild of batchtune (``sh -c "python ... & wait"``), the case PR_SET_PDEATHSIG alone misses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

FAKE_TRAINER = textwrap.dedent(
    """
    import json, math, os, random, sys, time
    prompts, group, seed, max_steps = (int(x) for x in sys.argv[1:5])
    lr, out, sleep_s = float(sys.argv[5]), sys.argv[6], float(sys.argv[7])
    with open(os.path.join(out, "pid"), "w") as fh:
        fh.write(str(os.getpid()))
    rng = random.Random(seed * 1000 + prompts * group)
    n, n_crit, progress = prompts * group, 16.0, 0.0
    with open(os.path.join(out, "log.jsonl"), "w") as log:
        for step in range(1, max_steps + 1):
            progress += n / (1.0 + n / n_crit) / 60.0
            reward = 1.0 - math.exp(-progress) + rng.gauss(0.0, 0.01)
            row = {"step": step, "samples": step * n, "prompts": prompts, "group_size": group,
                   "lr": lr, "seed": seed, "reward": reward, "loss": 1.0 - reward}
            log.write(json.dumps(row) + "\\n")
            log.flush()
            time.sleep(sleep_s)
    """
)


def write_command_recipe(root: Path, sleep_s: float = 0.02, workers: int = 1) -> Path:
    """A command-backend recipe over the fake trainer (3 batches x 2 seeds); returns its path."""
    root.mkdir(parents=True, exist_ok=True)
    script = root / "fake_trainer.py"
    script.write_text(FAKE_TRAINER)
    inner = (
        f"{sys.executable} {script} {{prompts}} {{group_size}} {{seed}} {{max_steps}} {{lr}} "
        f"{{output_dir}} {sleep_s} & wait"
    )
    recipe = root / "cmd.toml"
    recipe.write_text(
        textwrap.dedent(
            f"""
            # kill drill: a slow fake trainer run through the command backend
            [run]
            workers = {workers}
            [candidates]
            prompts = [1, 2, 4]
            group_size = 4
            [budget]
            max_samples = 320
            seeds = [0, 1]
            [target]
            metric = "reward"
            value = 0.8
            [backend]
            training = "command"
            command = ["sh", "-c", {json.dumps(inner)}]
            command_log = "log.jsonl"
            """
        )
    )
    return recipe


def probe_cmd(recipe: Path, results: Path) -> list[str]:
    return [sys.executable, "-m", "batchtune", "probe", str(recipe), "-r", str(results), "--json"]


def trainer_pids(results: Path) -> list[int]:
    """Pids of every fake trainer started in ``results`` (stale attempts included)."""
    pids = []
    for path in results.glob("runs/*/output*/pid"):
        try:
            pids.append(int(path.read_text()))
        except (OSError, ValueError):
            continue
    return pids


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def wait_dead(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    """The pids still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        live = [p for p in pids if alive(p)]
        if not live:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def kill_mid_probe(cmd: list[str], results: Path, after_runs: int, extra_delay_s: float = 0.0) -> int:
    """Start ``cmd``, wait until ``after_runs`` runs are finished (and a trainer started), then kill -9
    it; returns the number of finished runs at the kill."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(results.glob("runs/*/run.json"))) >= after_runs and trainer_pids(results):
            break
        time.sleep(0.02)
    time.sleep(extra_delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return len(list(results.glob("runs/*/run.json")))


def summary(data: dict) -> dict:
    """What must not change across a kill: each candidate's status and per-seed samples to target."""
    return {c["name"]: (c["status"], c["per_seed_samples_to_target"]) for c in data["candidates"]}


def sigint_as_a_terminal_sends_it() -> None:
    """For a child: SIGINT back to its default and unblocked. A test run started in the background of
    a non-interactive shell (`cmd &`) inherits SIGINT ignored, and a Python started so never raises
    KeyboardInterrupt: its Ctrl-C would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
