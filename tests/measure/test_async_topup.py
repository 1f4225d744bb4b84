"""The async probe's seed top-up (issue 30): the rule (analysis/decide/async_topup.py), and the probe's
rounds for real on a results directory whose runs a stand-in trainer writes (a curve per seed), so
the real analysis, joint ranking, stores and record are exercised; `recommend` says who was topped up."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.analysis.decide.async_topup import (
    OpenLeader,
    SeqRule,
    TopUpEnd,
    contenders,
    family_z,
    ratio_interval,
    top_up,
)
from batchtune.backends.spec import Candidate
from batchtune.cli import app
from batchtune.measure.async_topup import add_async_seeds, seeds_by_label
from batchtune.measure.plan import plan_candidates, run_id
from batchtune.measure.probe import analyse_store
from batchtune.measure.stop_rule import NO_BAND, stop_policy
from batchtune.measure.topup_record import TOP_UP_FILE, load_top_up
from batchtune.recipe.load import load_recipe
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import RunRecord, StepRecord

ROOT = Path(__file__).resolve().parents[2]
ASYNC = ROOT / "recipes" / "tiny-grpo-async.toml"
# label -> crossing samples at seed 0 (each seed a little off it), gen_s, train_s per step
RUNS = {
    "P2xG8": (200, 0.10, 0.05),
    "P4xG8": (400, 0.18, 0.08),
    "P2xG8-k0u2": (150, 0.10, 0.10),
    "P2xG8-k1u1": (190, 0.10, 0.05),
    "P4xG8-k1u1": (200, 0.18, 0.08),
}


def test_contenders_are_within_the_margin_and_lack_seeds() -> None:
    t = {"a": 1.0, "b": 1.08, "c": 1.2, "d": 1.05, "e": math.inf}
    seeds = {"a": 2, "b": 2, "c": 2, "d": 8, "e": 2}
    assert contenders(t, seeds, margin=0.1, top=8) == ["a", "b"]
    assert contenders(t, seeds, margin=0.1, top=8, done=["a"]) == ["b"]
    assert contenders({"x": math.inf}, {"x": 2}) == []  # nothing reached the target: no contender


def test_rounds_go_on_until_no_contender_lacks_seeds() -> None:
    # more seeds show "a" is slow: then "c", unseen before, is a contender of round 2
    seeds = {"a": 3, "b": 3, "c": 3}
    runs: list[list[str]] = []

    def estimate() -> tuple[dict[str, float], dict[str, int]]:
        t = {"a": 1.0 if seeds["a"] < 8 else 2.0, "b": 1.05, "c": 1.12}
        return t, dict(seeds)

    def run(labels: list[str], n: int) -> None:
        runs.append(labels)
        seeds.update(dict.fromkeys(labels, n))

    rounds = top_up(estimate, run, margin=0.1, top=8)
    assert runs == [["a", "b"], ["c"]]
    assert [r.best for r in rounds] == ["a", "b"]
    assert [t.seeds_before for t in rounds[0].topped] == [3, 3]


def _seq_loop(
    t: dict[str, float],
    spread: dict[str, float],
    seeds: dict[str, int],
    cap: int = 32,
    ends: list[TopUpEnd] | None = None,
) -> tuple[list[tuple[list[str], int]], list[str]]:
    """The loop on hand-made estimates: T per candidate and, per candidate, the spread of its group
    estimates (seed noise shrinking as 1/sqrt(seeds), a and b's in opposite directions: not
    paired away): (runs asked, round kinds); ``ends`` gets where the rounds stopped."""
    runs: list[tuple[list[str], int]] = []

    def estimate() -> tuple[dict[str, float], dict[str, int]]:
        return dict(t), dict(seeds)

    def evidence(labels: list[str]) -> dict[str, list[float]]:
        sd = {lab: spread[lab] * (8 / seeds[lab]) ** 0.5 for lab in labels}
        return {
            lab: [t[lab] * (1 + sd[lab] * (1 if (j + ord(lab)) % 2 else -1)) for j in range(8)]
            for lab in labels
        }

    def run(labels: list[str], n: int) -> None:
        runs.append((labels, n))
        seeds.update(dict.fromkeys(labels, n))

    rounds = top_up(
        estimate, run, margin=0.3, top=8, seq=SeqRule(cap=cap, z=1.5, tol=0.05), evidence=evidence,
        on_end=None if ends is None else ends.append,
    )  # fmt: skip
    return runs, [r.kind for r in rounds]


def test_ratio_interval_is_the_jackknife_lower_end() -> None:
    r, low = ratio_interval(1.1, 1.0, [1.1] * 8, [1.0] * 8, z=2.0)
    assert r == 1.1 and math.isclose(low, 1.1)  # the groups agree: no spread
    r, low = ratio_interval(1.1, 1.0, [1.0, 1.2] * 4, [1.0] * 8, z=1.0)
    assert math.isclose(low, 1.1 - math.sqrt(7 / 8 * 8 * 0.1**2))
    assert math.isnan(ratio_interval(1.1, 1.0, [math.inf] * 8, [1.0] * 8, z=1.0)[1])  # not finite


def test_sequential_rounds_stop_when_separated() -> None:
    # b is 20% slower and its groups agree: separated at 8 seeds, no sequential round
    runs, kinds = _seq_loop(
        {"a": 1.0, "b": 1.2, "c": 2.0}, {"a": 0.01, "b": 0.01, "c": 0.01}, dict.fromkeys("abc", 3)
    )
    assert runs == [(["a", "b"], 8)] and kinds == ["contenders"]


def test_sequential_rounds_double_until_separated_and_respect_the_cap() -> None:
    # a near tie with noisy groups: the best and b double 8 -> 16 -> 32 and stop at the cap
    seeds = dict.fromkeys("abc", 3)
    runs, kinds = _seq_loop({"a": 1.0, "b": 1.02, "c": 2.0}, {"a": 0.1, "b": 0.1, "c": 0.1}, seeds)
    assert runs == [(["a", "b"], 8), (["a", "b"], 16), (["a", "b"], 32)]
    assert kinds == ["contenders", "sequential", "sequential"] and seeds == {"a": 32, "b": 32, "c": 3}
    # noise that 16 seeds shrink enough: one doubling, then separated
    seeds = dict.fromkeys("abc", 3)
    runs, _ = _seq_loop({"a": 1.0, "b": 1.1, "c": 2.0}, {"a": 0.022, "b": 0.022, "c": 0.1}, seeds)
    assert runs == [(["a", "b"], 8), (["a", "b"], 16)]
    # a contender behind the best catches up to its seeds first
    seeds = {"a": 16, "b": 8, "c": 3}
    runs, _ = _seq_loop({"a": 1.0, "b": 1.02, "c": 2.0}, {"a": 0.1, "b": 0.1, "c": 0.1}, seeds, cap=16)
    assert runs == [(["b"], 16)]


def test_the_end_names_the_leaders_not_separated_at_the_cap_and_bounds_the_picks_cost() -> None:
    ends: list[TopUpEnd] = []
    _seq_loop({"a": 1.0, "b": 1.02, "c": 2.0}, dict.fromkeys("abc", 0.1), dict.fromkeys("abc", 3), ends=ends)
    (end,) = ends  # a near tie at the cap of 32: b is open, with its interval
    assert end.best == "a" and end.seeds == 32 and [o.label for o in end.open] == ["b"]
    (b,) = end.open
    assert b.seeds == 32 and math.isclose(b.ratio, 1.02) and b.low < 0.95
    assert math.isclose(end.bound(), 1.0 / b.low) and end.bound() > 1.0 / 0.95
    assert end.words().startswith("NOT RESOLVED") and "b (T 1.020x" in end.words()
    # separated at 8 seeds: nothing open, and the pick costs at most the tolerance against b
    ends.clear()
    _seq_loop({"a": 1.0, "b": 1.2, "c": 2.0}, dict.fromkeys("abc", 0.01), dict.fromkeys("abc", 3), ends=ends)
    (end,) = ends
    assert end.open == () and math.isclose(end.bound(), 1.0 / 0.95) and "separated" in end.words()
    # an interval reaching 0 or a ratio not finite bounds nothing
    assert TopUpEnd("a", 8, (OpenLeader("b", 1.1, -0.2, 8),)).bound() == math.inf
    no_t = TopUpEnd("a", 8, (OpenLeader("b", math.nan, math.nan, 8),), cap=8).words()
    assert "b (no interval: a group of its seeds has no T; 8 seeds)" in no_t and "nan" not in no_t
    assert "a cost these seeds do not bound" in no_t
    # one leader within the margin: nothing compared, and the end says so (not "separated")
    ends.clear()
    _seq_loop({"a": 1.0, "b": 1.5, "c": 2.0}, dict.fromkeys("abc", 0.01), dict.fromkeys("abc", 3), ends=ends)
    (alone,) = ends
    assert alone.compared == 0 and alone.open == ()
    assert "no other candidate within its margin" in alone.words()
    # no candidate reached the target: no end reported
    ends.clear()
    top_up(
        lambda: ({"a": math.inf, "b": math.inf}, {"a": 3, "b": 3}), lambda labels, n: None, top=8,
        seq=SeqRule(cap=32), evidence=lambda labels: {}, on_end=ends.append,
    )  # fmt: skip
    assert ends == []
    # no sequential rule: no end reported
    ends.clear()
    top_up(lambda: ({"a": 1.0}, {"a": 3}), lambda labels, n: None, top=8, on_end=ends.append)
    assert ends == []


def test_family_z_shares_the_tail_among_the_comparisons() -> None:
    from statistics import NormalDist

    nd = NormalDist()
    assert family_z(1.5, 1) == 1.5 and family_z(1.5, 0) == 1.5  # one comparison: z itself
    for m in (2, 3, 10):
        assert math.isclose(1 - nd.cdf(family_z(1.5, m)), (1 - nd.cdf(1.5)) / m)
    assert 1.5 < family_z(1.5, 2) < family_z(1.5, 3) < family_z(1.5, 10)


def _family_loop(family: bool) -> list[tuple[list[str], int]]:
    """Three leaders 10% behind the best, each with jackknife se 1.1 x 0.03 x sqrt(7) of its ratio:
    separated at z 1.5 (low ~0.963), not at the family z of 3 comparisons (~2.01, low ~0.934)."""
    t = {"a": 1.0, "b": 1.1, "c": 1.101, "d": 1.102, "e": 3.0}
    seeds = dict.fromkeys(t, 8)
    runs: list[tuple[list[str], int]] = []

    def evidence(labels: list[str]) -> dict[str, list[float]]:
        return {
            lab: [t[lab] * (1 + (0.0 if lab == "a" else 0.03 * (-1) ** j)) for j in range(8)]
            for lab in labels
        }

    def run(labels: list[str], n: int) -> None:
        runs.append((labels, n))
        seeds.update(dict.fromkeys(labels, n))

    top_up(
        lambda: (dict(t), dict(seeds)), run, margin=0.3, top=8,
        seq=SeqRule(cap=16, z=1.5, tol=0.05, family=family), evidence=evidence,
    )  # fmt: skip
    return runs


def test_the_family_z_keeps_several_close_leaders_from_separating_at_once() -> None:
    assert _family_loop(False) == []  # each comparison at z 1.5: all separated, no round
    assert _family_loop(True) == [(["a", "b", "c", "d"], 16)]  # Bonferroni over 3: all double, to the cap


def _sticky_loop(sticky: bool) -> list[tuple[list[str], int]]:
    """b, a contender at 3 seeds (T 1.1x the best), reads 1.5x at 8 seeds (past the margin 0.3), and
    its groups spread wide (se ~0.4 of the ratio): no interval separates it from the best a."""
    seeds = {"a": 3, "b": 3, "c": 3}
    runs: list[tuple[list[str], int]] = []

    def estimate() -> tuple[dict[str, float], dict[str, int]]:
        return {"a": 1.0, "b": 1.1 if seeds["b"] < 8 else 1.5, "c": 3.0}, dict(seeds)

    def evidence(labels: list[str]) -> dict[str, list[float]]:
        t = estimate()[0]
        return {
            lab: [t[lab] * (1 + (0.1 * (-1) ** j if lab == "b" else 0.0)) for j in range(8)] for lab in labels
        }

    def run(labels: list[str], n: int) -> None:
        runs.append((labels, n))
        seeds.update(dict.fromkeys(labels, n))

    top_up(
        estimate, run, margin=0.3, top=8,
        seq=SeqRule(cap=16, z=2.5, tol=0.05, sticky=sticky), evidence=evidence,
    )  # fmt: skip
    return runs


def test_a_sticky_rule_compares_a_topped_up_candidate_past_the_margin_by_its_interval() -> None:
    # not sticky: b's noisy 1.5 past the margin ends its comparison; sticky: the interval decides
    assert _sticky_loop(False) == [(["a", "b"], 8)]
    assert _sticky_loop(True) == [(["a", "b"], 8), (["a", "b"], 16)]


def _cfg(root: Path, sets: tuple[str, ...] = ()) -> Recipe:
    return load_recipe(
        str(ASYNC), [f"run.results_dir={root}", "budget.async_top_up_seeds=4", "target.value=0.9", *sets]
    )


def _curve(store: ResultsStore, cfg: Recipe, cand: Candidate, seed: int) -> RunRecord:
    at0, gen, train = RUNS[cand.label]
    # seeds differ a little, with no trend; the off-policy candidates' seeds not as the others'
    at = at0 * (1.0 + 0.08 * ((seed * 5 + len(cand.label)) % 3 - 1))
    b, rid = cand.batch_responses, run_id(cand, seed)
    steps = []
    for i in range(40):
        m = {"eval_reward": 0.5 + 0.45 * min(1.0, i * b / at)}
        g, t = (gen, train) if i else (0.0, 0.0)
        steps.append(StepRecord(rid, i, i * b, 0, cand.lr, cand.prompts, 8, seed, m, gen_s=g, train_s=t))
    rec = RunRecord(
        rid, cand.label, cand.prompts, 8, seed, cand.lr, "sqrt", cfg.optimizer.lr, 16, "completed",
        steps=39, samples=39 * b, staleness=cand.staleness,
        updates_per_batch=cand.updates_per_batch or 1, parallel_runs=1,
    )  # fmt: skip
    store.add_finished_run(rec, steps)
    return rec


def _probe(
    root: Path, sets: tuple[str, ...] = (), cut: int = -1, drop: str = ""
) -> tuple[Recipe, ResultsStore, list[str], int]:
    """The stand-in probe's top-up; ``cut`` >= 0: interrupted (KeyboardInterrupt) after that many runs;
    ``drop``: a candidate whose planned runs are in the directory but that the plan no longer has."""
    cfg = _cfg(root, sets)
    full = plan_candidates(cfg)
    keep = tuple(c for c in full.candidates if c.label in RUNS and c.label != drop)
    plan = type(full)(**{**full.__dict__, "candidates": keep})
    store = ResultsStore(root)
    store.write_manifest({"recipe": cfg.to_dict(), "source": str(ASYNC), "created": 0.0})
    by = full.by_label()
    for lab in RUNS:
        for s in cfg.budget.seeds:
            _curve(store, cfg, by[lab], s)
    ran: list[str] = []

    def fake_run(
        recipe: Recipe, where: str, cand: Candidate, seed: int, *a: object, **kw: object
    ) -> RunRecord:
        if len(ran) == cut:
            raise KeyboardInterrupt
        ran.append(run_id(cand, seed))
        return _curve(ResultsStore(where), recipe, cand, seed)

    policy = lambda: stop_policy(cfg, NO_BAND)  # noqa: E731
    n = add_async_seeds(cfg, store, plan, fake_run, analyse_store, policy)
    return cfg, store, ran, n


FIXED = ("budget.async_top_up_margin=0.1", "budget.async_top_up_max_seeds=0")  # no sequential rounds


def test_the_probe_tops_up_its_contenders_and_records_why(tmp_path: Path) -> None:
    cfg, store, ran, n = _probe(tmp_path / "r", FIXED)
    rec = load_top_up(store)
    assert rec is not None and rec.rounds and n == len(ran) > 0
    topped = [t.label for r in rec.rounds for t in r.topped]
    seeds = seeds_by_label(store)
    for lab in RUNS:  # exactly the topped-up candidates ran their extra seeds
        assert seeds[lab] == (4 if lab in topped else 2), lab
    for r in rec.rounds:
        assert all(t.t <= 1.1 * r.best_t for t in r.topped)
    assert len(topped) >= 2 and "P4xG8" not in topped  # P4xG8: 3x slower to the target than the best
    # resumed: nothing more to run, the same record
    again = add_async_seeds(
        cfg,
        store,
        plan_candidates(cfg),
        lambda *a, **k: None,
        analyse_store,
        lambda: stop_policy(cfg, NO_BAND),
    )
    assert again == 0 and load_top_up(store) == rec
    out = CliRunner().invoke(app, ["recommend", "-r", str(store.root), "--throughput", "probe", "--json"])
    assert out.exit_code == 0, out.output
    notes = json.loads(out.stdout)["async_decision"]["notes"]
    assert json.loads(out.stdout)["async_decision"]["top_up_end"] is None  # no sequential rounds
    assert any(n.startswith("seed top-up") for n in notes)
    assert any(topped[0] in n and "round 1" in n for n in notes)
    assert (store.root / TOP_UP_FILE).is_file()


SEQ = ("budget.async_top_up_max_seeds=16", "budget.async_top_up_margin=0.3")


def test_a_candidate_the_plan_no_longer_has_is_not_compared(tmp_path: Path) -> None:
    """A probe resumed after an edit of the candidates (``probe.updates_per_batch`` narrowed, say)
    finds the dropped candidates' runs in the directory. The top-up compares the planned candidates
    only: it used to rank the dropped ones too, and record rounds that topped them up and an end that
    named them open leaders at seed counts no run gave (their runs are never started: not planned)."""
    _, whole, _, _ = _probe(tmp_path / "whole", SEQ)
    first = load_top_up(whole)
    assert first is not None and first.rounds
    drop = first.rounds[0].best  # the best estimate of the whole probe
    _, store, ran, _ = _probe(tmp_path / "edited", SEQ, drop=drop)
    rec = load_top_up(store)
    assert rec is not None and rec.end is not None
    assert drop not in {rec.end.best, *(o.label for o in rec.end.open)}
    seeds = seeds_by_label(store)
    for r in rec.rounds:
        assert r.best != drop and all(t.label != drop for t in r.topped), r
        assert all(seeds[t.label] >= r.seeds for t in r.topped), r  # what the record says was run
    assert all(not rid.startswith(drop + "-") for rid in ran)


def test_the_probe_doubles_the_close_calls_seeds_and_resumes_a_cut_round(tmp_path: Path) -> None:
    _, store, ran, _ = _probe(tmp_path / "whole", SEQ)
    whole = load_top_up(store)
    assert whole is not None and whole.cap == 16
    seq = [r for r in whole.rounds if r.kind == "sequential"]
    assert seq and seq[-1].seeds > 4, whole.lines()
    assert whole.end is not None and whole.lines()[-1] == whole.end.words()
    out = CliRunner().invoke(app, ["recommend", "-r", str(store.root), "--throughput", "probe", "--json"])
    assert out.exit_code == 0, out.output
    end = json.loads(out.stdout)["async_decision"]["top_up_end"]
    assert end["best"] == whole.end.best and end["resolved"] == (not whole.end.open)
    assert [o["name"] for o in end["not_separated"]] == [o.label for o in whole.end.open]
    assert end["compared"] == whole.end.compared >= 1 and end["cap"] == 16
    seeds = seeds_by_label(store)
    for r in seq:  # the not-separated ones and the best, each brought to the round's seeds
        assert all(seeds[t.label] == max(x.seeds for x in seq if t.label in [u.label for u in x.topped])
                   for t in r.topped)  # fmt: skip
    # cut during the first sequential round's runs: recorded before its runs; the rerun ends the same
    first = sum(len(r.topped) for r in whole.rounds if r.kind == "contenders") * 2
    with contextlib.suppress(KeyboardInterrupt):
        _probe(tmp_path / "cut", SEQ, cut=first + 1)
    cut = load_top_up(ResultsStore(tmp_path / "cut"))
    assert cut is not None and cut.rounds[-1].kind == "sequential"
    assert cut.end is None  # cut before the rounds ended
    _, store2, ran2, _ = _probe(tmp_path / "cut", SEQ)
    assert load_top_up(store2) == whole and seeds_by_label(store2) == seeds  # the end too
    assert len(ran2) == len(ran) - first - 1  # no run twice


def test_a_finished_top_up_run_again_writes_nothing_and_a_rerun_clears_its_end_first(tmp_path: Path) -> None:
    """A finished probe run again rewrote async_topup.json (twice), so it failed in a read-only
    directory ("Read-only file system"), unlike a sync probe. Unchanged, it is now left alone; a run
    it must redo (its folder deleted) still clears the stored end before it starts."""
    import shutil

    from batchtune.measure.async_topup import top_up_seeds

    _, store, _, _ = _probe(tmp_path / "r", SEQ)
    path = store.root / TOP_UP_FILE
    whole, before = load_top_up(store), path.stat()
    assert whole is not None and whole.end is not None
    _, _, ran, n = _probe(tmp_path / "r", SEQ)
    after = path.stat()
    assert (ran, n) == ([], 0) and (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    topped = whole.rounds[0].topped[0].label
    shutil.rmtree(store.run_dir(f"{topped}-s{top_up_seeds(_cfg(tmp_path / 'r', SEQ))[-2]}"))
    with contextlib.suppress(KeyboardInterrupt):
        _probe(tmp_path / "r", SEQ, cut=0)  # cut as its first run starts
    cut = load_top_up(store)
    assert cut is not None and cut.end is None and cut.rounds == whole.rounds


# ---- the sequential rounds through the real probe on the NQM backend (stale gradients, reuse) ----
NQM_SETS = [
    "probe.mode=grid", "nqm.dim=64", "nqm.noise_scale=4.0", "nqm.curvature_power=2.0",
    "generation.max_new_tokens=1", "nqm.gen_t0_s=2.0", "nqm.gen_t1_s=0.01", "nqm.train_t0_s=0.5",
    "nqm.train_t1_s=0.02", "optimizer.lr=0.3", "lr_scaling.rule=sqrt", "candidates.prompts=[8, 16]",
    "target.value=0.1", "probe.staleness=[1]", "probe.updates_per_batch=[2, 4]",
    "budget.seeds=[0, 1, 2]", "budget.async_top_up_seeds=4", "budget.async_top_up_max_seeds=16",
    "budget.async_top_up_margin=0.3", "budget.max_samples=8192",
]  # fmt: skip


def _nqm_probe(root: Path, run_fn: object = None) -> Recipe:
    import batchtune.measure.probe as probe

    cfg = load_recipe(str(ROOT / "recipes" / "nqm.toml"), [*NQM_SETS, f"run.results_dir={root}"])
    if run_fn is None:
        probe.run_probe(cfg)
    else:
        real = probe.execute_run
        probe.execute_run = run_fn  # type: ignore[assignment]
        try:
            probe.run_probe(cfg)
        finally:
            probe.execute_run = real
    return cfg


@pytest.mark.slow  # ~8 s CPU; the stand-in probe's test above is its fast form
def test_the_nqm_probe_doubles_the_seeds_of_a_close_call_and_resumes(tmp_path: Path) -> None:
    from batchtune.measure.async_topup import top_up_seeds
    from batchtune.measure.one_run import execute_run

    cfg = _nqm_probe(tmp_path / "whole")
    whole = load_top_up(ResultsStore.of(cfg))
    assert whole is not None and whole.cap == 16
    seq = [r for r in whole.rounds if r.kind == "sequential"]
    assert seq and seq[-1].seeds == 16  # a close call that the paired seeds did not settle at 8
    seeds = seeds_by_label(ResultsStore.of(cfg))
    for r in seq:
        assert all(seeds[t.label] >= r.seeds for t in r.topped)
        assert all(t.ratio >= 1.0 and t.low <= 0.95 for t in r.topped if not math.isnan(t.ratio))

    # interrupted in the first sequential round's runs, then run again: the same rounds and seeds
    late = set(top_up_seeds(cfg, 16)[4:])
    calls: list[int] = []

    def flaky(recipe: Recipe, where: str, cand: Candidate, seed: int, *a: object, **kw: object) -> RunRecord:
        if seed in late:
            calls.append(seed)
            if len(calls) > 2:
                raise KeyboardInterrupt
        return execute_run(recipe, where, cand, seed, *a, **kw)  # type: ignore[arg-type]

    root = tmp_path / "cut"
    with contextlib.suppress(KeyboardInterrupt):
        _nqm_probe(root, flaky)
    assert len(calls) == 3  # it was cut
    cut = load_top_up(ResultsStore(root))
    assert cut is not None and cut.rounds[-1].kind == "sequential"  # recorded before its runs
    cfg2 = _nqm_probe(root)
    again = load_top_up(ResultsStore.of(cfg2))
    assert again is not None and again.rounds[: len(cut.rounds)] == cut.rounds
    assert [(r.seeds, [t.label for t in r.topped]) for r in again.rounds] == [
        (r.seeds, [t.label for t in r.topped]) for r in whole.rounds
    ]
    assert seeds_by_label(ResultsStore(root)) == seeds
    out = CliRunner().invoke(app, ["recommend", "-r", str(root), "--throughput", "probe", "--json"])
    assert out.exit_code == 0, out.output
    notes = json.loads(out.stdout)["async_decision"]["notes"]
    assert any("not separated" in n and "-> 16 seeds" in n for n in notes)


@pytest.mark.parametrize(
    "text",
    ['{"margin": 0.3, "top": 8, "times_source": "x", "rounds": [{"x": 1}]}', "[1, 2]",
     '{"margin": 0.3, "top": 8, "times_source": "x", "rounds": [], "end": {"best": "a"}}'],
)  # fmt: skip
def test_a_damaged_top_up_record_is_an_input_error_that_says_what_to_do(tmp_path: Path, text: str) -> None:
    from batchtune.errors import InputError

    (tmp_path / TOP_UP_FILE).write_text(text)
    with pytest.raises(InputError, match="not a seed top-up record.*delete it"):
        load_top_up(ResultsStore(tmp_path))


def test_an_unreadable_top_up_record_is_an_input_error_naming_it(tmp_path: Path) -> None:
    """Bytes that are not UTF-8, or a directory where the record belongs, name the record: never
    "an input file", and never read as no record (a probe would then start the rounds afresh)."""
    from batchtune.errors import InputError

    path = tmp_path / TOP_UP_FILE
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(InputError, match=f"{path} is not UTF-8"):
        load_top_up(ResultsStore(tmp_path))
    path.unlink()
    path.mkdir()
    with pytest.raises(InputError, match=f"{path} is not a file"):
        load_top_up(ResultsStore(tmp_path))


def test_a_near_tie_left_open_is_weak_evidence_for_a_pick_in_it() -> None:
    end = TopUpEnd("a", 64, (OpenLeader("b", 1.01, 0.8, 64), OpenLeader("c", 1.02, 0.9, 64)))
    tie = end.near_tie("a")
    assert "not separate the best estimate a from b, c at its cap (64 seeds): a is in a near tie" in tie
    assert "up to 1.25x" in end.near_tie("a")  # 1 / the least lower end
    # recommend's pick may be an open leader: the bound is still the best estimate's
    assert "b is in a near tie" in end.near_tie("b") and "picking a may cost up to 1.25x" in end.near_tie("b")
    assert end.near_tie("d") == ""  # a pick outside the tie
    assert TopUpEnd("a", 64).near_tie("a") == ""  # nothing open


def test_recommend_reads_an_open_end_as_weak_evidence(tmp_path: Path) -> None:
    _, store, _, _ = _probe(tmp_path / "r", SEQ)
    argv = ["recommend", "-r", str(store.root), "--throughput", "probe", "--json"]
    before = json.loads(CliRunner().invoke(app, argv).stdout)
    pick = before["async_decision"]["pick"]["name"]
    assert before["async_decision"]["top_up_end"]["resolved"]  # this stand-in's seeds separate it
    assert not any("near tie" in e for e in before["recommended"]["evidence"])
    # the same record, had its rounds ended with another candidate open at the cap
    path = store.root / TOP_UP_FILE
    data = json.loads(path.read_text())
    other = next(lab for lab in RUNS if lab != pick)
    opened = [{"label": other, "ratio": 1.01, "low": 0.8, "seeds": 8}]
    data["end"] = {**data["end"], "best": pick, "open": opened}
    path.write_text(json.dumps(data))
    after = json.loads(CliRunner().invoke(app, argv).stdout)
    assert not after["async_decision"]["top_up_end"]["resolved"]
    assert after["async_decision"]["top_up_end"]["cost_bound"] == pytest.approx(1.25)
    assert any("near tie" in e and other in e for e in after["recommended"]["evidence"])
    text = CliRunner().invoke(app, argv[:-1], terminal_width=200).output
    assert "Weak evidence" in text and "NOT RESOLVED" in text
    # the probe resumed on that record finds its end again: the stale one is not kept
    cfg = _cfg(tmp_path / "r", SEQ)
    policy = lambda: stop_policy(cfg, NO_BAND)  # noqa: E731
    assert add_async_seeds(cfg, store, plan_candidates(cfg), lambda *a, **k: None, analyse_store, policy) == 0
    end = load_top_up(store)
    assert end is not None and end.end is not None and end.end.open == ()
