"""Branched probes on the NQM: a trunk, checkpointed branches, resumable runs (kill -9 safe)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from batchtune.analysis.branched.ratios import MORE, adoption
from batchtune.measure.branched import branched_store, run_branched_probe
from batchtune.recipe.load import load_recipe

SETS = [
    "probe.mode=branched",
    "branch.trunk_samples=1024",
    "branch.window_samples=512",
    "branch.checkpoints=[0.5, 1.0]",
    "candidates.prompts=[1, 8, 32, 64, 128]",
    "budget.seeds=[0, 1]",
]


def _recipe(tmp: Path):
    return load_recipe("recipes/nqm.toml", [*SETS, f"run.results_dir={tmp}"])


def _answer(result) -> dict:
    sm = result.summary
    return {
        "points": [round(lc.point, 6) for lc in sm.locals],
        "ratios": [{b: dict(r) for b, r in lc.ratios.items()} for lc in sm.locals],
        "cost": result.efficiency.total_samples,
    }


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory):
    """One branched probe of SETS in a fresh directory, shared by the module: (its results_dir, its
    result). Read-only: a test that reruns or changes it copies the directory first."""
    results = tmp_path_factory.mktemp("clean")
    return results, run_branched_probe(_recipe(results))


def test_branched_probe_runs_resumes_and_never_redoes_a_sealed_branch(tmp_path: Path, clean) -> None:
    first = clean[1]
    assert first.runs_done > 0 and first.runs_skipped == 0
    sm = first.summary
    assert [lc.checkpoint_samples for lc in sm.locals] == [512.0, 1024.0]
    # the control is the trunk's own continuation for the trunk's seed: ratio exactly 1
    assert all(lc.ratios[8.0][0] == 1.0 for lc in sm.locals)
    # N = 1024 at lr 3.84 diverges (NQM: lr * h_max > 2), and 512 has seeds that fall behind: the
    # largest batch adopted is below both
    assert all(lc.critical.batch is not None and lc.critical.batch < 512 for lc in sm.locals)
    assert sm.trunk_samples == 1024 and first.efficiency.total_samples == sm.probe_samples
    shutil.copytree(clean[0], tmp_path, dirs_exist_ok=True)  # the rerun writes its locks and notes here
    sealed = {p: p.stat().st_mtime_ns for p in branched_store(tmp_path).runs_dir.glob("*/run.json")}
    again = run_branched_probe(_recipe(tmp_path))
    assert again.runs_done == 0 and again.runs_skipped == first.runs_done
    assert {p: p.stat().st_mtime_ns for p in sealed} == sealed
    assert _answer(again) == _answer(first)


def _stored(results: Path) -> dict[str, tuple]:
    store = branched_store(results)
    return {
        r.run_id: (r.status, r.samples, [(s.samples, s.metrics) for s in store.steps(r.run_id)])
        for r in store.runs()
    }


@pytest.mark.slow  # 10 s at load 4; the one-worker kill test covers the same answer by default
def test_run_workers_run_a_rounds_controls_and_branches_at_once_to_the_same_answer(tmp_path: Path) -> None:
    """run.workers = 2: each round's seeds (their controls, then their branches) run in a pool of
    worker processes; every run and curve is the one the sequential probe makes."""
    one = run_branched_probe(_recipe(tmp_path / "one"))
    two = run_branched_probe(
        load_recipe("recipes/nqm.toml", [*SETS, f"run.results_dir={tmp_path / 'two'}", "run.workers=2"])
    )
    assert _answer(two) == _answer(one) and two.runs_done == one.runs_done
    assert _stored(tmp_path / "two") == _stored(tmp_path / "one")
    shared = {r.run_id: r.parallel_runs for r in branched_store(tmp_path / "two").runs()}
    assert shared.pop("trunk-P1xG8-s0") == 1  # the trunk runs alone, in this process
    # each checkpoint's controls start together, one per planned seed; a confirmation seed's branch
    # (seed 2) runs beside its own control
    assert all(shared[f"c{c}-P1xG8-s{s}"] == 2 for c in (512, 1024) for s in (0, 1))
    assert shared["c512-P32xG8-s2"] == shared["c512-P1xG8-s2"] == 2
    assert set(shared.values()) <= {1, 2}
    # the probe's own step times were measured on shared cores, and the ranking from them says so
    from batchtune.workflow.recommend import recommend_for_recipe

    two_cfg = load_recipe("recipes/nqm.toml", [*SETS, f"run.results_dir={tmp_path / 'two'}"])
    rec = recommend_for_recipe(two_cfg, "probe", None, 1, plot=False)[0]
    assert rec.throughput.source == "probe timings (simulated), contended"
    assert "timed sharing the machine (2 runs at a time)" in rec.throughput.notes[0]
    rec_one = recommend_for_recipe(_recipe(tmp_path / "one"), "probe", None, 1, plot=False)[0]
    assert rec_one.throughput.source == "probe timings (simulated), each run alone"


def test_a_large_branch_gets_its_own_window_of_min_steps_and_the_longer_control_is_paid_for(
    tmp_path: Path,
) -> None:
    """N = 1024 at lr 3.84 diverges in a full run but can keep up over one step: with its own
    window of 4 steps (branch.min_steps) it never reaches the control's level there, in any seed.
    The controls are extended by segments resumed from their own end (nothing rerun), and every
    segment is counted in the probe's cost, once."""
    cfg = load_recipe(
        "recipes/nqm.toml",
        [*SETS, "branch.checkpoints=[1.0]", "branch.search=all", f"run.results_dir={tmp_path}"],
    )
    res = run_branched_probe(cfg)
    (lc,) = res.summary.locals
    assert lc.windows == {256.0: 1024.0, 512.0: 2048.0, 1024.0: 4096.0}
    from batchtune.report.branched import branched_to_dict

    own = branched_to_dict(res.summary)["checkpoints"][0]["own_windows"]
    assert own == {"256": 1024, "512": 2048, "1024": 4096}
    assert all(math.isinf(r) for r in lc.ratios[1024.0].values())
    store = branched_store(tmp_path)
    ids = {r.run_id for r in store.runs()}
    # W = 512 covered by the first segment (to 1.25 W), then extended for 1024 (256), 2048 (512), 4096
    segments = sorted(r.samples for r in store.runs() if r.run_id.startswith("c1024-P1xG8-s1"))
    assert segments == [1664, 2304, 3584, 6144]  # each ends at 1.25 of its window past 1024
    assert {"c1024-P1xG8-s1", "c1024-P1xG8-s1-from1664", "c1024-P1xG8-s1-from3584"} <= ids
    start = {
        r.run_id: int(r.run_id.rsplit("-from", 1)[1]) if "-from" in r.run_id else 1024 for r in store.runs()
    }
    spent = sum(r.samples - (start[r.run_id] if r.run_id.startswith("c") else 0) for r in store.runs())
    assert res.summary.probe_samples == spent == res.efficiency.total_samples


def test_probe_cost_carries_the_full_runs_interval_and_the_ratio_range(clean) -> None:
    """A branched probe extrapolates R(B0) from its trunk: the cost ratio is only as sure as that,
    so probe_cost carries the full run's interval and the ratio's range over it."""
    from batchtune.report.json import probe_cost

    results, res = clean
    eff = res.efficiency
    cost = probe_cost(eff, None)
    lo, hi = (float(x) for x in cost["full_run_ci"])  # "inf" (JSON) where a seed was censored
    assert lo <= cost["full_run_samples"] <= hi
    # the seeds' interval of R(B0) x ratio widened by the extrapolation of R(B0), from the trunk
    # continued by its own seed's control (its exact continuation, resumed at the same seed), which
    # runs from where that curve stopped (it had not reached the target) to the latest form
    from batchtune.measure.branched import reference_curve

    r0, lo0, hi0 = res.summary.reference_samples_to_target
    s, v = reference_curve(branched_store(results), res.runs, "loss")
    ts, tv = res.runs.trunk.curve("loss")
    assert np.array_equal(s[: ts.size], ts) and np.all(np.diff(s) > 0) and s[-1] > 1024
    assert res.summary.extrapolated and lo0 == s[-1] and hi0 > r0
    assert res.summary.trunk_samples == 1024  # the trunk's cost is its own; the control's is a branch's
    est = eff.get(cost["full_run_candidate"]).estimate
    assert lo == pytest.approx(est.ci_low * lo0 / r0) and hi == pytest.approx(est.ci_high * hi0 / r0)
    from batchtune.report.terminal import r_statistic

    assert r_statistic(eff) == "geometric mean"  # the table's R column says how seeds were read
    r_lo, r_hi = (float(x) for x in cost["ratio_range"])
    assert r_lo <= cost["ratio"] <= r_hi
    assert r_hi == pytest.approx(cost["samples"] / lo) and r_lo == pytest.approx(cost["samples"] / hi)
    # the probe's samples in steps of the full run's candidate: comparable with the user's own run
    batch = eff.get(cost["full_run_candidate"]).batch_responses
    assert cost["steps_equivalent"] == pytest.approx(cost["samples"] / batch)


def test_runs_of_other_branch_settings_in_the_results_dir_are_neither_read_nor_paid_for(
    tmp_path: Path, clean
) -> None:
    """A results_dir reused with another trunk length and seeds keeps the first probe's runs (the
    manifest allows it: branch settings and seeds do not change what a run is). The second probe
    reads and counts only its own: the same answer and cost as in a fresh directory, and a note."""
    other = ["branch.trunk_samples=768", "branch.checkpoints=[1.0]", "budget.seeds=[5]"]

    def load(d: Path, more: list[str]):
        return load_recipe("recipes/nqm.toml", [*SETS, *more, f"run.results_dir={d}"])

    run_branched_probe(load(tmp_path / "shared", other))
    reused = run_branched_probe(load(tmp_path / "shared", []))
    fresh = clean[1]  # the same recipe in a fresh directory
    assert _answer(reused) == _answer(fresh)
    assert reused.summary.probe_samples == fresh.summary.probe_samples
    assert [c.samples_consumed for c in reused.efficiency.candidates] == [
        c.samples_consumed for c in fresh.efficiency.candidates
    ]
    assert reused.runs.other_runs > 0 and fresh.runs.other_runs == 0
    assert any("other branch settings" in n for n in reused.efficiency.notes)


def test_confirmed_rejections_branch_a_batch_just_past_tolerance_at_more_seeds(tmp_path: Path) -> None:
    """branch.confirm_rejections: no batch is rejected on one seed whose ratio is only just past
    1+tol. Without it, on this seed 512 is rejected after one branch at ~1.13 (benchmarks'
    one-checkpoint sweep, trunk 1536, seed 3)."""
    sets = [
        "probe.mode=branched",
        "branch.trunk_samples=1536",
        "branch.window_samples=1024",
        "branch.checkpoints=[1.0]",
        "branch.max_window_factor=1.5",
        "budget.seeds=[3]",
    ]

    def thin(extra: list[str], d: Path) -> list[float]:
        """Batches left on fewer than confirm_seeds seeds, none censored, mean ratio in (1.1, 1.21]."""
        res = run_branched_probe(load_recipe("recipes/nqm.toml", [*sets, *extra, f"run.results_dir={d}"]))
        (lc,) = res.summary.locals
        out = []
        for b in lc.ratios:
            seen = lc.observed(b)
            rs = [r for r, cens in seen.values() if not cens and math.isfinite(r)]
            if b == 8.0 or not seen or len(rs) < len(seen):
                continue
            mean = math.exp(float(np.mean(np.log(rs))))
            if len(rs) < 3 and 1.1 < mean <= 1.1**2:
                out.append(b)
        return out

    assert thin([], tmp_path / "default") == [512.0]
    assert thin(["branch.confirm_rejections=true"], tmp_path / "confirmed") == []


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_kill_9_during_branches_resumes_to_the_same_answer(tmp_path: Path, workers: int, clean) -> None:
    """kill -9 of the driver mid-probe; with a pool (workers 2) its workers die with it
    (PR_SET_PDEATHSIG) and leave the runs they held unsealed, to be redone."""
    killed = tmp_path / "killed"
    sets = [*SETS, f"run.results_dir={killed}", f"run.workers={workers}"]
    code = (
        "import sys; from batchtune.recipe.load import load_recipe; "
        "from batchtune.measure.branched import run_branched_probe; "
        f"run_branched_probe(load_recipe('recipes/nqm.toml', {sets!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[2])
    runs = branched_store(killed).runs_dir
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(runs.glob("c*/run.json"))) < 3:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    sealed_before = {p: p.read_text() for p in runs.glob("*/run.json")}
    assert any(p.parent.name.startswith("c") for p in sealed_before), "killed before any branch sealed"
    resumed = run_branched_probe(_recipe(killed))
    assert resumed.runs_skipped >= len(sealed_before)
    assert {p: p.read_text() for p in sealed_before} == sealed_before  # sealed runs untouched
    assert _answer(resumed) == _answer(clean[1])
    assert json.loads(next(iter(sealed_before.values())))["status"]


def test_a_run_another_process_holds_is_waited_for_then_run_here(tmp_path: Path, clean) -> None:
    """A second `probe` of the same branched results_dir (or a resume while a killed probe's workers
    still die) waits for the runs the other holds, as a grid probe does, and runs one itself once
    its holder lets go unfinished; it used to stop at once ("the trunk ... did not reach its last
    checkpoint")."""
    shared = tmp_path / "shared"
    store = branched_store(shared)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # another holder of the trunk's lock (flock: per open file, so per thread here)
        with store.claim("trunk-P1xG8-s0") as writer:
            assert writer is not None
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    timer = threading.Timer(1.0, release.set)
    timer.start()
    events: list[str] = []
    try:
        result = run_branched_probe(_recipe(shared), lambda kind, info: events.append(kind))
    finally:
        release.set()
        holder.join()
        timer.cancel()
    assert "wait" in events and _answer(result) == _answer(clean[1])


def test_branched_mode_refuses_a_backend_without_checkpoints(tmp_path: Path) -> None:
    from batchtune.errors import InputError

    argv = 'backend.command=["python", "-c", "pass"]'
    cfg = load_recipe(
        "recipes/nqm.toml", [*SETS, f"run.results_dir={tmp_path}", "backend.training=command", argv]
    )
    with pytest.raises(InputError, match="checkpoint"):
        run_branched_probe(cfg)


def test_with_one_seed_a_batch_is_adopted_only_once_more_seeds_confirm_it(tmp_path: Path) -> None:
    """budget.seeds = [0] and branch.confirm_seeds = 3: every batch the search climbs past was
    branched at seeds 1 and 2 as well (and at seed 3 while its seeds disagree, branch.max_seeds),
    paired with each seed's own control, and a batch that fell behind at seed 0 was not."""
    cfg = load_recipe(
        "recipes/nqm.toml",
        [*SETS, "branch.checkpoints=[1.0]", "budget.seeds=[0]", f"run.results_dir={tmp_path}"],
    )
    res = run_branched_probe(cfg)
    (lc,) = res.summary.locals
    ids = {r.run_id for r in branched_store(tmp_path).runs()}
    branched = {b: rs for b, rs in lc.ratios.items() if b != 8}
    assert any(rs[0] <= 1.1 for rs in branched.values())
    kw = {"tol": 0.1, "confidence": 0.9, "min_seeds": 3, "max_seeds": 4}
    for rs in branched.values():
        if rs[0] > 1.1:
            assert set(rs) == {0}
        else:  # more seeds until the sequential test decided, each paired with its own control
            assert set(rs) == set(range(len(rs))) and 2 <= len(rs) <= 4
            assert adoption(list(rs.values()), **kw) != MORE
            assert adoption(list(rs.values())[:-1], **kw) == MORE
            assert set(rs) <= set(lc.ratios[8.0])
    assert "c1024-P1xG8-s1" in ids
    again = run_branched_probe(cfg)  # the rerun replays the same decisions from the stored runs
    assert again.runs_done == 0 and _answer(again) == _answer(res)
    s0 = load_recipe("recipes/nqm.toml", [*SETS, "branch.checkpoints=[1.0]", "budget.seeds=[0]"])
    assert s0.branch.confirm_seeds == 3 and s0.branch.max_seeds == 4


def test_a_checkpoint_at_zero_branches_from_initialisation(tmp_path: Path) -> None:
    """branch.checkpoints = [0, 1.0]: the first checkpoint's branches are fresh runs (nothing to
    resume), so the trunk's seed's control there is the trunk itself, step for step."""
    sets = [*SETS, "branch.checkpoints=[0, 1.0]", f"run.results_dir={tmp_path}"]
    cfg = load_recipe("recipes/nqm.toml", sets)
    res = run_branched_probe(cfg)
    assert [lc.checkpoint_samples for lc in res.summary.locals] == [0.0, 1024.0]
    store = branched_store(tmp_path)
    c0 = store.run("c0-P1xG8-s0")
    assert c0 is not None and c0.samples > 0
    control = [(r.samples, r.metrics["loss"]) for r in store.steps("c0-P1xG8-s0")]
    trunk = [(r.samples, r.metrics["loss"]) for r in store.steps("trunk-P1xG8-s0")]
    n = min(len(control), len(trunk))
    assert n > 10 and control[:n] == trunk[:n]
    assert not (tmp_path / "branched" / "checkpoints" / "ckpt-0.npz").exists()


def test_a_checkpoint_whose_controls_make_no_progress_is_noted_and_the_others_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a noisy reward the controls can show no progress in the window after one checkpoint
    (tiny-grpo at probe seeds 6-8: 0.828 at the checkpoint, 0.826 fitted a window later). That
    checkpoint cannot be read, but the probe must not throw away the others: it notes it, counts
    its controls' samples, and fails only when no checkpoint can be read."""
    from batchtune.errors import NoProgress
    from batchtune.measure import branch_checkpoint

    real = branch_checkpoint.control_level

    def plateau_at(stuck: set[int]):
        def level(checkpoint_samples, *args, **kwargs):
            if int(checkpoint_samples) in stuck:
                raise NoProgress(f"the control branches made no progress at {checkpoint_samples:g}")
            return real(checkpoint_samples, *args, **kwargs)

        return level

    monkeypatch.setattr(branch_checkpoint, "control_level", plateau_at({512}))
    res = run_branched_probe(_recipe(tmp_path))
    sm = res.summary
    assert [lc.checkpoint_samples for lc in sm.locals] == [1024.0]
    assert any("checkpoint at 512 samples not read" in n for n in res.efficiency.notes)
    store = branched_store(tmp_path)
    stuck = [r for r in store.runs("c512-")]
    assert stuck and all(r.candidate == "P1xG8" for r in stuck)  # only its controls ran
    assert res.efficiency.total_samples == sm.probe_samples  # and they are paid for
    assert sm.probe_samples > sm.trunk_samples + sum(lc.branch_samples for lc in sm.locals)

    monkeypatch.setattr(branch_checkpoint, "control_level", plateau_at({512, 1024}))
    with pytest.raises(NoProgress):
        run_branched_probe(_recipe(tmp_path / "all"))


def test_the_progress_bar_of_a_branched_probe_has_no_made_up_total(tmp_path: Path) -> None:
    """The search decides how many runs it makes: the bar counts them against '?', not against 0."""
    import io

    from rich.console import Console

    from batchtune.report.progress import probe_progress

    out = io.StringIO()
    with probe_progress(Console(file=out, width=120, force_terminal=False), enabled=True) as progress:
        result = run_branched_probe(_recipe(tmp_path), progress)
    text = out.getvalue()
    assert "runs (as many as the branched search needs)" in text
    assert f"{result.runs_done}/?" in text and f"{result.runs_done}/0" not in text


def test_checkpoints_past_where_the_reference_reaches_the_target_weigh_nothing(tmp_path: Path):
    """A trunk longer than R(B0) (an easy target, or a trunk set near the end of the run): the
    checkpoints at or past R(B0) kept whole segments, and the last one a zero share with which the
    batch schedule raised, so `recommend` lost its whole answer ("a schedule needs segments with a
    finite, positive share of R(B0)", exit 3)."""
    from typer.testing import CliRunner

    from batchtune.analysis.branched.summary import segment_weights
    from batchtune.cli import app

    assert segment_weights([1024, 2048, 4096], 1450).tolist() == [426, 0, 0]
    assert segment_weights([1024, 2048, 4096], 12000).tolist() == [1024, 2048, 7904]  # as before
    assert segment_weights([1024, 2048], 500).tolist() == [1, 1]  # every one past: equal weights
    sets = ["probe.mode=branched", "target.value=2.0", "branch.trunk_samples=4096"]
    sets += ["branch.checkpoints=[0.25, 0.5, 1.0]"]  # R(B0) ~1,450 samples: two checkpoints past it
    args = ["nqm", "-r", str(tmp_path / "r"), *[a for s in sets for a in ("--set", s)], "--json"]
    assert CliRunner().invoke(app, ["probe", *args]).exit_code == 0
    out = CliRunner().invoke(app, ["recommend", *args])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["recommended"]["name"] and any(n.startswith("no batch schedule") for n in data["notes"])
    # every checkpoint past R(B0): no schedule from segments that all lie after the target
    args = [a.replace("[0.25, 0.5, 1.0]", "[0.5, 1.0]") for a in args]
    args[args.index(str(tmp_path / "r"))] = str(tmp_path / "r2")
    assert CliRunner().invoke(app, ["probe", *args]).exit_code == 0
    data = json.loads(CliRunner().invoke(app, ["recommend", *args]).stdout)
    assert "batch_schedule" not in data and any(n.startswith("no batch schedule") for n in data["notes"])


def test_a_branched_probe_resumed_without_some_batches_is_recommended_without_them(tmp_path: Path) -> None:
    """A branched probe rerun with candidates.prompts narrowed kept the manifest's first recipe (only
    the grid probe stored a resume's candidates), so `recommend --results DIR` still ranked P64xG8
    from its runs where the probe no longer did. Now both rank the same batches; `recommend` of a
    recipe named (read-only) stores nothing."""
    from typer.testing import CliRunner

    from batchtune.cli import app

    recipe = "recipes/nqm-long.toml"  # probe.mode = "auto": branched

    def names(*argv: str) -> set[str]:
        out = CliRunner().invoke(app, [*argv, "-r", str(tmp_path), "--json"])
        assert out.exit_code == 0, out.output
        return {c["name"] for c in json.loads(out.stdout)["candidates"]}

    assert "P64xG8" in names("probe", recipe) & names("recommend")
    probed = names("probe", recipe, "--set", "candidates.prompts=[1, 2, 4, 8, 16, 32]")
    assert "P64xG8" not in probed and names("recommend") == probed
    manifest = (tmp_path / "manifest.json").read_text()
    assert "P64xG8" in names("recommend", recipe)  # the whole grid, named: read, not stored
    assert (tmp_path / "manifest.json").read_text() == manifest
