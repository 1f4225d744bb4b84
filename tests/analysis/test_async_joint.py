"""The joint sync/async decision from a probe's estimates and step times (analysis/decide/async_joint.py):
hand-computed stage times, the verdict, the throughput the main ranking gets, the pick."""

from __future__ import annotations

import math

import pytest

from batchtune.analysis.decide.async_joint import Knobs, joint_decision, joint_throughput, pick_for
from batchtune.analysis.decide.recommend import recommend, throughput_from_probe
from batchtune.analysis.sample.assess import analyse_runs
from batchtune.analysis.sample.efficiency import RunData, SampleEfficiency
from batchtune.analysis.system.pipeline import simulate_pipeline
from batchtune.records.types import RunRecord, StepRecord

# label -> (P, k, u, samples at which eval_reward crosses 0.9 for seeds 0 and 1, gen_s, train_s per step)
CASES = {
    "P2xG8": (2, 0, 1, (160, 192), 1.0, 0.5),
    "P2xG8-k1u1": (2, 1, 1, (176, 208), 1.5, 0.6),  # overlapped: gen x1.5, train x1.2 of k = 0
    "P2xG8-k0u2": (2, 0, 2, (96, 128), 1.0, 1.0),
}


def _run(label: str, seed: int, cross: int, p: int, k: int, u: int, gen: float, train: float) -> RunData:
    b = p * 8
    rid = f"{label}-s{seed}"
    steps = []
    for i in range(0, 33):
        s = i * b
        reward = 0.5 + 0.4 * min(1.0, s / cross) + (0.05 if s > cross else 0.0)
        m = {"eval_reward": reward, **({"sync_s": 0.1} if i else {})}
        g, t = (gen, train) if i else (0.0, 0.0)
        steps.append(StepRecord(rid, i, s, 0, 1e-3, p, 8, seed, m, gen_s=g, train_s=t))
    rec = RunRecord(
        rid, label, p, 8, seed, 1e-3, "sqrt", 1e-3, 16, "completed", steps=32, samples=32 * b,
        staleness=k, updates_per_batch=u,
    )  # fmt: skip
    return RunData(rec, tuple(steps))


def _efficiency(cases: dict = CASES) -> SampleEfficiency:
    runs = [_run(lab, sd, c[3][sd], *c[:3], *c[4:]) for lab, c in cases.items() for sd in (0, 1)]
    fam = {lab: "offpolicy" if "-k" in lab else "main" for lab in cases}
    return analyse_runs(runs, metric="eval_reward", target=0.9, ema_alpha=1.0, families=fam)


def _knobs(cases: dict = CASES, sync_s: float = 0.1) -> dict[str, Knobs]:
    return {lab: Knobs(c[1], c[2], sync_s) for lab, c in cases.items()}


def test_stage_times_and_rows_by_hand() -> None:
    eff = _efficiency()
    thr = throughput_from_probe(eff.candidates, 0.0)
    d = joint_decision(eff, thr, _knobs(), mini_batches=1, two_process=True)
    rows = {(r.label, r.choice.in_flight_cap): r.choice for r in d.rows}
    # sync, B = 16: 1.0 gen + 0.5 train + 0.1 sync = 1.6 s per batch
    assert rows[("P2xG8", None)].responses_per_s == pytest.approx(16 / 1.6)
    # u = 2 at k = 0: gen 1.0 + 2 x 0.5 per update (k = 0 runs' median per update) + 0.1
    assert rows[("P2xG8-k0u2", None)].responses_per_s == pytest.approx(16 / 2.1)
    # async k = 1 on the one device: gen 1.0 x 1.5 (measured overlap), train 0.5 x 1.2, one sync per
    # batch pausing both sides: max(1.5, 0.6) + 0.1 = 1.6 s; a cap of k + 1 = 2 is the bound: left out
    a = rows[("P2xG8-k1u1", None)]
    assert a.responses_per_s == pytest.approx(16 / 1.6, rel=1e-6) and a.lag_reached == pytest.approx(1.0)
    assert ("P2xG8-k1u1", 2) not in rows
    assert all(math.isfinite(r.choice.t_lo) and r.choice.t_lo <= r.choice.t <= r.choice.t_hi for r in d.rows)
    assert any("gen x1.50 and train x1.20" in n for n in d.notes)
    # same throughput as sync, more samples: async cannot pay
    assert d.status == "does not pay"
    assert d.verdict[-1] == "async does not pay: R grows faster than throughput"


def test_one_process_runs_assume_free_overlap_and_can_pay() -> None:
    eff = _efficiency()
    thr = throughput_from_probe(eff.candidates, 0.0)
    d = joint_decision(eff, thr, _knobs(sync_s=0.0), mini_batches=1, two_process=False)
    a = next(r.choice for r in d.rows if r.label == "P2xG8-k1u1")
    # no overlap measured: the sync row's times, max(1.0, 0.5) per batch
    assert a.responses_per_s == pytest.approx(16 / 1.0, rel=1e-6)
    assert any("best case" in n for n in d.notes)
    assert d.status in ("pays", "not decided")  # x1.5 throughput for x1.08 samples


def test_main_ranking_gets_the_best_row_and_the_pick_follows_the_winner() -> None:
    eff = _efficiency()
    thr = throughput_from_probe(eff.candidates, 0.0)
    d = joint_decision(eff, thr, _knobs(sync_s=0.0), mini_batches=1, two_process=False)
    thr2 = joint_throughput(thr, d)
    assert thr2.per_candidate["P2xG8-k1u1"].responses_per_s == pytest.approx(16.0, rel=1e-6)
    assert thr2.per_candidate["P2xG8"] == thr.per_candidate["P2xG8"]  # one process, no sync: unchanged
    rec = recommend(eff, thr2)
    pick = pick_for(d, rec.winner.label, mini_batches=1, sync_every=1)
    assert pick is not None and pick.label == rec.winner.label
    row = next(r for r in d.rows if r.label == rec.winner.label)
    assert pick.mode == row.choice.mode and pick.staleness == row.choice.staleness
    if pick.mode == "sync":
        assert pick.rollout_gpus is None and pick.in_flight_cap == 0
    assert pick_for(d, "nobody", mini_batches=1, sync_every=1) is None


def test_a_bound_the_sync_interval_breaks_is_not_ranked() -> None:
    eff = _efficiency()
    thr = throughput_from_probe(eff.candidates, 0.0)
    d = joint_decision(eff, thr, _knobs(), mini_batches=1, two_process=True, sync_every=3)
    assert "P2xG8-k1u1" not in {r.label for r in d.rows}  # k = 1 needs sync_every <= 2
    assert d.status == "one mode"


def test_the_sweeps_timed_steps_reach_the_async_rows() -> None:
    # the auto sweep's timed steps of P2xG8 (gen 1, 1, 1, 5 s, train 0.5 s per update), scaled to the
    # rows' means (gen 1.0 s: 0.5, 0.5, 0.5, 2.5 s), are played through the simulation
    eff = _efficiency()
    thr = throughput_from_probe(eff.candidates, 0.0)
    traces = {"P2xG8": ((1.0, 1.0, 1.0, 5.0), (0.5,) * 4)}
    d = joint_decision(eff, thr, _knobs(sync_s=0.0), mini_batches=1, two_process=False, traces=traces)
    plain = joint_decision(eff, thr, _knobs(sync_s=0.0), mini_batches=1, two_process=False)
    a = next(r.choice for r in d.rows if r.label == "P2xG8-k1u1" and r.choice.in_flight_cap is None)
    a0 = next(r.choice for r in plain.rows if r.label == "P2xG8-k1u1" and r.choice.in_flight_cap is None)
    sim = simulate_pipeline(
        batch_responses=16, gen_time_s=1.0, train_time_s=0.5, sync_time_s=0.0, staleness_bound=1,
        gen_trace=(0.5, 0.5, 0.5, 2.5), train_trace=(0.5,) * 4,
    )  # fmt: skip
    assert a.step_times == "trace" and a0.step_times == "mean"
    assert a.responses_per_s == pytest.approx(sim.responses_per_s) and a.responses_per_s < a0.responses_per_s
    sync = {r.label: r.choice for r in d.rows if r.choice.mode == "sync"}
    assert sync["P2xG8"] == next(r.choice for r in plain.rows if r.label == "P2xG8")  # means: unchanged
    assert any("4 timed steps' own times" in n for n in d.notes)


def test_the_candidates_the_sync_interval_rules_out_are_named_with_the_reason(tmp_path) -> None:
    """`recommend --set algorithm.sync_every=3` left the k = 1 candidates out of the ranking, runs
    and all, and nothing in its output said so or why."""
    import json

    from typer.testing import CliRunner

    from batchtune.cli import app
    from tests.test_async_recommend import ASYNC_RUNS, _store

    eff, thr = _efficiency(), throughput_from_probe(_efficiency().candidates, 0.0)
    for every in (1, 2):
        d = joint_decision(eff, thr, _knobs(), mini_batches=1, two_process=True, sync_every=every)
        assert not [n for n in d.notes if n.startswith("not ranked")], d.notes
    d = joint_decision(eff, thr, _knobs(), mini_batches=1, two_process=True, sync_every=3)
    [note] = [n for n in d.notes if n.startswith("not ranked")]
    assert "P2xG8-k1u1 (k = 1)" in note and "sync_every - 1 = 2" in note and "every 3 steps" in note
    root = _store(tmp_path / "r", [], dict(ASYNC_RUNS))
    argv = ["recommend", "-r", str(root), "--throughput", "probe", "--json"]
    argv += ["--set", "algorithm.sync_every=3"]
    out = CliRunner().invoke(app, argv)
    assert out.exit_code == 0, out.output
    notes = json.loads(out.stdout)["async_decision"]["notes"]
    assert [n for n in notes if n.startswith("not ranked: ") and "P2xG8-k1u1 (k = 1)" in n], notes
