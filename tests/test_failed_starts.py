"""A run that failed before its first training step (the trainer could not start: a missing module,
no GPU) measured nothing: it is not reused on rerun, and a reference that cannot start stops the
probe at once with exit 4. Diverged and out-of-memory runs stay data."""

from __future__ import annotations

import dataclasses
import json
import sys

from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.records.files import atomic_write_text, to_json
from batchtune.records.store import ResultsStore

# A stand-in trainer: pure Python, one JSON line per step. Without the file named by the `ENV_OK`
# marker it fails at import, as verl does when it is not installed; P = 4 runs out of memory at its
# first step (data) whatever the environment. It needs only the standard library, so it runs under
# `python -S` (no site-packages scan: ~0.04 s of CPU less per run; a probe here starts 6-7 of them).
TRAINER = """
import json, os, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
if not os.path.exists(a["--env"]):
    sys.exit("ModuleNotFoundError: No module named 'verl'")
p, g, seed = int(a["--prompts"]), int(a["--group_size"]), int(a["--seed"])
if p == 4:
    sys.exit("torch.OutOfMemoryError: CUDA out of memory")
crash = p == 2 and os.path.exists(a["--env"] + ".crash")  # trains two steps, then fails
with open(os.path.join(a["--out"], "log.jsonl"), "w") as log:
    for step in range(1, int(a["--max_steps"]) + 1):
        if crash and step == 3:
            log.flush()
            sys.exit("RuntimeError: loss is nan")
        n = step * p * g
        reward = min(1.0, n / (64.0 * (1 + 0.1 * seed)))
        log.write(json.dumps({"step": step, "samples": n, "prompts": p, "group_size": g,
                              "lr": 0.01, "seed": seed, "reward": reward}) + "\\n")
"""


def _recipe(tmp_path, prompts=(1, 2, 4)) -> str:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    cmd = [
        sys.executable, "-S", str(script), "--env", str(tmp_path / "ENV_OK"), "--prompts", "{prompts}",
        "--group_size", "{group_size}", "--seed", "{seed}", "--max_steps", "{max_steps}",
        "--out", "{output_dir}",
    ]  # fmt: skip
    path = tmp_path / "cmd.toml"
    path.write_text(
        f"[candidates]\nprompts = {list(prompts)}\ngroup_size = 4\n"
        "[target]\nmetric = 'reward'\nvalue = 0.5\n"
        "[budget]\nmax_samples = 256\nseeds = [0, 1]\nmax_extra_seeds = 0\n"
        f"[backend]\ntraining = 'command'\ncommand = {cmd!r}\ncommand_log = 'log.jsonl'\n"
    )
    return str(path)


def _probe(recipe: str, results, *extra: str):
    return CliRunner().invoke(app, ["probe", recipe, "-r", str(results), *extra])


def test_a_reference_that_cannot_start_stops_the_probe_and_is_run_again_once_fixed(tmp_path):
    recipe, results = _recipe(tmp_path), tmp_path / "r"
    first = _probe(recipe, results)
    assert first.exit_code == 4, first.output
    assert "failed before its first training step" in first.stderr
    assert "No module named 'verl'" in first.stderr
    store = ResultsStore(results)
    assert [r.run_id for r in store.runs()] == ["P1xG4-s0"]  # one attempt, not every run
    plan = CliRunner().invoke(app, ["plan", recipe, "-r", str(results)])
    assert plan.exit_code == 0 and "already finished" not in plan.stdout  # it will run again

    (tmp_path / "ENV_OK").write_text("")  # the user fixes the environment
    again = _probe(recipe, results)
    assert again.exit_code == 0, again.output
    assert "running again 1 run(s) that failed before training" in again.stdout
    assert "6 run(s) done, 0 reused" in again.stdout
    statuses = {r.run_id: r.status for r in store.runs()}
    assert statuses["P1xG4-s0"] == "reached_target" and statuses["P4xG4-s0"] == "oom"
    assert list(store.run_dir("P1xG4-s0").glob("run.failed-start-*.json"))  # kept aside, not deleted


def test_runs_that_could_not_start_are_retried_but_out_of_memory_is_data(tmp_path):
    recipe, results = _recipe(tmp_path), tmp_path / "r"
    (tmp_path / "ENV_OK").write_text("")
    assert _probe(recipe, results).exit_code == 0
    store = ResultsStore(results)
    # the larger batch's trainer could not start last time (its node lacked the module)
    rec = store.run("P2xG4-s1")
    assert rec is not None
    reason = "command exited with code 1: ModuleNotFoundError: No module named 'verl'"
    failed = dataclasses.replace(
        rec, status="failed", reason=reason, steps=0, samples=0, tokens=0, failed_start=True
    )
    atomic_write_text(store.run_dir("P2xG4-s1") / "run.json", to_json(failed) + "\n")
    rec_json = CliRunner().invoke(app, ["recommend", recipe, "-r", str(results), "--json"])
    seen = {c["name"]: c for c in json.loads(rec_json.stdout)["candidates"]}
    assert seen["P2xG4"]["n_seeds"] == 1 and not seen["P2xG4"]["failures"]  # not read: it measured nothing
    again = _probe(recipe, results)
    assert again.exit_code == 0, again.output
    assert "running again 1 run(s) that failed before training last time (P2xG4-s1" in again.stdout
    assert "1 run(s) done, 5 reused" in again.stdout  # the OOM runs are reused: data
    assert store.run("P2xG4-s1").status == "reached_target"
    assert {store.run(f"P4xG4-s{s}").status for s in (0, 1)} == {"oom"}


def test_a_backend_error_inside_a_run_is_exit_4_and_no_run_is_sealed(tmp_path, monkeypatch):
    from batchtune.backends.nqm import NQMBackend
    from batchtune.errors import BackendError

    def no_gpu(self, spec):
        raise BackendError("hardware.device = 'cuda' but no CUDA GPU is visible; use 'cpu' or 'auto'")
        yield  # a generator, as a backend's train is

    monkeypatch.setattr(NQMBackend, "train", no_gpu)
    out = _probe("nqm", tmp_path / "r", "--set", "candidates.prompts=[1,2]", "--set", "budget.seeds=[0]")
    assert out.exit_code == 4, out.output
    assert "no CUDA GPU is visible" in out.stderr
    assert ResultsStore(tmp_path / "r").runs() == []


def test_a_trainer_that_fails_after_training_steps_is_data_with_its_steps_and_never_retried(tmp_path):
    """Only the backend's word makes a failed start (RunFailed(started=False)): a trainer that logged
    two steps and then exited non-zero trained, so the run is data, its logged steps read even
    though they were never streamed, and a rerun reuses it. (Classified by samples == 0, such a run
    was re-run on every probe whenever its steps had not been streamed yet.)"""
    recipe, results = _recipe(tmp_path, prompts=(1, 2, 8)), tmp_path / "r"
    (tmp_path / "ENV_OK").write_text("")
    (tmp_path / "ENV_OK.crash").write_text("")
    first = _probe(recipe, results)
    assert first.exit_code == 0, first.output
    store = ResultsStore(results)
    for s in (0, 1):
        rec = store.run(f"P2xG4-s{s}")
        assert rec.status == "failed" and "loss is nan" in rec.reason
        assert rec.samples == 2 * 2 * 4 and not rec.failed_start
    again = _probe(recipe, results)
    assert again.exit_code == 0 and "0 run(s) done, 6 reused" in again.stdout, again.output
    assert "running again" not in again.stdout
