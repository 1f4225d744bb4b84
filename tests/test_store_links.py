"""Issue 33 item 3: a symbolic link cannot make a probe write outside its results directory.

A run folder, ``runs/`` or a run's steps file replaced by a link to someone else's folder or file
(shared storage) is refused with a message naming the link; the files it points to stay as they were.
A results directory that is itself a link (a mounted volume) still works.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.errors import InputError
from batchtune.records.store import ResultsStore

RUN = "P1xG8-s0"  # the first run the NQM recipe's probe claims


def _victim(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "steps.jsonl").write_text("someone else's data\n")
    (victim / "notes.txt").write_text("keep\n")
    return victim, {p.name: p.read_bytes() for p in victim.iterdir()}


def _layouts(tmp_path: Path, victim: Path) -> dict[str, Path]:
    res = {name: tmp_path / name for name in ("runs_link", "run_link", "steps_link")}
    res["runs_link"].mkdir()
    (res["runs_link"] / "runs").symlink_to(victim)
    (res["run_link"] / "runs").mkdir(parents=True)
    (res["run_link"] / "runs" / RUN).symlink_to(victim)
    (res["steps_link"] / "runs" / RUN).mkdir(parents=True)
    (res["steps_link"] / "runs" / RUN / "steps.jsonl").symlink_to(victim / "steps.jsonl")
    return res


@pytest.mark.parametrize("layout", ["runs_link", "run_link", "steps_link"])
def test_a_link_out_of_the_results_directory_is_refused_and_nothing_outside_changes(tmp_path, layout):
    victim, before = _victim(tmp_path)
    res = _layouts(tmp_path, victim)[layout]
    out = CliRunner().invoke(app, ["probe", "nqm", "-r", str(res)])
    err = out.stderr.strip().splitlines()
    assert out.exit_code == 2, (out.exit_code, out.stderr[-400:])
    assert "leaves the results directory" in err[-1] and "symbolic link" in err[-1], err
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == before  # nothing renamed or written


def test_the_store_refuses_a_run_folder_link_before_touching_it(tmp_path):
    victim, before = _victim(tmp_path)
    store = ResultsStore(tmp_path / "res")
    store.runs_dir.mkdir(parents=True)
    store.run_dir("r1").symlink_to(victim)
    with pytest.raises(InputError, match="r1 leaves the results directory"), store.claim("r1"):
        pass
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == before


def test_a_results_directory_that_is_itself_a_link_is_fine(tmp_path):
    real = tmp_path / "volume" / "res"
    real.mkdir(parents=True)
    (tmp_path / "res").symlink_to(real)
    store = ResultsStore(tmp_path / "res")
    with store.claim("r1") as writer:
        assert writer is not None
    assert (real / "runs" / "r1" / "steps.jsonl").exists()
