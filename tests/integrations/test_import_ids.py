"""import-logs: run ids that never collide silently, TRL's output dir as the id, globs and several
paths in one call, TRL's step time carried as the throughput of the cluster that logged it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.records.store import ResultsStore


def _trl_run(out_dir: Path, ckpt: int, rng: np.random.Generator, step_time: float) -> Path:
    """A TRL output dir as GRPOTrainer leaves it: trainer_state.json only inside checkpoint-N."""
    d = out_dir / f"checkpoint-{ckpt}"
    d.mkdir(parents=True)
    history = [
        {"step": s, "reward": float(min(1.0, 0.1 * s + rng.normal(0, 0.02))), "step_time": step_time}
        for s in range(1, 11)
    ]
    (d / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    return out_dir


def _import(results: Path, *args: str):
    base = ["import-logs", "--format", "trl", "--prompts", "2", "--group-size", "4", "--lr", "1e-4"]
    return CliRunner().invoke(app, [*base, *args, "-r", str(results), "--metric", "reward", "--json"])


def test_trl_runs_take_their_output_dir_and_a_glob_imports_several(tmp_path: Path):
    rng = np.random.default_rng(0)
    for name in ("run-a", "run-b"):
        _trl_run(tmp_path / "logs" / name, 500, rng, step_time=2.0)
    glob = str(tmp_path / "logs" / "run-*")
    out = _import(tmp_path / "r", glob)  # one candidate, and TRL's logs carry no seed: both seed 0
    assert out.exit_code == 2 and "run-a" in out.output and "run-b" in out.output, out.output
    assert "--seed N" in out.output and not (tmp_path / "r" / "runs").exists()
    for seed, name in enumerate(("run-a", "run-b")):
        one = _import(tmp_path / "r", glob.replace("run-*", name), "--seed", str(seed))
        assert json.loads(one.stdout)["added"] == [name]  # its output dir, not checkpoint-500
    runs = ResultsStore(tmp_path / "r").runs()
    assert all(r.train_s > 0 and r.other_s == 0 for r in runs)  # TRL step_time: the whole step


def test_a_different_run_under_a_taken_id_is_an_error_naming_run_id(tmp_path: Path):
    rng = np.random.default_rng(1)
    a = _trl_run(tmp_path / "x" / "out", 500, rng, 1.0)
    b = _trl_run(tmp_path / "y" / "out", 300, rng, 1.0)  # another run, same folder name
    assert _import(tmp_path / "r", str(a)).exit_code == 0
    again = _import(tmp_path / "r", str(a))  # the same file again: skipped, as before
    assert again.exit_code == 0 and json.loads(again.stdout)["skipped"] == ["out"]
    clash = _import(tmp_path / "r", str(b))
    assert clash.exit_code == 2 and "--run-id" in clash.output and "'out'" in clash.output
    both = _import(tmp_path / "r2", str(a), str(b))
    assert both.exit_code == 2 and "--run-id" in both.output
    assert _import(tmp_path / "r", str(b), "--run-id", "out-y", "--seed", "1").exit_code == 0


def test_a_glob_matching_nothing_is_an_error(tmp_path: Path):
    out = _import(tmp_path / "r", str(tmp_path / "nothing-*"))
    assert out.exit_code == 2 and "matches no file" in out.output
