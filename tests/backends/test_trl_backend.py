"""The trl backend: TRL's GRPOTrainer in process on the tiny model, for real, on CPU."""

from __future__ import annotations

import threading
import warnings

import pytest

from batchtune.backends.spec import Candidate, RunSpec
from batchtune.recipe.load import load_recipe, shipped_recipes

pytest.importorskip("trl")

TINY = [
    "backend.training=trl",
    "model.pretrain_steps=20",
    "model.pretrain_batch=16",
    "task.difficulty=1",
    "task.train_size=40",
    "task.eval_size=4",
    "task.eval_every_samples=16",
    "generation.max_new_tokens=3",
    "candidates.group_size=4",
    "hardware.device=cpu",
]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """One results folder for the module, so its runs share the cached warm start."""
    return tmp_path_factory.mktemp("results")


def spec_for(root, name, *overrides, prompts=2, lr=1e-3, seed=0):
    recipe = load_recipe(None, [*TINY, *overrides])
    cand = Candidate(f"P{prompts}xG4", prompts, 4, lr, "sqrt")
    return RunSpec(f"{cand.label}-s{seed}", cand, seed, recipe, root / "runs" / name, lr, 8)


def test_grpo_trainer_runs_and_yields_records(root):
    from batchtune.backends.trl_backend import TRLBackend

    spec = spec_for(root, "records", "budget.max_samples=32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = list(TRLBackend().train(spec))
    # transformers 5 renamed gradient checkpointing: no FutureWarning of ours (or of TRL's reading of
    # the old name) reaches the user's stderr
    assert not [w for w in caught if "checkpointing" in str(w.message)], [str(w.message) for w in caught]
    assert [r.step for r in records] == [0, 1, 2, 3, 4]
    assert [r.samples for r in records] == [0, 8, 16, 24, 32]  # P*G completions per optimiser step
    assert records[0].lr == 0.0 and all(r.lr == pytest.approx(1e-3) for r in records[1:])  # constant LR
    assert [("eval_reward" in r.metrics) for r in records] == [True, False, True, False, True]
    assert all(0.0 <= r.metrics["reward"] <= 1.0 and r.grad_norm is not None for r in records[1:])
    assert all(r.run_id == spec.run_id and (r.prompts, r.group_size, r.seed) == (2, 4, 0) for r in records)
    assert all(r.gen_s > 0 and r.train_s >= 0 for r in records[1:])
    assert records[-1].tokens >= records[1].tokens > 0
    assert (spec.run_dir / "trl" / "trainer_state.json").exists()
    assert (root / "cache").is_dir()  # the warm start is cached and shared with the torch backend


def test_mini_batches_split_one_generation(root):
    from batchtune.backends.trl_backend import TRLBackend

    spec = spec_for(
        root,
        "mini",
        "budget.max_samples=16",
        "algorithm.mini_batches=2",
        "task.eval_size=0",
        "target.metric=reward",  # no held-out set: the training reward is the only metric
    )
    records = list(TRLBackend().train(spec))
    assert [r.samples for r in records] == [4, 8, 12, 16]  # 8 completions feed 2 steps of 4
    assert not any("eval_reward" in r.metrics for r in records)  # no held-out set


def test_closing_early_stops_the_trainer_thread(root):
    from batchtune.backends.trl_backend import TRLBackend

    gen = TRLBackend().train(spec_for(root, "closed", "budget.max_samples=400"))
    assert [next(gen).step for _ in range(3)] == [0, 1, 2]
    gen.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("trl-")]


def test_tokenizer_matches_the_tiny_model_ids():
    from batchtune.backends.models import CharTokenizer
    from batchtune.backends.trl_backend import char_tokenizer

    chars = CharTokenizer()
    tok = char_tokenizer(chars)
    assert len(tok) == chars.vocab_size
    assert tok("<bos>12+34=", add_special_tokens=False)["input_ids"] == chars.encode("12+34=")
    assert (
        tok.decode(chars.encode("ab c", add_bos=False) + [chars.eos_token_id], skip_special_tokens=True)
        == "ab c"
    )


def test_shipped_tiny_recipe_runs_one_candidate(tmp_path):
    """recipes/tiny-trl-grpo.toml as shipped, first candidate and seed (warm start cut for time)."""
    from batchtune.backends.trl_backend import TRLBackend
    from batchtune.measure.plan import plan_candidates, run_id

    recipe = load_recipe(
        shipped_recipes()["tiny-trl-grpo"], ["model.pretrain_steps=20", "budget.max_samples=128"]
    )
    plan = plan_candidates(recipe)
    cand = plan.candidates[0]
    rid = run_id(cand, recipe.budget.seeds[0])
    spec = RunSpec(rid, cand, 0, recipe, tmp_path / "runs" / rid, recipe.optimizer.lr, plan.reference_batch)
    records = list(TRLBackend().train(spec))
    assert records[-1].samples == 128 and records[0].metrics["eval_reward"] >= 0.0
