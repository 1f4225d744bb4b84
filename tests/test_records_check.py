"""Issue 33 item 4: a tampered sealed run is refused in one line naming the file, never silently
reused or rerun into a different fit. Each case edits one sealed run of a finished NQM probe, then
resumes the probe (exit 2, nothing rerun, the file named)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.errors import InputError
from batchtune.records.store import ResultsStore

SETS = ["--set", "candidates.prompts=[1, 4, 16]", "--set", "budget.seeds=[0, 1]"]
RUN = "P4xG8-s1"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("probe") / "r"
    out = CliRunner().invoke(app, ["probe", "nqm", "-r", str(results), "--json", *SETS])
    assert out.exit_code == 0, out.output
    return results


def _edit_record(**changes) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        data = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**data, **changes}))

    return edit


def _edit_lines(fn: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        lines = (run / "steps.jsonl").read_text().splitlines()
        (run / "steps.jsonl").write_text("".join(x + "\n" for x in fn(lines)))

    return edit


def _negative_step(lines: list[str]) -> list[str]:
    row = json.loads(lines[2])
    return [*lines[:2], json.dumps({**row, "samples": -1}), *lines[3:]]


CASES = {
    "run_id of another folder": (_edit_record(run_id="P4xG8-s0"), "run_id 'P4xG8-s0' is not its folder"),
    "steps.jsonl deleted": (lambda run: (run / "steps.jsonl").unlink(), "steps.jsonl is missing"),
    "a duplicated line": (_edit_lines(lambda x: [*x[:5], x[4], *x[5:]]), "repeats the line before it"),
    "duplicated steps": (_edit_lines(lambda x: [*x[:5], *x[3:]]), "goes back or repeats"),
    "truncated steps": (_edit_lines(lambda x: x[: len(x) // 3]), "truncated or edited"),
    "emptied steps": (_edit_lines(lambda x: []), "truncated or edited"),
    "unknown status": (_edit_record(status="great"), "unknown status 'great'"),
    "negative samples": (_edit_record(samples=-5), "samples = -5 is negative"),
    "negative step samples": (_edit_lines(_negative_step), "negative counters"),
    "negative seconds": (_edit_record(train_s=-1.0), "train_s = -1.0 is not a time"),
    "negative staleness": (_edit_record(staleness=-1), "staleness = -1 and updates_per_batch = 1"),
    "no updates per batch": (_edit_record(updates_per_batch=0), "staleness = 0 and updates_per_batch = 0"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_sealed_run_is_refused_on_resume_and_nothing_reruns(finished: Path, tmp_path: Path, case):
    edit, message = CASES[case]
    results = tmp_path / "r"
    shutil.copytree(finished, results)
    edit(results / "runs" / RUN)
    before = sorted(p.relative_to(results) for p in results.rglob("*"))
    out = CliRunner().invoke(app, ["probe", "nqm", "-r", str(results), "--json", *SETS])
    assert out.exit_code == 2, out.output
    assert message in out.output and RUN in out.output and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1
    assert sorted(p.relative_to(results) for p in results.rglob("*") if p.name != ".lock") == [
        p for p in before if p.name != ".lock"
    ]  # nothing rerun, nothing moved aside
    with pytest.raises(InputError, match=message.split("'")[0]):
        store = ResultsStore(results)
        [store.steps(r.run_id) for r in store.runs()]


def test_a_run_whose_off_policy_label_disagrees_with_its_knobs_is_refused(finished: Path, tmp_path: Path):
    """A run.json copied into an off-policy candidate's folder (label -k1u2, knobs k = 0, u = 1)
    would be ranked as that candidate: refused, naming the file."""
    results = tmp_path / "r"
    shutil.copytree(finished, results)
    src, dest = results / "runs" / RUN, results / "runs" / "P4xG8-k1u2-s1"
    shutil.copytree(src, dest)
    data = json.loads((dest / "run.json").read_text())
    (dest / "run.json").write_text(json.dumps({**data, "run_id": dest.name, "candidate": "P4xG8-k1u2"}))
    with pytest.raises(InputError, match="'P4xG8-k1u2' disagrees with its staleness = 0"):
        ResultsStore(results).runs()


def test_the_untampered_probe_resumes_and_reads_every_run(finished: Path, tmp_path: Path):
    results = tmp_path / "r"
    shutil.copytree(finished, results)
    out = CliRunner().invoke(app, ["probe", "nqm", "-r", str(results), "--json", *SETS])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["runs_done"] == 0
    store = ResultsStore(results)
    assert all(store.steps(r.run_id)[-1].samples == r.samples for r in store.runs())


def test_an_unsealed_run_with_no_steps_file_is_not_an_error(tmp_path: Path):
    store = ResultsStore(tmp_path)
    (store.run_dir("P1xG8-s0")).mkdir(parents=True)
    assert store.steps("P1xG8-s0") == []
