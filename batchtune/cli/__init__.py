"""The `batchtune` command line: parse, call one workflow function, render (docs/architecture.md).

`app.py` holds the typer app, the shared options and the error funnel; the commands live in
`measuring.py`, `results.py` and `recipes.py` and register themselves on import, in the order
`--help` lists them; `shown.py` draws what the measuring commands' workflow calls return.
"""

from batchtune.cli import measuring, recipes, results  # noqa: F401  (registers the commands)
from batchtune.cli.app import app


def main() -> None:
    app()


__all__ = ["app", "main"]
