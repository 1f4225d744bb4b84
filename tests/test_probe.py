"""The probe driver on the NQM simulation: critical batch, failures as data, resume, kill -9, parallel."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.measure.probe import run_probe
from batchtune.recipe.load import load_recipe, shipped_recipes

NQM = str(shipped_recipes()["nqm"])


def _summary(data: dict) -> dict:
    return {c["name"]: (c["status"], c["per_seed_samples_to_target"]) for c in data["candidates"]}


# The planned grid only (24 runs), for the tests of kills, races and tune: sequential extra seeds
# (measure/sequential.py) have their own tests, and the shipped answer is checked with them on.
FIXED = ["--set", "budget.max_extra_seeds=0"]


def _probe_json(results: Path, *extra: str) -> dict:
    out = CliRunner().invoke(app, ["probe", NQM, "-r", str(results), "--json", *extra])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[Path, dict]:
    """One NQM probe shared by the module (read-only: copy it with `_copy` before mutating)."""
    results = tmp_path_factory.mktemp("baseline") / "r"
    return results, _probe_json(results)


def _copy(baseline: tuple[Path, dict], dest: Path) -> Path:
    shutil.copytree(baseline[0], dest)
    return dest


def test_nqm_probe_finds_critical_batch_and_records_divergence(baseline):
    results, data = baseline
    crit = data["critical_training_batch"]
    # analytic critical batch of this recipe: 431 responses (docs/nqm.md); probed grid doubles
    assert crit["lower"] == 256 and crit["upper"] == 512
    by = {c["name"]: c for c in data["candidates"]}
    assert by["P1xG8"]["status"] == "reference"
    assert all(by[f"P{p}xG8"]["status"] == "invariant" for p in (2, 4, 8, 16, 32))
    assert by["P64xG8"]["status"] == "deviates"
    assert by["P128xG8"]["status"] == "failed"
    assert all("diverged" in f for f in by["P128xG8"]["failures"])  # data, not a crash
    assert Path(data["plot"]).is_file()
    runs = list((results / "runs").glob("*/run.json"))
    extra = sum(c["extra_seeds"] for c in data["candidates"])  # seeds added where a verdict was open
    assert len(runs) == 24 + extra and extra <= 3 * 2 * len(data["candidates"])


def test_resume_redoes_only_unfinished_runs(tmp_path, baseline):
    results = _copy(baseline, tmp_path / "r")
    first = baseline[1]
    finished = sorted((results / "runs").glob("*/run.json"))
    stamps = {p: p.stat().st_mtime_ns for p in finished}
    victims = [results / "runs/P4xG8-s1/run.json", results / "runs/P64xG8-s0/run.json"]
    for v in victims:
        v.unlink()  # as if the process died before sealing them
    second = _probe_json(results)
    assert second["runs_done"] == 2 and second["runs_reused"] == 22
    for p, stamp in stamps.items():
        if p not in victims:
            assert p.stat().st_mtime_ns == stamp  # never rewritten
    assert _summary(second) == _summary(first)
    assert list((results / "runs/P4xG8-s1").glob("steps.stale-*.jsonl"))  # old attempt kept


@pytest.mark.slow
def test_kill_minus_nine_then_resume_gives_the_same_answer(tmp_path):
    slow = ["--set", "nqm.dim=3000"]  # ~10 s in all, so the kill lands mid-probe
    reference = _probe_json(tmp_path / "whole", *FIXED, *slow)
    results = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "batchtune", "probe", NQM, "-r", str(results), "--json", *FIXED, *slow],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(list(results.glob("runs/*/run.json"))) < 4:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(list(results.glob("runs/*/run.json")))
    assert 4 <= done_before < 24, "the kill should land mid-probe"
    resumed = _probe_json(results, *FIXED, *slow)
    assert resumed["runs_reused"] == done_before
    assert _summary(resumed) == _summary(reference)


@pytest.mark.slow  # multi-process: ~20-30 s on 2 cores; CI runs the slow tests too
def test_parallel_workers_give_the_same_answer(tmp_path, baseline):
    serial = baseline[1]
    parallel = _probe_json(tmp_path / "parallel", "--workers", "2")
    assert _summary(parallel) == _summary(serial)


@pytest.mark.slow  # multi-process: ~20-30 s on 2 cores; CI runs the slow tests too
def test_two_processes_on_one_directory(tmp_path):
    results = tmp_path / "shared"
    cmd = [sys.executable, "-m", "batchtune", "probe", NQM, "-r", str(results), "--json", *FIXED]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    runs = [json.loads(p.read_text()) for p in results.glob("runs/*/run.json")]
    assert len(runs) == 24 and len({r["run_id"] for r in runs}) == 24
    for path in results.glob("runs/*/steps.jsonl"):  # runs/ also holds the rounds lock, a file
        steps = path.read_text().splitlines()
        assert [json.loads(s)["step"] for s in steps] == sorted({json.loads(s)["step"] for s in steps})


def test_a_different_recipe_is_refused_in_the_same_directory(tmp_path, baseline):
    results = _copy(baseline, tmp_path / "r")
    out = CliRunner().invoke(app, ["probe", NQM, "-r", str(results), "--set", "optimizer.lr=0.01"])
    assert out.exit_code == 2
    assert "different recipe" in out.output and "optimizer.lr" in out.output


def test_probe_output_feeds_recommend(tmp_path, baseline):
    results = _copy(baseline, tmp_path / "r")
    out = CliRunner().invoke(app, ["recommend", "-r", str(results), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["recommended"]["prompts"] in (16, 32, 64)
    assert data["throughput_source"].startswith("probe timings")  # no profile run yet
    ranked = [c for c in data["candidates"] if c["time_ratio"] is not None and c["rank_sample_ratio"]]
    assert len(ranked) >= 2  # the time table's R/R0 is what its T/T0 is made of, in JSON too
    for c in ranked:
        assert c["time_ratio"] == pytest.approx(c["rank_sample_ratio"] / c["throughput_ratio"], rel=1e-9)


def test_recommend_says_why_it_cannot_rank_from_what_the_results_directory_holds(tmp_path, baseline):
    """A target past the probe's own (its runs stopped there) was told to "run longer
    (budget.max_samples)"; a probe stopped after its reference was told "fewer than two candidates
    have both samples-to-target and throughput". Each now names what to do."""
    results = _copy(baseline, tmp_path / "r")
    past = CliRunner().invoke(app, ["recommend", NQM, "-r", str(results), "--set", "target.value=0.5"])
    assert past.exit_code == 3, past.output
    assert "stopped at its own target" in past.output and "--set target.value=0.5" in past.output
    assert "run longer" not in past.output
    for run in (results / "runs").iterdir():
        # the reference alone finished, as after an interrupt (runs/.rounds.lock is no run)
        if run.is_dir() and not run.name.startswith("P1xG8-"):
            (run / "run.json").unlink(missing_ok=True)
    unfinished = CliRunner().invoke(app, ["recommend", NQM, "-r", str(results)])
    assert unfinished.exit_code == 3, unfinished.output
    assert "the probe is unfinished" in unfinished.output and "rerun the same" in unfinished.output


def test_tune_runs_all_three(tmp_path, baseline):
    """On the module's finished probe, so its probe stage reuses every run (a fresh tune's probe is
    run in test_report_html and measure/test_probe_size); profile-gen and recommend run in full."""
    results = _copy(baseline, tmp_path / "t")
    sealed = {p: p.stat().st_mtime_ns for p in results.glob("runs/*/run.json")}
    out = CliRunner().invoke(app, ["tune", NQM, "-r", str(results), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["critical_training_batch"] == baseline[1]["critical_training_batch"]  # the probe's answer
    assert {p: p.stat().st_mtime_ns for p in results.glob("runs/*/run.json")} == sealed  # nothing rerun
    assert (results / "throughput.jsonl").stat().st_size > 0  # profile-gen measured and stored
    assert data["throughput_source"].startswith("profile-gen")
    assert data["critical_generation_batch"]["concurrency"] > 8
    assert data["recommended"]["generation_concurrency"] >= 1


def test_library_api(tmp_path, baseline):
    results = _copy(baseline, tmp_path / "lib")
    (results / "runs/P2xG8-s0/run.json").unlink()  # one run left to do, so every event fires
    recipe = load_recipe(NQM, [f"run.results_dir={json.dumps(str(results))}"])
    events = []
    result = run_probe(recipe, progress=lambda kind, info: events.append(kind))
    assert result.efficiency.critical.batch == baseline[1]["critical_training_batch"]["batch_responses"]
    assert {"plan", "start", "step", "end"} <= set(events)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [("budget.seeds=[]", "needs at least one seed"), ("target.tolerance=0", "tolerance")],
)
def test_bad_recipe_values(tmp_path, override, fragment):
    out = CliRunner().invoke(app, ["probe", NQM, "-r", str(tmp_path), "--set", override])
    assert out.exit_code == 2 and fragment in out.output and "Traceback" not in out.output


def test_runs_at_another_lr_are_not_reused(tmp_path):
    """Adding a smaller batch moves the reference batch and every scaled LR: refuse to mix."""
    results = tmp_path / "r"
    same = ["--set", "budget.seeds=[0]", "--set", "target.value=1.1"]  # N = 32 reaches 1.1, not 1.0
    _probe_json(results, "--set", "candidates.prompts=[4, 8]", *same)
    out = CliRunner().invoke(
        app, ["probe", NQM, "-r", str(results), "--set", "candidates.prompts=[2, 4, 8]", *same]
    )
    assert out.exit_code == 2 and "reference batch" in out.output


def test_a_batch_in_both_sweeps_stays_in_the_main_sweep(tmp_path):
    data = _probe_json(
        tmp_path / "r",
        "--set", "candidates.prompts=[1, 2, 4, 8]",
        "--set", "candidates.group_sweep_total=32",
        "--set", "candidates.group_sweep_sizes=[4, 8, 16]",
        "--set", "budget.seeds=[0]",
        # the families come from the plan: a short run of a small NQM shows them as well
        "--set", "nqm.dim=100", "--set", "budget.max_samples=2048", "--set", "target.value=3.0",
    )  # fmt: skip
    by = {c["name"]: c for c in data["candidates"]}
    assert by["P4xG8"]["family"] == "main"
    assert by["P8xG4"]["family"] == "group_sweep"


def test_a_probe_resumed_without_some_candidates_is_recommended_without_them(tmp_path, baseline):
    """A probe rerun with candidates.prompts narrowed keeps the dropped batches' runs. The manifest
    kept the first recipe, so `recommend --results DIR` (which reads it) still ranked them from those
    runs; now the resumed probe's recipe is stored, and both rank its candidates and say, in one
    note, which were left out. A probe run again with its stored recipe rewrites nothing."""
    results = _copy(baseline, tmp_path / "r")
    manifest = results / "manifest.json"
    before = manifest.stat().st_mtime_ns
    assert _probe_json(results)["runs_done"] == 0 and manifest.stat().st_mtime_ns == before
    # a rerun refused (the smallest batch dropped moves every scaled LR) stores nothing of its recipe
    argv = ["probe", NQM, "-r", str(results), "--set", "candidates.prompts=[2, 4, 8]"]
    refused = CliRunner().invoke(app, argv)
    assert refused.exit_code == 2 and "lr_scaling.reference_batch" in refused.output, refused.output
    assert manifest.stat().st_mtime_ns == before
    probed = _probe_json(results, "--set", "candidates.prompts=[1, 2, 4, 8, 16, 32]")
    out = CliRunner().invoke(app, ["recommend", "-r", str(results), "--json"])
    assert out.exit_code == 0, out.output
    rec = json.loads(out.stdout)
    ranked = {c["name"] for c in rec["candidates"]}
    assert ranked == {c["name"] for c in probed["candidates"]} == {f"P{p}xG8" for p in (1, 2, 4, 8, 16, 32)}
    said = [n for n in rec["notes"] if n.startswith("left out ")]
    assert len(said) == 1 and "P128xG8, P64xG8" in said[0] and "re-add them to rank them" in said[0]
    assert (results / "runs/P64xG8-s0/run.json").is_file()  # kept: re-adding the batch ranks it again


def test_a_probe_resumed_at_fewer_seeds_stores_no_seeds(tmp_path, baseline):
    """A resumed probe stores the candidates of its recipe in the manifest, and nothing else. It
    stored every key that differed, budget.seeds too: a rerun at seed 0 alone ran nothing, yet
    `recommend --results DIR` then counted the planned seeds 1 and 2 as sequential extras
    ("P1xG8 +4" for "+2"). The manifest keeps its seeds; both directories read the same."""
    a, b = _copy(baseline, tmp_path / "a"), _copy(baseline, tmp_path / "b")
    manifest = b / "manifest.json"
    before = manifest.read_text()
    assert _probe_json(b, "--set", "budget.seeds=[0]")["runs_done"] == 0
    assert manifest.read_text() == before
    assert json.loads(before)["recipe"]["budget"]["seeds"] == [0, 1, 2]

    def recommended(results: Path) -> tuple[list, list]:
        out = CliRunner().invoke(app, ["recommend", "-r", str(results), "--json"])
        assert out.exit_code == 0, out.output
        rec = json.loads(out.stdout)
        return rec["candidates"], [n for n in rec["notes"] if str(results) not in n]

    cands, notes = recommended(b)
    assert (cands, notes) == recommended(a)
    assert [c["extra_seeds"] for c in cands if c["name"] == "P1xG8"] == [2]
