"""The async probe's seed top-up (issue 30): the rule (analysis/decide/async_topup.py), and the probe's
rounds for real on a results directory whose runs a stand-in trainer writes (a curve per seed), so
the real analysis, joint ranking, stores and record are exercised; `recommend` says who was topped up."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from batchtune.analysis.decide.async_topup import contenders, top_up
from batchtune.backends.spec import Candidate
from batchtune.cli import app
from batchtune.measure.async_topup import TOP_UP_FILE, add_async_seeds, load_top_up, seeds_by_label
from batchtune.measure.plan import plan_candidates, run_id
from batchtune.measure.probe import analyse_store
from batchtune.measure.stop_rule import NO_BAND, stop_policy
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

    def run(labels: list[str]) -> None:
        runs.append(labels)
        seeds.update(dict.fromkeys(labels, 8))

    rounds = top_up(estimate, run, margin=0.1, top=8)
    assert runs == [["a", "b"], ["c"]]
    assert [r.best for r in rounds] == ["a", "b"]
    assert [t.seeds_before for t in rounds[0].topped] == [3, 3]


def _cfg(root: Path) -> Recipe:
    return load_recipe(
        str(ASYNC), [f"run.results_dir={root}", "budget.async_top_up_seeds=4", "target.value=0.9"]
    )


def _curve(store: ResultsStore, cfg: Recipe, cand: Candidate, seed: int) -> RunRecord:
    at0, gen, train = RUNS[cand.label]
    at = at0 * (1.0 + 0.08 * ((seed * 5) % 3 - 1))  # seeds differ a little, with no trend
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


def _probe(root: Path) -> tuple[Recipe, ResultsStore, list[str], int]:
    cfg = _cfg(root)
    plan = plan_candidates(cfg)
    plan = type(plan)(**{**plan.__dict__, "candidates": tuple(c for c in plan.candidates if c.label in RUNS)})
    store = ResultsStore(root)
    store.write_manifest({"recipe": cfg.to_dict(), "source": str(ASYNC), "created": 0.0})
    by = plan.by_label()
    for lab in RUNS:
        for s in cfg.budget.seeds:
            _curve(store, cfg, by[lab], s)
    ran: list[str] = []

    def fake_run(
        recipe: Recipe, where: str, cand: Candidate, seed: int, *a: object, **kw: object
    ) -> RunRecord:
        ran.append(run_id(cand, seed))
        return _curve(ResultsStore(where), recipe, cand, seed)

    policy = lambda: stop_policy(cfg, NO_BAND)  # noqa: E731
    n = add_async_seeds(cfg, store, plan, fake_run, analyse_store, policy)
    return cfg, store, ran, n


def test_the_probe_tops_up_its_contenders_and_records_why(tmp_path: Path) -> None:
    cfg, store, ran, n = _probe(tmp_path / "r")
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
    assert any(n.startswith("seed top-up") for n in notes)
    assert any(topped[0] in n and "round 1" in n for n in notes)
    assert (store.root / TOP_UP_FILE).is_file()
