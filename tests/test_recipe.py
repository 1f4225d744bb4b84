"""Recipes: one schema, defaults, overrides, and every problem reported together."""

from __future__ import annotations

import pytest

from batchtune.analysis.sample.lr import adam_sde_hparams, scaled_lr, warmup_factor
from batchtune.errors import RecipeError
from batchtune.measure.plan import plan_candidates
from batchtune.recipe.load import load_recipe, recipe_to_toml, shipped_recipes
from batchtune.recipe.schema import Recipe


def test_defaults_and_overrides():
    r = load_recipe(None, ["optimizer.lr=3e-4", "candidates.prompts=[2, 4]", "task.name=copy"])
    assert r.optimizer.lr == 3e-4
    assert r.candidates.prompts == [2, 4]
    assert r.task.name == "copy"  # a bare word is a string
    assert r.algorithm.name == Recipe().algorithm.name


def test_unknown_keys_and_wrong_types_reported_together(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[optimizer]\nlrr = 1\n[target]\nvalue = "high"\n[algorithm]\nname = "dpo"\n')
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    msg = str(exc.value)
    assert "3 problem(s)" in msg
    assert "optimizer.lrr: unknown key" in msg
    assert "target.value: expected a number" in msg
    assert "algorithm.name: 'dpo' is not one of" in msg


def test_int_accepted_as_float_but_not_bool():
    assert load_recipe(None, ["optimizer.lr=1"]).optimizer.lr == 1.0
    with pytest.raises(RecipeError, match="expected a number"):
        load_recipe(None, ["optimizer.lr=true"])


def test_invalid_toml_and_missing_file(tmp_path):
    bad = tmp_path / "x.toml"
    bad.write_text("[run\n")
    with pytest.raises(RecipeError, match="not valid TOML"):
        load_recipe(bad)
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(tmp_path / "missing.toml")
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        load_recipe(None, ["optimizer.lr"])


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("generation.temperature=0", "temperature"),
        ("algorithm.mini_batches=0", "mini_batches"),
        ("candidates.group_sweep_sizes=[0, 8]", "group_sweep_sizes"),
        ("candidates.fixed_lr_prompts=[0]", "fixed_lr_prompts"),
        ("algorithm.critic_lr_rule=table", "critic_lr_rule"),
    ],
)
def test_values_that_would_crash_a_backend_are_rejected(override, fragment):
    with pytest.raises(RecipeError, match=fragment):
        load_recipe(None, [override, "candidates.group_sweep_total=64"])


def test_semantic_validation():
    with pytest.raises(RecipeError, match="GRPO needs at least 2"):
        load_recipe(None, ["candidates.group_size=1"])
    with pytest.raises(RecipeError, match="divide group_sweep_total"):
        load_recipe(None, ["candidates.group_sweep_total=32", "candidates.group_sweep_sizes=[3]"])


def test_every_shipped_recipe_loads():
    recipes = shipped_recipes()
    assert recipes, "recipes/ should ship with the package"
    for name, path in recipes.items():
        if name.endswith("measurements"):
            continue
        cfg = load_recipe(path)
        assert cfg.source == str(path)
        header = path.read_text().splitlines()[0]
        assert header.startswith("#"), f"{name} needs a header comment"
        assert "batchtune " in path.read_text(), f"{name} header should show the command to run it"


def test_toml_round_trip(tmp_path):
    r = load_recipe(None, ["lr_scaling.rule=table", 'lr_scaling.table={"64" = 1e-3, "128" = 2e-3}'])
    path = tmp_path / "full.toml"
    path.write_text(recipe_to_toml(r))
    assert load_recipe(path).to_dict() == r.to_dict()


@pytest.mark.parametrize(("rule", "expected"), [("sqrt", 2e-3), ("linear", 4e-3), ("none", 1e-3)])
def test_lr_rules(rule, expected):
    assert scaled_lr(1e-3, 256, 64, rule) == pytest.approx(expected)


def test_lr_table_and_errors():
    assert scaled_lr(1e-3, 128, 64, "table", {128: 5e-4}) == 5e-4
    with pytest.raises(RecipeError, match="no entry for batch 256"):
        scaled_lr(1e-3, 256, 64, "table", {128: 5e-4})
    with pytest.raises(RecipeError, match="unknown LR scaling rule"):
        scaled_lr(1e-3, 256, 64, "cubic")


def test_adam_sde_and_warmup():
    h = adam_sde_hparams(0.9, 0.999, 1e-8, 4.0)
    assert h.beta1 == pytest.approx(0.6)
    assert h.beta2 == pytest.approx(0.996)
    assert h.eps == pytest.approx(5e-9)
    assert warmup_factor(50, 100) == 0.5
    assert warmup_factor(500, 100) == 1.0
    assert warmup_factor(0, 0) == 1.0


def test_plan_scales_lr_by_total_responses():
    r = load_recipe(
        None,
        [
            "candidates.prompts=[4, 16]",
            "candidates.group_size=8",
            "candidates.group_sweep_total=64",
            "candidates.group_sweep_sizes=[4, 16]",
            "candidates.fixed_lr_prompts=[16]",
            "optimizer.lr=1e-3",
        ],
    )
    plan = plan_candidates(r)
    by = plan.by_label()
    assert plan.reference == "P4xG8" and plan.reference_batch == 32
    assert by["P16xG8"].lr == pytest.approx(2e-3)  # sqrt(128/32)
    assert by["P16xG4"].lr == by["P4xG16"].lr == pytest.approx(1e-3 * 2**0.5)  # same N = 64
    assert by["P16xG8-fixedlr"].lr == 1e-3 and by["P16xG8-fixedlr"].lr_rule == "none"
    assert plan.group_sweep == ("P16xG4", "P4xG16")


def test_plan_ppo_critic_has_own_rule():
    r = load_recipe(
        None,
        [
            "algorithm.name=ppo",
            "algorithm.critic_lr=1e-2",
            "algorithm.critic_lr_rule=none",
            "candidates.prompts=[2, 8]",
        ],
    )
    by = plan_candidates(r).by_label()
    assert by["P8xG8"].critic_lr == 1e-2
    assert by["P8xG8"].lr == pytest.approx(2 * r.optimizer.lr)
