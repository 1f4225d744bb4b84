"""The published GRPO study (docs/method.md §1), shipped as recipes/hunyuan-grpo-measurements.toml."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from batchtune.analysis.decide.recommend import recommend
from batchtune.cli import app
from batchtune.integrations.measurements import (
    assess_measurements,
    load_measurements,
    throughput_from_measurements,
)
from batchtune.recipe.load import shipped_recipes

PUBLISHED = {"P1024xG8": 0.71, "P2048xG8": 1.23, "P4096xG8": 1.18, "P256xG8-fixedlr": 1.42}


def _rec():
    m = load_measurements(shipped_recipes()["hunyuan-grpo-measurements"])
    return recommend(assess_measurements(m), throughput_from_measurements(m))


def test_reproduces_published_ratios_and_winner():
    rec = _rec()
    assert rec.ranking.winner == "P1024xG8"
    ratios = {c.name: c.time_ratio for c in rec.ranking.candidates}
    for name, published in PUBLISHED.items():
        assert round(ratios[name], 2) == published, name
    # absolute hours from the reference's 11.90 h
    times = {c.name: c.time_to_target_s / 3600 for c in rec.ranking.candidates}
    assert times["P128xG8"] == pytest.approx(11.90, abs=0.01)
    assert times["P1024xG8"] == pytest.approx(8.42, abs=0.01)


def test_critical_training_batch_is_1024_prompts():
    eff = _rec().efficiency
    assert eff.critical.batch == 1024 * 8
    assert eff.critical.upper == 2048 * 8
    status = {c.label: c.status for c in eff.candidates}
    assert status["P1024xG8"] == "invariant"
    assert status["P2048xG8"] == status["P4096xG8"] == "deviates"


def test_cli_json():
    path = shipped_recipes()["hunyuan-grpo-measurements"]
    result = CliRunner().invoke(app, ["recommend", "--measurements", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rec = data["recommended"]
    assert (rec["prompts"], rec["group_size"]) == (1024, 8)
    assert rec["time_to_target_h"] == pytest.approx(8.42, abs=0.01)
    assert round(rec["time_ratio"], 2) == 0.71
    assert "lr" in rec
    assert {c["name"] for c in data["candidates"]} >= set(PUBLISHED)


def test_the_shipped_measurements_file_is_listed_as_one_and_found_by_name(tmp_path, monkeypatch):
    """`recipes list` showed it as a recipe, `plan` on it failed on unknown keys, and the README's
    `recommend --measurements recipes/hunyuan-grpo-measurements.toml` failed outside the repository."""
    monkeypatch.chdir(tmp_path)  # a user's directory: no recipes/ folder here
    runner = CliRunner()
    listed = {r["name"]: r for r in json.loads(runner.invoke(app, ["recipes", "list", "--json"]).stdout)}
    assert listed["hunyuan-grpo-measurements"]["kind"] == "measurements"
    assert listed["tiny-grpo"]["kind"] == "recipe"
    plan = runner.invoke(app, ["plan", "hunyuan-grpo-measurements"])
    assert plan.exit_code == 2 and "a measurements file" in plan.output
    assert "recommend --measurements hunyuan-grpo-measurements" in plan.output
    for name in ("hunyuan-grpo-measurements", "recipes/hunyuan-grpo-measurements.toml"):
        rec = runner.invoke(app, ["recommend", "--measurements", name, "--json"])
        assert rec.exit_code == 0, rec.output
    recipe = runner.invoke(app, ["recommend", "--measurements", "tiny-grpo"])
    assert recipe.exit_code == 2 and "is a recipe, not a measurements file" in recipe.output
    missing = runner.invoke(app, ["recommend", "--measurements", "elsewhere/hunyuan-grpo-measurements.toml"])
    assert missing.exit_code == 2 and "not found" in missing.output


def test_thin_evidence_from_a_measurements_file_names_the_files_remedies():
    """With one seed per candidate, `recommend --measurements` advised "add seeds (budget.seeds); a
    branched probe: ... (branch.search = 'all') or ... (probe.mode = 'grid')" and "the probe was too
    short or too noisy: ... probe again", settings of a recipe and a probe that a measurements file
    has neither of."""
    path = shipped_recipes()["hunyuan-grpo-measurements"]
    result = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["recommend", "--measurements", str(path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "Weak evidence:" in text
    assert "more seeds in the measurements file (a [[candidate.curve]] per seed" in text
    assert "measure them with batchtune probe" in text
    for wrong in ("budget.seeds", "branch.search", "probe.mode", "the probe was too short"):
        assert wrong not in text, wrong
