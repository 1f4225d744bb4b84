"""How a probe ends when something outside the runs goes wrong: every run failed (the runs' own
reasons, not a missing metric), or a read-only results directory (the answer, without plots)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.recipe.load import shipped_recipes

SMALL = [
    "--set",
    "candidates.prompts=[1,2,4]",
    "--set",
    "budget.seeds=[0]",
    "--set",
    "budget.max_extra_seeds=0",
]


def test_every_run_diverged_says_so_with_the_runs_reasons(tmp_path):
    out = CliRunner().invoke(
        app, ["probe", "nqm", "-r", str(tmp_path / "r"), *SMALL, "--set", "optimizer.lr=50"]
    )
    assert out.exit_code == 3, out.output
    assert "every run failed" in out.stderr and "diverged" in out.stderr
    assert "no run logged the target metric" not in out.stderr


def test_a_reference_that_never_reaches_the_target_exits_3_without_extra_seeds(tmp_path):
    """No seed of any batch reaches loss 0.01 in 8192 samples: the probe shows its table, says why
    on stderr and exits 3 (as recommend does), and spends no sequential seeds, which cannot give the
    reference (3 of 3 seeds censored) a finite R0 within budget.max_extra_seeds = 3 rounds."""
    sets = ["candidates.prompts=[1,2,4]", "target.value=0.01", "budget.max_samples=8192"]
    args = ["probe", "nqm", "-r", str(tmp_path / "r"), *(x for s in sets for x in ("--set", s))]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 3, out.output
    assert "Critical training batch: not estimated" in out.stdout
    assert "critical training batch not estimated" in out.stderr and "never reached" in out.stderr
    assert "9 run(s) done" in out.stdout and "sequential seeding" not in out.stdout
    as_json = CliRunner().invoke(app, [*args, "--json"])
    assert as_json.exit_code == 3 and json.loads(as_json.stdout)["runs_done"] == 0


def test_a_finished_probe_in_a_read_only_directory_still_answers(tmp_path, monkeypatch):
    results = str(tmp_path / "r")
    first = CliRunner().invoke(app, ["probe", "nqm", "-r", results, *SMALL, "--json"])
    assert first.exit_code == 0, first.output

    def refuse(*args, **kwargs):  # tests run as root, where chmod cannot make a directory read-only
        raise PermissionError(13, "Permission denied", f"{results}/plots/x.png")

    monkeypatch.setattr("batchtune.report.plots.plot_learning_curves", refuse)
    monkeypatch.setattr("batchtune.report.plots_time.plot_time_to_target", refuse)
    again = CliRunner().invoke(app, ["probe", "nqm", "-r", results, *SMALL])
    assert again.exit_code == 0, again.output
    assert "Critical training batch" in again.stdout
    assert "learning-curve plot not written (Permission denied" in again.stdout
    as_json = CliRunner().invoke(app, ["probe", "nqm", "-r", results, *SMALL, "--json"])
    assert json.loads(as_json.stdout)["plot"] is None and json.loads(as_json.stdout)["notes"]
    rec = CliRunner().invoke(app, ["recommend", "nqm", "-r", results, "--throughput", "probe"])
    assert rec.exit_code == 0, rec.output
    assert "time-to-target plot not written" in rec.stdout


def test_with_json_the_wait_for_runs_held_elsewhere_goes_to_stderr(capsys):
    from rich.console import Console

    from batchtune.report.progress import probe_progress

    message = "still running elsewhere: P1xG8-s0 (another batchtune process holds them; waiting)"
    with probe_progress(Console(), enabled=False) as progress:
        progress("step", {"run_id": "P1xG8-s0", "samples": 8, "max_samples": 64})
        progress("wait", {"run_ids": ["P1xG8-s0"], "message": message})
    out = capsys.readouterr()
    assert out.out == "" and message in out.err


def test_the_progress_bar_names_a_sequential_seed_round_instead_of_counting_it_as_reused():
    """After the planned runs, a round of extra seeds re-planned the bar as "runs (0 reused) 2/2"."""
    from rich.console import Console

    from batchtune.report.progress import probe_progress

    console = Console(record=True, width=120, force_terminal=False)
    with probe_progress(console) as progress:
        progress("plan", {"total": 6, "todo": 4, "max_samples": 64})
        progress("plan", {"total": 2, "todo": 2, "max_samples": 64, "phase": "extra seed 3: P1xG8, P2xG8"})
    text = console.export_text()
    assert "runs (extra seed 3: P1xG8, P2xG8)" in text and "0 reused" not in text


def test_recommend_on_a_branched_probes_results_names_the_mode_it_needs(tmp_path: Path):
    """A branched probe writes its runs under <results>/branched; `recommend` read in the recipe's
    grid mode said "no finished runs; run batchtune probe first", though the probe had run."""
    nqm, r = str(shipped_recipes()["nqm"]), str(tmp_path / "r")
    probe = CliRunner().invoke(app, ["probe", nqm, "-r", r, "--set", "probe.mode=branched", "--json"])
    assert probe.exit_code == 0, probe.output
    assert "branched" in json.loads(probe.stdout)  # its summary, told apart by type (cli/shown)
    out = CliRunner().invoke(app, ["recommend", nqm, "-r", r])
    assert out.exit_code == 2 and "--set probe.mode=branched" in out.output, out.output
    empty = CliRunner().invoke(app, ["recommend", str(shipped_recipes()["nqm"]), "-r", str(tmp_path / "e")])
    assert empty.exit_code == 2 and "run `batchtune probe` first" in empty.output, empty.output
