"""Off-policy knobs of the torch RL trainer (issue 30): staleness k and updates per rollout batch u.

k = 0 and u = mini_batches must be today's trainer: ``data/onpolicy_curves.json`` holds the curves
of the on-policy trainer as it was before these knobs (commit a28a317), made by ``_curves`` below
with torch 2.13.0 on an earlier machine of this project. Spelling the knobs out (k = 0, u) must give
the same floats, bit for bit, as leaving them out. Against the stored curves, steps, samples, tokens
and LRs are exact and floats agree to 1% or 1e-6: torch's CPU kernels round differently on another
instruction set (an AMD EPYC gave grad norms 3e-4 apart, a PPO loss near 1e-7 of the other sign),
and the drift grows over the run's four steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from batchtune.backends.spec import Candidate, RunFailed, RunSpec
from batchtune.backends.torch_rl import TorchRLBackend, grpo
from batchtune.backends.torch_rl.trainer import STAGE_TIMERS
from batchtune.codec import from_dict
from batchtune.measure.plan import plan_candidates, run_record
from batchtune.recipe.load import load_recipe
from batchtune.records.types import RunRecord

BASE = [
    "model.pretrain_steps=50",
    'task.name="reverse"',
    "task.difficulty=4",
    "task.eval_size=32",
    "hardware.threads=1",
    "generation.max_new_tokens=6",
    'hardware.device="cpu"',
    "budget.max_samples=64",
]
CASES = {
    "grpo": [],
    "ppo": ["algorithm.name=ppo"],
    "grpo_mb2_kl": ["algorithm.mini_batches=2", "algorithm.kl_coef=0.05"],
}
GOLDEN = Path(__file__).parent / "data" / "onpolicy_curves.json"


pytestmark = pytest.mark.usefixtures("restore_torch_threads")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("offpolicy")


def run(root: Path, extra: list[str], **knobs) -> list:
    recipe = load_recipe(None, [*BASE, *extra])
    cand = Candidate("P2xG8", 2, 8, 3e-4, "sqrt", **knobs)
    spec = RunSpec("P2xG8-s0", cand, 0, recipe, root / "runs" / "x", 3e-4, 16)
    return list(TorchRLBackend().train(spec))


def _close(got: object, want: object) -> bool:
    """Structural equality, with floats compared to 1% or 1e-6 (the stored curves' CPU may differ)."""
    if isinstance(want, dict):
        return (
            isinstance(got, dict) and got.keys() == want.keys() and all(_close(got[k], want[k]) for k in want)
        )
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_close, got, want))
    if isinstance(want, float) and isinstance(got, float):
        return math.isclose(got, want, rel_tol=1e-2, abs_tol=1e-6)
    return got == want


def _curves(records) -> list[dict]:
    return [
        {
            "step": r.step,
            "samples": r.samples,
            "tokens": r.tokens,
            "lr": r.lr,
            "metrics": {k: v for k, v in r.metrics.items() if k not in STAGE_TIMERS},  # not pinned
            "grad_norm": r.grad_norm,
            "critic_grad_norm": r.critic_grad_norm,
        }
        for r in records
    ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_on_policy_knobs_reproduce_the_old_trainer_exactly(root, case):
    golden = json.loads(GOLDEN.read_text())[case]
    u = 2 if "mini_batches=2" in " ".join(CASES[case]) else 1
    plain = _curves(run(root, CASES[case]))
    assert _close(plain, golden)
    assert _curves(run(root, CASES[case], staleness=0, updates_per_batch=u)) == plain


def test_the_stored_curves_comparison_can_fail():
    golden = json.loads(GOLDEN.read_text())["grpo"]
    moved = json.loads(json.dumps(golden))
    moved[1]["grad_norm"] *= 1.05
    assert _close(golden, golden) and not _close(moved, golden)
    moved = json.loads(json.dumps(golden))
    moved[1]["samples"] += 1
    assert not _close(moved, golden)


def test_staleness_trains_on_batches_from_older_weights(root, monkeypatch):
    from batchtune.backends.torch_rl import trainer

    made = []
    real = trainer.make_batch

    def counting(*args):
        batch = real(*args)
        made.append(batch.version)
        return batch

    monkeypatch.setattr(trainer, "make_batch", counting)
    on = run(root, [])
    made.clear()
    off = run(root, [], staleness=2)
    # 64 samples / 16 per step: 4 batches generated, none beyond the budget; the first three from
    # the initial weights (the queue fills), the fourth after one update
    assert made == [0, 0, 0, 1]
    assert [r.metrics["staleness"] for r in off[1:]] == [0.0, 1.0, 2.0, 2.0]
    assert [r.samples for r in off] == [r.samples for r in on]
    assert off[1].metrics["reward"] == on[1].metrics["reward"]  # the same first batch
    # later batches come from older weights, so their ratios move off 1 and the curves part
    assert [r.metrics["loss"] for r in off[2:]] != [r.metrics["loss"] for r in on[2:]]
    assert "staleness" not in on[1].metrics


def test_stale_batches_are_importance_corrected_against_the_behaviour_policy(root, monkeypatch):
    seen = []
    real = grpo.clipped_pg

    def spy(logp, old, adv, clip_eps):
        seen.append(float((logp.detach() - old).abs().max()))
        return real(logp, old, adv, clip_eps)

    monkeypatch.setattr(grpo, "clipped_pg", spy)
    run(root, [], staleness=1)
    # step 1 trains on its own weights' batch (ratio 1 up to recomputation), later steps on batches
    # from one update back: log pi_theta - log pi_behaviour is visibly nonzero
    assert seen[0] < 1e-4 and max(seen[1:]) > 1e-4, seen


def test_updates_per_batch_count_optimiser_steps_not_samples(root, monkeypatch):
    steps = []
    real = grpo.clip_and_norm

    def counting(*args):
        steps.append(1)
        return real(*args)

    monkeypatch.setattr(grpo, "clip_and_norm", counting)
    recs = run(root, [], updates_per_batch=3)
    assert len(steps) == 4 * 3
    assert [r.samples for r in recs] == [0, 16, 32, 48, 64]  # responses generated, not reused
    assert recs[2].metrics["clip_frac"] > 0.0 or recs[2].metrics["loss"] != 0.0


def test_ppo_runs_stale_and_reused(root):
    recs = run(root, ["algorithm.name=ppo"], staleness=1, updates_per_batch=2)
    assert [r.metrics["staleness"] for r in recs[1:]] == [0.0, 1.0, 1.0, 1.0]
    assert all(r.critic_grad_norm is not None for r in recs[1:])


def test_updates_must_split_into_the_mini_batches(root):
    with pytest.raises(RunFailed, match="not a multiple of algorithm.mini_batches = 2"):
        run(root, ["algorithm.mini_batches=2"], updates_per_batch=3)


def test_plan_crosses_main_candidates_with_k_and_u():
    base = load_recipe(None, ["candidates.prompts=[2, 4]"])
    assert [c.label for c in plan_candidates(base).candidates] == ["P2xG8", "P4xG8"]  # unchanged
    recipe = load_recipe(
        None, ["candidates.prompts=[2, 4]", "probe.staleness=[0, 1]", "probe.updates_per_batch=[1, 2]"]
    )
    plan = plan_candidates(recipe)
    assert plan.main == ("P2xG8", "P4xG8")
    assert plan.offpolicy == (
        "P2xG8-k0u2", "P2xG8-k1u1", "P2xG8-k1u2", "P4xG8-k0u2", "P4xG8-k1u1", "P4xG8-k1u2",
    )  # fmt: skip
    cand = plan.by_label()["P4xG8-k1u2"]
    assert (cand.staleness, cand.updates_per_batch, cand.lr) == (1, 2, plan.by_label()["P4xG8"].lr)
    record = run_record(cand, 0, 1e-3, 16, "completed")
    assert (record.staleness, record.updates_per_batch) == (1, 2)


def test_old_run_records_load_on_policy():
    old = dataclasses.asdict(run_record(Candidate("P2xG8", 2, 8, 1e-3, "sqrt"), 0, 1e-3, 16, "completed"))
    del old["staleness"], old["updates_per_batch"]
    record = from_dict(RunRecord, old, "old run.json")
    assert (record.staleness, record.updates_per_batch) == (0, 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["algorithm.mini_batches=2", "probe.updates_per_batch=[3]"], "multiple of algorithm.mini_batches"),
        (["probe.staleness=[-1]"], "probe.staleness"),
        (["probe.staleness=[]"], "probe.staleness"),
    ],
)
def test_bad_knobs_are_recipe_errors(args, message):
    from batchtune.errors import RecipeError

    with pytest.raises(RecipeError, match=message):
        load_recipe(None, args)
