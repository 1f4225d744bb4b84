"""The pre-training probe adds batches between grid points where B_opt sits (measure/pretrain_refine.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from batchtune.analysis.pretrain.grid import GridAnalysis, GridCurve, analyse_grid
from batchtune.analysis.pretrain.refine import FINE_STEP
from batchtune.analysis.pretrain.synth import SynthLaw, synth_curves
from batchtune.measure.pretrain_refine import (
    REFINE_FILE,
    addable,
    extra_seeds,
    next_round,
    plan_note,
    refine_bound,
    refine_grid,
)
from batchtune.recipe.load import recipe_from_dict
from batchtune.records.store import ResultsStore

LAW = SynthLaw()
GRID = [256 * 2**i for i in range(8)]  # 256 .. 32,768 tokens, doubling
TARGETS = [2.9, 2.65]  # true B_opt 6,014 and 9,180: between grid points


def _recipe(**probe: object):  # type: ignore[no-untyped-def]
    return recipe_from_dict(
        {
            "backend": {"training": "pretrain"},
            "budget": {"seeds": [0, 1]},
            "probe": {"mode": "grid", **probe},
            "pretrain": {"seq_len": 2, "batches_tokens": GRID, "max_tokens": 200_000_000, "targets": TARGETS},
        },
        "test",
    )


class FakeProbe:
    """Curves of the law (noise-free unless ``noise``), a batch at each seed on demand; counts runs."""

    def __init__(self, noise: float = 0.0) -> None:
        self.curves: dict[int, dict[int, GridCurve]] = {}
        self.runs = 0
        self.noise = noise

    def run_batches(self, batches: Sequence[int], seeds: Sequence[int] | None = None) -> int:
        done = 0
        for b in batches:
            runs = self.curves.setdefault(b, {})
            for s in [s for s in (seeds if seeds is not None else (0, 1)) if s not in runs]:
                ((bt, _, t, v),) = synth_curves(
                    LAW, [float(b)], [1000 * s + b], max_tokens=2e8, noise_rel=self.noise
                )
                runs[s] = GridCurve(bt, s, tuple(t), tuple(v))
                done += 1
        self.runs += done
        return done

    def analyse(self, batches: set[int] | None = None, seeds: set[int] | None = None) -> GridAnalysis:
        keep = [
            c
            for b, cs in self.curves.items()
            if batches is None or b in batches
            for s, c in cs.items()
            if seeds is None or s in seeds
        ]
        return analyse_grid(keep, TARGETS, base_lr=1e-3)


def test_rounds_add_half_then_quarter_steps_until_b_opt_is_pinned(tmp_path: Path) -> None:
    fake = FakeProbe()
    fake.run_batches(GRID)
    store = ResultsStore(tmp_path)
    rounds, done = refine_grid(_recipe(refine_max_batches=64), store, fake.analyse, fake.run_batches)
    assert len(rounds) >= 2 and done == fake.runs - 2 * len(GRID) > 0
    assert set(rounds[0].batches_tokens) <= {5792, 11586, 2896}  # 2^(1/2) steps beside 4096 / 8192
    final = fake.analyse()
    for est in final.estimates:
        lo, hi = est.b_opt_bracket
        truth = LAW.b_opt(est.target_loss)
        assert lo <= truth <= hi and hi / lo <= FINE_STEP**2 * 1.02  # the goal: 2^(1/4) either side
        assert est.b_opt_tokens == pytest.approx(truth, rel=0.05)
    data = json.loads((tmp_path / REFINE_FILE).read_text())
    assert [r["round"] for r in data["rounds"]] == [r.round for r in rounds]
    assert all(r["reasons"] for r in data["rounds"])


def test_a_rerun_replays_the_same_rounds_and_runs_nothing(tmp_path: Path) -> None:
    fake = FakeProbe()
    fake.run_batches(GRID)
    recipe = _recipe(refine_max_batches=64)
    first, _ = refine_grid(recipe, ResultsStore(tmp_path), fake.analyse, fake.run_batches)
    again, done = refine_grid(recipe, ResultsStore(tmp_path), fake.analyse, fake.run_batches)
    assert again == first and done == 0


def test_the_budget_stops_it_and_says_what_it_left_out(tmp_path: Path) -> None:
    fake = FakeProbe()
    fake.run_batches(GRID)
    rounds, _ = refine_grid(
        _recipe(refine_max_batches=1), ResultsStore(tmp_path), fake.analyse, fake.run_batches
    )
    added = [b for r in rounds for b in r.batches_tokens]
    assert len(added) <= 1
    assert rounds[-1].left_out  # named, not run
    off, done = refine_grid(
        _recipe(refine=False), ResultsStore(tmp_path / "off"), fake.analyse, fake.run_batches
    )
    assert off == () and done == 0


def test_next_round_is_none_on_a_fine_grid() -> None:
    fine = sorted({int(round(x)) for x in 4096 * FINE_STEP ** np.arange(-6, 7)})
    curves = [
        GridCurve(b, s, tuple(t), tuple(v)) for b, s, t, v in synth_curves(LAW, fine, [0], max_tokens=2e8)
    ]
    assert next_round(analyse_grid(curves, [2.9], base_lr=1e-3), 2, 8, 1) is None


def test_plan_bounds_the_rounds_cost() -> None:
    batches, runs = refine_bound(_recipe(refine_max_batches=64))
    possible, rounds = addable(GRID, 2)
    assert rounds == 2 and batches == min(2 * len(TARGETS) * rounds, len(possible)) and runs == 2 * batches
    assert refine_bound(_recipe(refine_max_batches=3)) == (3, 6)
    note = plan_note(_recipe(refine_max_batches=3), 10.0)
    assert "at most 3 batch(es) = 6 run(s) = 1,200,000,000 tokens, at most 60 s" in note
    assert "named, not refined" in plan_note(_recipe(refine=False), 10.0)
    assert refine_bound(_recipe(refine=False)) == (0, 0)


def test_the_seed_round_runs_more_seeds_beside_b_opt_and_replays(tmp_path: Path) -> None:
    """Issue 32: with 1% loss noise the minimum's neighbours read within the seeds' noise of it, so
    the seed round runs seeds 2 and 3 at the batches within 2^(1/2) of each measured minimum; it is
    recorded with its seeds, bounded, and a rerun replays it and runs nothing."""
    fake = FakeProbe(noise=0.01)
    fake.run_batches(GRID)
    recipe = _recipe(refine_max_batches=8, refine_seeds=4)
    rounds, done = refine_grid(recipe, ResultsStore(tmp_path), fake.analyse, fake.run_batches)
    seeded = rounds[-1]
    assert seeded.seeds == (2, 3) and seeded.batches_tokens and all(not r.seeds for r in rounds[:-1])
    for b in seeded.batches_tokens:
        assert set(fake.curves[b]) == {0, 1, 2, 3}
    assert sum(len(cs) == 2 for cs in fake.curves.values()) == len(fake.curves) - len(seeded.batches_tokens)
    final = fake.analyse()
    assert {e.n_seeds for e in final.estimates} == {4}
    data = json.loads((tmp_path / REFINE_FILE).read_text())
    assert data["rounds"][-1]["seeds"] == [2, 3]
    again, more = refine_grid(recipe, ResultsStore(tmp_path), fake.analyse, fake.run_batches)
    assert again == rounds and more == 0
    few, _ = refine_grid(
        _recipe(refine_max_batches=0, refine_seeds=4),
        ResultsStore(tmp_path / "few"),
        fake.analyse,
        fake.run_batches,
    )
    assert few[-1].seeds == (2, 3) and few[-1].batches_tokens == () and few[-1].left_out  # budget 0


def test_the_seed_round_is_off_by_default_and_in_the_plans_bound() -> None:
    assert extra_seeds(_recipe()) == () and extra_seeds(_recipe(refine_seeds=2)) == ()
    assert extra_seeds(_recipe(refine_seeds=5)) == (2, 3, 4)
    bound = refine_bound(_recipe(refine_max_batches=3, refine_seeds=4))
    assert bound == (3, 3 * 2 + 6 * 2)  # the seed round: up to 2 x 3 batches at 2 more seeds
    note = plan_note(_recipe(refine_max_batches=3, refine_seeds=4), 10.0)
    assert "then seeds 2, 3 at up to 6 batch(es) beside B_opt" in note and "18 run(s)" in note


def test_seq_len_rounding_ends_the_rounds() -> None:
    possible, rounds = addable([16, 32, 48, 64, 96, 128], 16)
    assert possible == {80, 112} and rounds == 1  # 16..64 midpoints round to grid points


@pytest.mark.slow
def test_the_probe_runs_the_added_batches_as_ordinary_runs_and_resumes(tmp_path: Path) -> None:
    """A real pre-training probe (tiny Llama, about 15 s): B_opt at 16 on [16, 32, 64, 128] gets 24
    added at both seeds; a rerun runs nothing and reports the same round."""
    from typer.testing import CliRunner

    from batchtune.cli import app

    args = ["probe", "recipes/tiny-pretrain.toml", "--json", "--set", f"run.results_dir={tmp_path / 'r'}"]
    for kv in ("pretrain.seq_len=8", "pretrain.batches_tokens=[16, 32, 64, 128]", "pretrain.max_tokens=6000",
               "pretrain.eval_every_tokens=256", "budget.seeds=[0, 1]", "pretrain.targets=[3.2, 2.9]",
               "pretrain.warmup_tokens=256", "pretrain.eval_sequences=32"):  # fmt: skip
        args += ["--set", kv]
    first = json.loads(CliRunner().invoke(app, args, catch_exceptions=False).stdout)
    assert first["refinement"] and first["refinement"][0]["batches_tokens"] == [24]
    assert first["runs_done"] == 10 and {"B24-s0", "B24-s1"} <= set(first["statuses"])
    assert 24.0 in first["analysis"]["estimates"][0]["batches_tokens"]
    again = json.loads(CliRunner().invoke(app, args, catch_exceptions=False).stdout)
    assert again["runs_done"] == 0 and again["refinement"] == first["refinement"]


def test_plan_of_the_shipped_pretraining_recipe_bounds_its_refinement() -> None:
    from batchtune.measure.preview import plan_preview
    from batchtune.recipe.load import load_recipe

    recipe = load_recipe("recipes/tiny-pretrain.toml")
    pre = plan_preview(recipe, time_steps=0)
    batches, runs = refine_bound(recipe)
    assert runs == 3 * batches > 0 and pre.refine_runs_max == runs
    assert pre.refine_tokens_max == runs * recipe.pretrain.max_tokens
    assert any(n.startswith("refinement rounds (not in the totals above)") for n in pre.notes)
    off = load_recipe("recipes/tiny-pretrain.toml", ["probe.refine=false"])
    assert plan_preview(off, time_steps=0).refine_runs_max == 0
