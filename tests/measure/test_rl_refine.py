"""RL refinement: the probe adds P between grid points where the critical batch's crossing sits."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from batchtune.analysis.sample.intervals import ShapeFreeCrossing
from batchtune.errors import InputError
from batchtune.measure.plan import plan_candidates
from batchtune.measure.rl_refine import (
    RLRefineRound,
    next_round,
    read_rounds,
    steps_to_split,
    stored_plan,
    with_prompts,
    write_rounds,
)
from batchtune.recipe.load import load_recipe
from batchtune.records.store import ResultsStore

ROOT = Path(__file__).resolve().parents[2]
NQM = ROOT / "recipes" / "nqm.toml"


def _critical(crossing: float, ci: tuple[float, float]) -> Any:
    sf = ShapeFreeCrossing(crossing, ci, (0.0, 0.0), 0.1, 4, 0.9, reference_batch=8.0)
    return SimpleNamespace(shape_free=sf)


def test_the_step_holding_the_crossing_is_split_first_then_the_nearest() -> None:
    # G = 8, P 1..128 doubling: the crossing 431 lies in N 256..512 (P 32..64); the interval
    # [300, 700] overlaps that step and 512..1024 (P 64..128), not 128..256
    got = steps_to_split([1, 2, 4, 8, 16, 32, 64, 128], 8, _critical(431.0, (300.0, 700.0)))
    assert got == [(32, 64, 45), (64, 128, 91)]
    r = next_round([1, 2, 4, 8, 16, 32, 64, 128], 8, _critical(431.0, (300.0, 700.0)), 4, 1, per_round=2)
    assert r is not None and r.prompts == (45, 91) and r.left_out == ()
    one = next_round([1, 2, 4, 8, 16, 32, 64, 128], 8, _critical(431.0, (300.0, 700.0)), 4, 1)
    assert one is not None and one.prompts == (45,) and one.left_out == ()  # the default: 1 a round
    assert "N = 256..512" in r.reasons[0] and "P45xG8" in r.reasons[0]


def test_budget_and_goal_stop_the_rounds() -> None:
    crit = _critical(431.0, (300.0, 700.0))
    one = next_round([1, 2, 4, 8, 16, 32, 64, 128], 8, crit, 1, 1, per_round=2)
    assert one is not None and one.prompts == (45,) and one.left_out == (91,)
    spent = next_round([1, 2, 4, 8, 16, 32, 64, 128], 8, crit, 0, 3)
    assert spent is not None and spent.prompts == () and spent.left_out == (45,)
    # a grid already 2^(1/4) fine around the interval needs nothing
    fine = [32, 38, 45, 54, 64, 76, 91]
    assert next_round(fine, 8, crit, 4, 1) is None
    # neighbours 1 apart: the midpoint rounds to a grid point
    assert steps_to_split([1, 2], 8, _critical(12.0, (9.0, 15.0))) == []


def test_no_refinement_without_a_finite_crossing() -> None:
    assert next_round([1, 2, 4], 8, _critical(math.inf, (32.0, math.inf)), 4, 1) is None
    assert next_round([1, 2, 4], 8, SimpleNamespace(shape_free=None), 4, 1) is None
    assert next_round([1, 2, 4], 8, None, 4, 1) is None


def test_a_table_rule_skips_steps_it_has_no_lr_for() -> None:
    crit = _critical(431.0, (300.0, 700.0))
    r = next_round([1, 2, 4, 8, 16, 32, 64, 128], 8, crit, 4, 1, lambda n: n == 728, per_round=2)
    assert r is not None and r.prompts == (91,)


def test_added_candidates_take_the_rules_lr_and_join_the_main_sweep() -> None:
    recipe = load_recipe(NQM)
    plan = plan_candidates(recipe)
    more = with_prompts(recipe, plan, [45])
    c = more.by_label()["P45xG8"]
    ref = plan.by_label()[plan.reference]
    assert c.group_size == 8 and math.isclose(c.lr, ref.lr * 360 / 8)  # linear rule from N = 8
    assert more.main.index("P45xG8") == more.main.index("P32xG8") + 1  # ascending in batch
    assert more.reference == plan.reference and with_prompts(recipe, more, [45]) == more


def test_rounds_round_trip_through_the_store(tmp_path) -> None:
    recipe = load_recipe(NQM).with_results_dir(tmp_path / "r")
    store = ResultsStore.of(recipe)
    store.root.mkdir(parents=True)
    assert read_rounds(store) == () and stored_plan(recipe, store) == plan_candidates(recipe)
    rounds = (RLRefineRound(1, (45,), 8, ("why",)), RLRefineRound(2, (), 8, (), (38, 54)))
    write_rounds(store, rounds)
    assert read_rounds(store) == rounds
    assert "P45xG8" in stored_plan(recipe, store).main
    for bad in ("{not json", '{"rounds": [{"round": 1}]}'):
        (store.root / "refine_rl.json").write_text(bad, encoding="utf-8")
        with pytest.raises(InputError, match="refine_rl.json"):
            read_rounds(store)


CASE = [
    "probe.refine_rl=true",
    "probe.refine_rl_max_candidates=2",
    "candidates.prompts=[1,16,64]",
    "budget.seeds=[0,1]",
    "budget.max_extra_seeds=0",
    "target.value=1.5",
    "budget.max_samples=20480",
    "run.workers=1",
]


@pytest.fixture(scope="module")
def refined(tmp_path_factory) -> tuple[Any, Any]:
    from batchtune.measure.probe import run_probe

    recipe = load_recipe(NQM, CASE).with_results_dir(tmp_path_factory.mktemp("rl") / "r")
    return recipe, run_probe(recipe)


def test_the_nqm_probe_adds_candidates_between_grid_points_and_resumes(refined) -> None:
    from batchtune.measure.probe import run_probe

    recipe, result = refined
    added = [p for r in result.refinement for p in r.prompts]
    assert added and all(1 < p < 64 and p not in (16,) for p in added)
    assert len(added) <= 2
    labels = {c.label for c in result.efficiency.candidates}
    assert {f"P{p}xG8" for p in added} <= labels
    assert result.runs_done == 2 * (3 + len(added))  # the grid and the rounds, every planned seed
    assert any(n.startswith("refinement between grid points") for n in result.efficiency.notes)
    again = run_probe(recipe)
    assert again.runs_done == 0 and again.refinement == result.refinement  # replays the same rounds


def test_recommend_reads_the_added_candidates_from_the_store(refined) -> None:
    from batchtune.workflow.recommend import recommend_for_recipe

    recipe, result = refined
    added = {f"P{p}xG8" for r in result.refinement for p in r.prompts}
    off = load_recipe(NQM, [*CASE[1:], "probe.refine_rl=false"]).with_results_dir(recipe.run.results_dir)
    rec, _, _ = recommend_for_recipe(off, "probe", None, 0, plot=False)
    ranked = {c.label for c in rec.efficiency.candidates}
    assert added <= ranked and added <= set(rec.throughput.per_candidate)
    crit = rec.efficiency.critical
    batches = {v.batch for v in crit.verdicts} if crit is not None else set()
    assert {p * 8 for r in result.refinement for p in r.prompts} <= batches
    assert any(n.startswith("refinement between grid points") for n in rec.efficiency.notes)


def test_plan_bounds_the_rounds_cost_and_says_nothing_when_off() -> None:
    from batchtune.measure.preview import plan_preview
    from batchtune.measure.rl_refine import addable, refine_bound

    assert addable([1, 2, 4, 8]) == ({3, 5, 6, 7}, 2)  # 1..2 and 2..3 cannot be split in whole prompts
    assert {11, 9, 13} <= addable([8, 16])[0]  # 11, then 9 and 13: the 2^(1/4) steps
    on = load_recipe(NQM, ["probe.refine_rl=true"])
    cands, runs = refine_bound(on)
    assert cands == 4 and runs == 4 * len(on.budget.seeds)  # the default budget caps it
    pre = plan_preview(on, time_steps=0)
    assert pre.refine_runs_max == runs and pre.refine_tokens_max == runs * on.budget.max_samples
    assert any(n.startswith("refinement rounds (not in the totals above)") for n in pre.notes)
    off = plan_preview(load_recipe(NQM), time_steps=0)
    assert off.refine_runs_max == 0 and not any("refine" in n for n in off.notes)


def test_probe_json_carries_the_rounds(refined) -> None:
    """`probe --json` on the refined store: no run, the same rounds under "refinement"."""
    import json

    from typer.testing import CliRunner

    from batchtune.cli import app

    recipe, result = refined
    args = ["probe", str(NQM), "--json", "--results", str(recipe.run.results_dir)]
    for kv in CASE:
        args += ["--set", kv]
    out = json.loads(CliRunner().invoke(app, args, catch_exceptions=False).stdout)
    assert out["runs_done"] == 0
    assert [r["prompts"] for r in out["refinement"]] == [list(r.prompts) for r in result.refinement]
