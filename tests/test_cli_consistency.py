"""CLI edges a first-hour user hits: one exit code per kind of error."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from batchtune.cli import app


@pytest.mark.slow  # ~5 s: builds the default model's shape first
def test_unknown_hardware_is_an_input_error():
    out = CliRunner().invoke(app, ["profile-gen", "--roofline-only", "--hardware", "H100"])
    assert out.exit_code == 2, out.output
    assert "unknown hardware 'H100'" in out.output and "H100-SXM" in out.output


def test_recipes_list_json():
    import json

    out = CliRunner().invoke(app, ["recipes", "list", "--json"])
    assert out.exit_code == 0, out.output
    names = {r["name"] for r in json.loads(out.stdout)}
    assert {"tiny-grpo", "nqm"} <= names


def _commands() -> list[list[str]]:
    import typer

    group = typer.main.get_command(app)
    out = []
    for name, cmd in group.commands.items():
        subs = getattr(cmd, "commands", None)
        out += [[name, sub] for sub in subs] if subs else [[name]]
    return out


RECIPE_DRIVEN = {"probe", "plan", "profile-gen", "tune", "smoke", "recommend", "import-logs", "pretrain"}
NO_JSON: set[tuple[str, ...]] = set()


def test_every_command_has_help_json_and_set_and_reads_as_written():
    commands = _commands()
    assert {c[0] for c in commands} >= RECIPE_DRIVEN | {"check", "report", "recipes"}
    for cmd in commands:
        out = CliRunner().invoke(app, [*cmd, "--help"], env={"COLUMNS": "100"})
        assert out.exit_code == 0, (cmd, out.output)
        text = out.output
        assert "<bool>" not in text and "<list" not in text and "<str>" not in text, (cmd, text)
        if tuple(cmd) not in NO_JSON:
            assert "--json" in text, cmd
        if cmd[0] in RECIPE_DRIVEN:
            assert "--set" in text and "KEY=VALUE" in text, cmd


def test_recipes_show_validate_cp_json(tmp_path):
    import json

    show = CliRunner().invoke(app, ["recipes", "show", "nqm", "--json"])
    assert show.exit_code == 0 and json.loads(show.stdout)["recipe"]["backend"]["training"] == "nqm"
    valid = CliRunner().invoke(app, ["recipes", "validate", "nqm", "--json"])
    assert valid.exit_code == 0 and json.loads(valid.stdout)["ok"] is True
    cp = CliRunner().invoke(app, ["recipes", "cp", "nqm", str(tmp_path), "--json"])
    assert cp.exit_code == 0 and (tmp_path / "nqm.toml").is_file() and json.loads(cp.stdout)["written"]


def test_help_paragraphs_are_not_wrapped_at_the_docstring_line_breaks():
    out = CliRunner().invoke(app, ["probe", "--help"], env={"COLUMNS": "200"})
    # the docstring breaks after "at its"; at 200 columns the sentence must run on
    assert "stopping each run at the target, at its sample budget" in out.output


def test_import_logs_set_goes_into_the_stored_recipe(tmp_path):
    import json

    log = tmp_path / "run.jsonl"
    log.write_text(
        "".join(json.dumps({"step": i, "samples": 16 * i, "reward": 0.1 * i}) + "\n" for i in range(1, 6))
    )
    res = tmp_path / "res"
    base = ["import-logs", str(log), "-r", str(res), "--prompts", "2", "--group-size", "8", "--lr", "1e-3"]
    out = CliRunner().invoke(
        app, [*base, "--metric", "reward", "--set", "target.tolerance=0.2", "--set", "target.value=0.3"]
    )
    assert out.exit_code == 0, out.output
    stored = json.loads((res / "manifest.json").read_text())["recipe"]["target"]
    assert stored["tolerance"] == 0.2 and stored["value"] == 0.3
    bad = CliRunner().invoke(app, [*base, "-r", str(tmp_path / "r2"), "--set", "target.tolerance=inf"])
    assert bad.exit_code == 2 and "target.tolerance" in bad.stderr


def test_pretrain_set_takes_its_keys_and_refuses_the_rest(tmp_path):
    log = tmp_path / "missing.csv"  # the --set checks come before any file is read
    runner = CliRunner()
    other = runner.invoke(app, ["pretrain", str(log), "--set", "budget.seeds=[0]"])
    assert other.exit_code == 2 and "pretrain reads logs, not a recipe" in other.stderr
    both = runner.invoke(app, ["pretrain", str(log), "--rule", "linear", "--set", "lr_scaling.rule=sqrt"])
    assert both.exit_code == 2 and "give each value once" in both.stderr
    wrong = runner.invoke(app, ["pretrain", str(log), "--set", "lr_scaling.rule=cubic"])
    assert wrong.exit_code == 2 and "lr_scaling.rule" in wrong.stderr
