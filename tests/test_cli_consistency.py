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
