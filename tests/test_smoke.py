"""Smoke mode works end to end (the figures are benchmarks/smoke_times.py's job, not a test's)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from batchtune import workflow_ci
from batchtune.cli import app


def test_smoke_nqm_runs_every_stage_and_says_what_it_shrank(tmp_path):
    res = workflow_ci.smoke("nqm", [], str(tmp_path / "r"))
    assert res.ok
    assert [s.name for s in res.stages] == ["probe", "profile-gen", "recommend"]
    assert {s.status for s in res.stages[:2]} == {"ok"}
    assert any(r.startswith("seeds:") for r in res.reduced) and any(
        r.startswith("batches:") for r in res.reduced
    )
    assert (tmp_path / "r" / "runs").is_dir()


def test_smoke_cli_leaves_no_results_behind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(app, ["smoke", "nqm"])
    assert out.exit_code == 0, out.output
    assert "reduced for smoke" in out.output and "probe" in out.output
    assert not any(tmp_path.iterdir())


@pytest.mark.slow  # a tiny Llama warm start and two GRPO runs (~3-8 s on 2 cores)
def test_smoke_tiny_grpo(tmp_path):
    res = workflow_ci.smoke("tiny-grpo", [], str(tmp_path / "r"))
    assert res.ok and res.stages[0].status == "ok"
