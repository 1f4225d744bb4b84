"""`batchtune recipes list | show | validate | cp`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from batchtune.cli.app import (
    JsonOpt,
    RecipeArg,
    SetOpt,
    _print_json,
    console,
    handle_errors,
    recipes_app,
)
from batchtune.records.files import atomic_write_text


@recipes_app.command("list")
@handle_errors
def recipes_list(json_out: JsonOpt = False) -> None:
    """The recipes that ship with batchtune, with the first line of each header."""
    from rich.table import Table

    from batchtune.recipe.load import is_measurements, shipped_recipes

    rows = []
    for name, path in sorted(shipped_recipes().items()):
        text = path.read_text()
        kind = "measurements" if is_measurements(text) else "recipe"
        rows.append((name, str(path), _summary(text), kind))
    if json_out:
        _print_json([{"name": n, "path": p, "summary": s, "kind": k} for n, p, s, k in rows])
        return
    table = Table(title="Shipped recipes (use the name or a path)")
    table.add_column("name")
    table.add_column("what it is for")
    for name, _, summary, kind in rows:
        if kind == "measurements":
            summary += f" [dim](a measurements file: batchtune recommend --measurements {name})[/]"
        table.add_row(name, summary)
    console.print(table)


def _summary(text: str) -> str:
    """The header's first sentence: its first comment lines, up to the first full stop or blank line."""
    words: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#") or not line.lstrip("# ").strip():
            break
        words.append(line.lstrip("# ").strip())
    head = " ".join(words)
    cut = head.find(". ")
    return head if cut < 0 else head[: cut + 1]


@recipes_app.command("show")
@handle_errors
def recipes_show(recipe: RecipeArg = None, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Print a recipe with every default filled in (after --set overrides)."""
    from batchtune.recipe.load import recipe_to_toml
    from batchtune.workflow.loading import load

    cfg = load(recipe, set_ or [], resolve=False)
    if json_out:
        _print_json({"source": cfg.source, "recipe": cfg.to_dict()})
        return
    sys.stdout.write(recipe_to_toml(cfg))


@recipes_app.command("validate")
@handle_errors
def recipes_validate(
    recipe: Annotated[str, typer.Argument(help="Recipe file or name.")], json_out: JsonOpt = False
) -> None:
    """Check a recipe: unknown keys, wrong types and bad values are reported together, and the checks a
    probe runs before its first run (task, prompts file, reward import, command placeholders)."""
    from batchtune.workflow import validate_recipe

    cfg = validate_recipe(recipe)
    if json_out:  # a bad recipe is exit 2 with its problems on stderr, as everywhere
        _print_json({"ok": True, "source": cfg.source})
        return
    console.print(f"[green]ok[/] {cfg.source}")


@recipes_app.command("cp")
@handle_errors
def recipes_cp(
    name: Annotated[str, typer.Argument(help="Shipped recipe name.")],
    dest: Annotated[Path, typer.Argument(help="Where to write the copy.")],
    json_out: JsonOpt = False,
) -> None:
    """Copy a shipped recipe to edit it."""
    from batchtune.errors import InputError
    from batchtune.recipe.load import resolve_recipe_path

    src = resolve_recipe_path(name)
    if dest.is_dir():
        dest = dest / src.name
    if dest.exists():
        raise InputError(f"{dest} exists; choose another name")
    atomic_write_text(dest, src.read_text())
    if json_out:
        _print_json({"source": str(src), "written": str(dest)})
        return
    console.print(f"wrote {dest}")
