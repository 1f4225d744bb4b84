"""The branched probe of a pre-training recipe (probe.mode = "branched", backend.training =
"pretrain"): token batches, the eval loss against the lowest target, tokens throughout, and the
commands that cannot apply to pre-training refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.errors import InputError, RecipeError
from batchtune.measure.branched import branched_recipe, branched_store, run_branched_probe
from batchtune.measure.plan import plan_candidates
from batchtune.measure.probe import check_manifest
from batchtune.recipe.load import load_recipe, shipped_recipes
from batchtune.records.store import ResultsStore

BRANCHED = str(shipped_recipes()["tiny-pretrain-branched"])
GRID = str(shipped_recipes()["tiny-pretrain"])
# a probe of seconds: sequences of 8 tokens, three batches, a trunk of 512 tokens, windows of 128
SMALL = [
    "pretrain.seq_len=8",
    "pretrain.batches_tokens=[8, 16, 32]",
    "lr_scaling.reference_batch=8",
    "pretrain.max_tokens=2048",
    "pretrain.eval_every_tokens=32",
    "pretrain.eval_sequences=16",
    "pretrain.warmup_tokens=0",
    "pretrain.targets=[3.0]",
    "branch.trunk_samples=512",
    "branch.checkpoints=[0.5, 1.0]",
    "branch.window_samples=128",
    "branch.min_steps=2",
    "budget.seeds=[0, 1]",
    "branch.confirm_seeds=2",
    "branch.max_seeds=2",
]


def test_the_candidates_of_a_pretraining_recipe_are_its_token_batches():
    plan = plan_candidates(load_recipe(BRANCHED))
    assert plan.main == ("B16", "B32", "B48", "B64", "B96", "B128", "B192", "B256", "B512")
    assert plan.reference == "B16" and plan.reference_batch == 32  # the LR belongs to 32 tokens
    by = plan.by_label()
    assert (by["B48"].prompts, by["B48"].group_size, by["B48"].batch_responses) == (3, 16, 48)
    assert by["B128"].lr == pytest.approx(2e-3 * 2)  # sqrt(128 / 32)
    assert plan.group_sweep == () and plan.fixed_lr == ()


def test_the_branched_view_compares_the_eval_loss_against_the_lowest_target():
    cfg = load_recipe(BRANCHED, ["pretrain.targets=[2.2, 1.9]", "target.tolerance=0.2"])
    view = branched_recipe(cfg)
    assert (view.target.metric, view.target.value, view.target.higher_is_better) == ("eval_loss", 1.9, False)
    assert view.target.tolerance == 0.2 and view.budget.max_samples == cfg.pretrain.max_tokens
    rl = load_recipe("recipes/nqm.toml")
    assert branched_recipe(rl) is rl


def test_a_branched_pretraining_recipe_is_checked_for_a_target_and_room_for_its_branches():
    with pytest.raises(RecipeError, match="pretrain.targets: a branched probe needs a target loss"):
        load_recipe(BRANCHED, ["pretrain.targets=[]"])
    # trunk 16,384 + 2 windows of 4,096 + one step of 512 = 25,088 tokens
    with pytest.raises(RecipeError, match="pretrain.max_tokens: 20,000 is short .* at least 25,088"):
        load_recipe(BRANCHED, ["pretrain.max_tokens=20000"])
    load_recipe(BRANCHED, ["pretrain.max_tokens=25088"])
    with pytest.raises(RecipeError, match="pretrain.batches_tokens"):  # one line, not a traceback
        load_recipe(BRANCHED, ["pretrain.batches_tokens=[]"])


def test_a_changed_pretraining_setting_is_not_resumed_into_old_runs(tmp_path: Path):
    """The manifest ignored the pretrain section: a new seq_len or model size reused the old runs
    (and a branched probe's checkpoints, which no longer fit the model)."""
    store = ResultsStore(tmp_path / "r")
    check_manifest(store, load_recipe(BRANCHED))
    fewer = load_recipe(BRANCHED, ["pretrain.batches_tokens=[16, 32, 64]"])
    check_manifest(store, fewer)  # fewer batches: the same runs, fine
    for change in ("pretrain.seq_len=8", "pretrain.size=s", "pretrain.markov_vocab=32"):
        with pytest.raises(InputError, match=change.split("=")[0]):
            check_manifest(store, load_recipe(BRANCHED, [change]))


def test_tune_and_recommend_of_a_pretraining_grid_or_with_an_rl_emitter_are_refused(tmp_path: Path):
    """tune of the pre-training grid ran the RL probe on it and failed on 'eval_reward'; --emit verl
    wrote a verl config for a pre-training batch; a pre-training framework for an RL recipe."""
    for dry in ([], ["--dry-run"]):  # a dry run's "Run it" would be refused too
        grid = CliRunner().invoke(app, ["tune", GRID, "-r", str(tmp_path / "g"), *dry])
        assert grid.exit_code == 2 and "needs probe.mode = 'branched'" in grid.output
        assert not (tmp_path / "g").exists()
    emit = CliRunner().invoke(app, ["tune", BRANCHED, "-r", str(tmp_path / "b"), "--emit", "verl"])
    assert emit.exit_code == 2 and "--emit verl writes an RL trainer's config" in emit.output
    assert not (tmp_path / "b").exists()
    rl = CliRunner().invoke(app, ["tune", "nqm", "-r", str(tmp_path / "n"), "--emit", "megatron"])
    assert rl.exit_code == 2 and "--emit megatron is a pre-training framework" in rl.output
    assert not (tmp_path / "n").exists()


@pytest.mark.slow  # builds the tiny Llama for a few dozen short runs: ~20-60 s on 2 cores
def test_a_branched_pretraining_probe_runs_in_tokens_resumes_and_ranks(tmp_path: Path):
    cfg = load_recipe(BRANCHED, [*SMALL, f"run.results_dir={tmp_path / 'r'}"])
    first = run_branched_probe(cfg)
    store = branched_store(cfg.run.results_dir)
    trunk = store.run("trunk-B8-s0")
    assert trunk is not None and trunk.samples >= 512 and trunk.batch_responses == 8
    batches = {r.batch_responses for r in store.runs()}
    assert batches <= {8, 16, 32} and batches - {8}, batches  # token batches, and branches past the trunk
    assert all(s.samples % 8 == 0 for r in store.runs() for s in store.steps(r.run_id))
    eff = first.summary.efficiency
    assert eff.unit == "tokens" and eff.metric == "eval_loss" and eff.target == 3.0
    assert {lc.checkpoint_samples for lc in first.summary.locals} <= {256, 512}
    again = run_branched_probe(cfg)  # every run is sealed: nothing is redone, the answer is the same
    assert again.runs_done == 0 and again.runs_skipped == first.runs_done
    assert [c.estimate for c in again.efficiency.candidates] == [c.estimate for c in eff.candidates]

    sets = [arg for s in SMALL for arg in ("--set", s)]
    out = CliRunner().invoke(app, ["recommend", BRANCHED, "-r", str(tmp_path / "r"), "--json", *sets])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    ranked = {c["name"]: c["rank"] for c in data["candidates"] if c["rank"] is not None}
    assert data["unit"] == "tokens" and ranked[data["recommended"]["name"]] == 1
    assert data["throughput_source"].startswith("probe timings")
    # what a user reads is in tokens and sequences, not responses or prompts
    cmd = ["recommend", BRANCHED, "-r", str(tmp_path / "r"), *sets]
    text = CliRunner().invoke(app, cmd, env={"COLUMNS": "300"})
    assert text.exit_code == 0, text.output
    assert "tokens until eval_loss <= 3" in text.output and "seqs x len" in text.output
    assert "sequences x 8 tokens" in text.output and "tok/s" in text.output
    assert "responses" not in text.output and "prompts" not in text.output
    # check reads RL trainer configs: a pre-training probe's evidence is refused, not misread
    verl = str(Path(__file__).parents[2] / "examples" / "ci" / "verl" / "ppo_trainer.yaml")
    check = CliRunner().invoke(app, ["check", verl, "--results", str(tmp_path / "r")])
    assert check.exit_code == 2 and "holds a pre-training probe" in check.output, check.output
    # the pick for a pre-training framework, in its own units (sequences of seq_len tokens)
    cmd = ["recommend", BRANCHED, "-r", str(tmp_path / "r"), "--emit", "megatron", "--gpus", "1", *sets]
    megatron = CliRunner().invoke(app, cmd)
    assert megatron.exit_code == 0, megatron.output
    assert "--seq-length 8" in megatron.output and "--step-batch-size-schedule" in megatron.output
    flags = tmp_path / "megatron.txt"  # --out: the flags and stage table, as printed
    written = CliRunner().invoke(app, [*cmd, "--out", str(flags)])
    assert written.exit_code == 0, written.output
    assert "--step-batch-size-schedule" in flags.read_text()
