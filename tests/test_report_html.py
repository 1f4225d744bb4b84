"""`batchtune report RESULTS`: one self-contained HTML page and Markdown (NQM simulation, seconds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from batchtune.cli import app
from tests.small_nqm import NQM, SMALL, copy_of


def test_report_is_self_contained_with_plots_tables_and_recommendation(
    small_nqm: Path, tmp_path: Path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them: report.md's links must still work
    results = Path("r")
    copy_of(small_nqm, tmp_path / results)
    runner = CliRunner()
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*")}
    out = runner.invoke(app, ["report", str(results), "--out", "rep", "--json"])
    # --out elsewhere: the results directory is evidence, nothing in it is written (the time plot was)
    assert {p: p.stat().st_mtime_ns for p in results.rglob("*")} == before
    assert out.exit_code == 0, out.output
    paths = json.loads(out.stdout)
    page = Path(paths["html"]).read_text()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    # plots embedded (learning curves and the time-to-target figure), nothing fetched from elsewhere
    assert len(re.findall(r'src="data:image/png;base64,', page)) >= 2
    assert not re.search(r'(src|href)="(https?:|/|\.\.?/)', page)
    for heading in ("Recommendation", "Predicted time-to-target", "Sample efficiency", "Probe cost"):
        assert f"<h2>{heading}</h2>" in page
    assert "class='winner'" in page and "Θ (throughput) from probe timings" in page
    md = Path(paths["markdown"]).read_text()
    assert "| rank | candidate | N |" in md and "## Probe cost" in md
    assert "![time_to_target](" in md
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", md)  # relative to report.md's folder, not the cwd
    assert links and all((Path(paths["markdown"]).parent / link).is_file() for link in links), links


def test_report_without_results_is_an_input_error(tmp_path: Path):
    out = CliRunner().invoke(app, ["report", str(tmp_path / "none")])
    assert out.exit_code == 2 and "no results" in out.output


def test_tune_prints_the_sample_efficiency_table_once(tmp_path: Path):
    """tune printed it after its probe, then again at the head of the recommendation."""
    out = CliRunner().invoke(app, ["tune", NQM, "-r", str(tmp_path / "r"), *SMALL])
    assert out.exit_code == 0, out.output
    assert out.output.count("Sample efficiency: responses until") == 1
    assert ": reached the target at " in out.output and "reached_target reached" not in out.output
    assert "Predicted time-to-target" in out.output and "3/3 recommend" in out.output
