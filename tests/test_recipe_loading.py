"""One recipe loader: every command gets its recipe from `workflow.loading.load` (read, overrides,
checks, probe.mode = "auto" resolved, results directory), and no other module loads or resolves one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

import batchtune
from batchtune.cli import app
from batchtune.workflow import loading

PACKAGE = Path(batchtune.__file__).parent
RAW = {"load_recipe", "resolved"}  # the raw loader and the auto resolution
HOMES = {"workflow/loading.py", "recipe/load.py", "measure/probe_size.py"}  # where they are defined/used


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            fn = node.func
            names.add(fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else "")
    return names


def test_no_module_loads_or_resolves_a_recipe_but_the_loader() -> None:
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where not in HOMES and where.split("/")[0] != "recipes":
            hits += [f"{where}: {name}" for name in sorted(_calls(path) & RAW)]
    assert hits == []


def test_the_cli_builds_no_recipe_itself() -> None:
    hits = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        hits += [f"{path.name}: {n}" for n in sorted(_calls(path) & {*RAW, "recipe_from_dict"})]
    assert hits == []


@pytest.mark.parametrize(
    "args",
    [
        ["recipes", "show", "nqm"],
        ["recipes", "validate", "nqm"],
        ["plan", "nqm", "--time-steps", "0", "--json"],
        ["probe", "nqm", "--dry-run", "--json"],
        ["tune", "nqm", "--dry-run", "--json"],
        ["recommend", "nqm"],  # no results there: refused after the recipe is loaded
    ],
)
def test_every_recipe_command_goes_through_the_loader(tmp_path, monkeypatch, args) -> None:
    seen: list[str | None] = []
    raw = loading.load_recipe

    def spy(path, overrides=None):  # type: ignore[no-untyped-def]
        seen.append(str(path))
        return raw(path, overrides)

    monkeypatch.setattr(loading, "load_recipe", spy)
    results = [] if args[0] == "recipes" else ["--results", str(tmp_path / "r")]
    result = CliRunner().invoke(app, [*args, *results])
    assert "Traceback" not in result.output and result.exit_code in (0, 2, 3), result.output
    assert seen == ["nqm"]
