"""probe.async_sweep = "auto": the plan's default grid, the stored decision a probe runs by, and the
recipe check (measure/async_sweep.py); no training here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from batchtune.errors import RecipeError
from batchtune.measure.async_sweep import _load, _save, decide, pruned_plan
from batchtune.measure.plan import plan_candidates
from batchtune.recipe.load import load_recipe
from batchtune.records.store import ResultsStore

ASYNC = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny-grpo-async.toml")
AUTO = ["probe.async_sweep=auto", "probe.staleness=[0]", "probe.updates_per_batch=[]"]


def _recipe(tmp_path: Path, extra: list[str] = ()):  # type: ignore[assignment]
    return load_recipe(ASYNC, [*AUTO, f"run.results_dir={tmp_path / 'r'}", *extra])


def test_auto_plans_the_default_grid(tmp_path: Path) -> None:
    plan = plan_candidates(_recipe(tmp_path))
    assert len(plan.offpolicy) == 2 * 11  # P2, P4 x (4 k x 3 u, bar the on-policy k0u1)
    assert "P2xG8-k4u4" in plan.offpolicy and "P2xG8-k0u1" not in plan.offpolicy


def test_decision_is_stored_and_the_probe_runs_the_kept_ones(tmp_path: Path) -> None:
    cfg = _recipe(tmp_path)
    plan = plan_candidates(cfg)
    times = {"P2xG8": (1.0, 0.5), "P4xG8": (math.nan, math.nan)}  # P4 untimed: all of it kept
    d = decide(cfg, plan, times, "by hand")
    kept2 = {lab for lab in plan.offpolicy if lab.startswith("P2xG8-") and d.cells[lab].kept}
    assert kept2 == {"P2xG8-k0u2", "P2xG8-k0u4", "P2xG8-k1u1", "P2xG8-k1u2"}
    assert all(d.cells[lab].kept for lab in plan.offpolicy if lab.startswith("P4xG8-"))
    store = ResultsStore.of(cfg)
    _save(store, d)
    back = _load(store)
    assert back is not None and {k: (c.kept, c.reason) for k, c in back.cells.items()} == {
        k: (c.kept, c.reason) for k, c in d.cells.items()
    }
    # the timed steps' own times travel with the decision, and a long-tail trace keeps k = 2
    tail = {"P2xG8": ((0.5, 0.5, 0.5, 2.5), (0.9,) * 4)}
    dt = decide(cfg, plan, {"P2xG8": (1.0, 0.9), "P4xG8": (math.nan, math.nan)}, "by hand", tail)
    assert dt.cells["P2xG8-k2u1"].kept and not d.cells["P2xG8-k2u1"].kept
    _save(store, dt)
    back_t = _load(store)
    assert back_t is not None and back_t.traces == tail
    _save(store, d)
    run = pruned_plan(cfg, plan)  # reads the stored decision: times nothing
    assert set(run.offpolicy) == set(plan.offpolicy) - set(d.pruned)
    assert {c.label for c in run.candidates} == set(run.main) | set(run.offpolicy)
    assert any(line.startswith("pruned P2xG8-k2u1: ") for line in d.lines())


def test_an_untimed_candidate_keeps_only_the_k_the_trainer_can_run(tmp_path: Path) -> None:
    """Not timed, every cell was kept, so with sync_every 3 its k = 1 runs failed at their start;
    they are pruned with the reason the timed path gives."""
    cfg = _recipe(tmp_path, ["algorithm.sync_every=3"])
    plan = plan_candidates(cfg)
    d = decide(cfg, plan, {"P2xG8": (math.nan, math.nan), "P4xG8": (math.nan, math.nan)}, "by hand")
    off = [lab for lab in plan.offpolicy if "-k1u" in lab]
    assert off and not any(d.cells[lab].kept for lab in off)
    assert all("cannot keep a weight sync every 3" in d.cells[lab].reason for lab in off)
    assert all(d.cells[lab].kept for lab in plan.offpolicy if "-k1u" not in lab)


def test_auto_and_explicit_lists_refused(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="async_sweep"):
        _recipe(tmp_path, ["probe.staleness=[0,1]"])


def test_plan_says_what_the_offpolicy_runs_cost(tmp_path: Path) -> None:
    from batchtune.measure.preview import plan_preview

    pv = plan_preview(load_recipe(ASYNC, [f"run.results_dir={tmp_path / 'r'}"]), time_steps=0)
    note = next(n for n in pv.notes if n.startswith("off-policy / async candidates: 10, "))
    assert f"{10 * 2 * 4096:,} of the {12 * 2 * 4096:,} samples" in note
    auto = plan_preview(_recipe(tmp_path), time_steps=0)  # not timed: nothing pruned, and it says so
    assert any("22 of 22 off-policy candidates kept" in n and "not timed" in n for n in auto.notes)


def test_the_offpolicy_share_of_a_sub_second_plan_is_not_0_s_of_0_s() -> None:
    """An NQM plan said "0 s of the 0 s of run time predicted (70%)": its runs take a fraction of a
    second of the simulation's own compute, and its simulated step times are no trainer's time."""
    from batchtune.measure.preview import CandidateCost, _offpolicy_cost

    def cost(label: str, run_s: float) -> CandidateCost:
        return CandidateCost(label, 4, 8, 32, 0.1, 3, 4096, 128, 9, 1e-3, 0.0, 0.0, run_s)

    costs = [cost("P4xG8", 0.04), cost("P4xG8-k1u1", 0.07), cost("P4xG8-k1u2", 0.09)]
    total = sum(c.run_s_max * c.seeds for c in costs)  # 0.6 s
    nqm = _offpolicy_cost(costs, {"P4xG8-k1u1", "P4xG8-k1u2"}, 3 * 3 * 4096, total, "nqm")
    assert "0.48 s of the 0.6 s the simulation computes here (80%; no trainer's time)" in nqm, nqm
    assert "0 s of the 0 s" not in nqm and "run time predicted" not in nqm
    real = _offpolicy_cost(costs, {"P4xG8-k1u1"}, 3 * 3 * 4096, 100 * total, "torch_rl")
    assert ", 0.21 s of the 60 s of run time predicted (0%)" in real, real


def test_a_second_probe_waits_for_the_sweep_decision_and_reads_it(tmp_path: Path, monkeypatch) -> None:
    """Two probes on one directory: the one that finds the sweep being timed (SWEEP_LOCK held) waits
    and runs by the decision stored meanwhile, timing nothing. Both used to time, in one scratch
    folder the first to end deleted, and plan by their own decisions (the last to save won)."""
    import fcntl
    import os
    import threading
    import time

    import batchtune.measure.async_sweep as sweep

    cfg = _recipe(tmp_path)
    plan = plan_candidates(cfg)
    d = decide(cfg, plan, {"P2xG8": (1.0, 0.5), "P4xG8": (math.nan, math.nan)}, "by hand")
    store = ResultsStore.of(cfg)
    lock = store.root / sweep.SWEEP_LOCK
    held = threading.Event()

    def other_probe() -> None:  # holds the lock as another process timing the sweep would
        store.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.set()
        time.sleep(0.5)
        _save(store, d)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    timed: list[str] = []
    waits: list[str] = []
    monkeypatch.setattr(sweep, "_time_stages", lambda recipe, c, *a: timed.append(c.label) or ((), ()))
    other = threading.Thread(target=other_probe)
    other.start()
    assert held.wait(timeout=30)
    try:
        run = pruned_plan(cfg, plan, lambda: waits.append(sweep.SWEEP_HELD.format(store.root)))
    finally:
        other.join()
    assert waits == [
        f"another batchtune process is timing the off-policy sweep in {store.root}; "
        "waiting for its decision (then read here)"
    ], "waited without a word (or said it twice)"
    assert timed == [], "timed the sweep while another process was deciding it"
    assert set(run.offpolicy) == set(plan.offpolicy) - set(d.pruned)
