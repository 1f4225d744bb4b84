"""Where Θ comes from: probe runs record how many runs shared the machine, and `recommend
--throughput probe` names contended timings in its source and a note (NQM simulation, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.analysis.decide.recommend import contention_note
from batchtune.cli import app
from batchtune.records.store import ResultsStore
from tests.small_nqm import NQM, SMALL, copy_of


def test_contention_note_names_shared_and_alone():
    assert contention_note({"A": 1, "B": 1}) == ""
    assert contention_note({}) == "" and contention_note({"A": 0}) == ""  # unknown: imported runs
    note = contention_note({"P1": 1, "P4": 2, "P16": 2})
    assert "P4, P16 were timed sharing the machine (2 runs at a time), P1 alone" in note
    assert "profile-gen" in note and "run.workers = 1" in note
    # a pre-training run's step is not what profile-gen times: only the probe can retime it
    pretrain = contention_note({"B16": 1, "B64": 2}, profile=False)
    assert "profile-gen" not in pretrain and pretrain.endswith("probe with run.workers = 1")


def _recommend(results: Path) -> dict:
    out = CliRunner().invoke(app, ["recommend", "-r", str(results), "--throughput", "probe", "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


@pytest.mark.slow  # ~20 s: two spawned worker processes
def test_parallel_probe_records_concurrency_and_recommend_flags_it(tmp_path: Path):
    results = tmp_path / "r"
    args = ["probe", NQM, "-r", str(results), *SMALL, "--workers", "2", "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    runs = ResultsStore(results).runs()
    by = {r.run_id: r.parallel_runs for r in runs}
    assert by["P1xG8-s0"] == 2 == by["P1xG8-s1"]  # the two reference seeds ran side by side
    assert all(r.cpu_cores >= 1 for r in runs)
    data = _recommend(results)
    assert data["throughput_source"] == "probe timings (simulated), contended"
    assert any("sharing the machine (2 runs at a time)" in n for n in data["notes"])


def test_serial_probe_says_alone(small_nqm: Path, tmp_path: Path):
    results = copy_of(small_nqm, tmp_path / "r")
    data = _recommend(results)
    assert data["throughput_source"] == "probe timings (simulated), each run alone"
    assert not any("sharing the machine" in n for n in data["notes"])


def test_contended_records_flag_the_ranking(small_nqm: Path, tmp_path: Path):
    results = copy_of(small_nqm, tmp_path / "r")
    for path in results.glob("runs/*/run.json"):  # as if the non-reference runs had shared cores
        data = json.loads(path.read_text())
        data["parallel_runs"] = 1 if data["candidate"] == "P1xG8" else 2
        path.write_text(json.dumps(data))
    data = _recommend(results)
    assert data["throughput_source"] == "probe timings (simulated), contended"
    note = next(n for n in data["notes"] if "sharing the machine" in n)
    assert "P4xG8" in note and "P16xG8" in note and "P1xG8 alone" in note


def test_recommend_writes_the_time_to_target_plot(small_nqm: Path, tmp_path: Path):
    results = copy_of(small_nqm, tmp_path / "r")
    assert not (results / "plots" / "time_to_target.png").exists()
    data = _recommend(results)
    note = next(n for n in data["notes"] if n.startswith("time-to-target plot: "))
    path = Path(note.removeprefix("time-to-target plot: "))
    assert path == results / "plots" / "time_to_target.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_nqm_probe_cost_says_its_step_times_are_simulated(small_nqm: Path, tmp_path: Path):
    """The NQM probe's cost line gave "~4.0 min at the probe's step time" for computed seconds."""
    results = str(copy_of(small_nqm, tmp_path / "r"))  # the finished probe prints its cost again
    out = CliRunner().invoke(app, ["probe", NQM, "-r", results, *SMALL], env={"COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    assert "at the probe's simulated step time" in out.output


def test_recommend_from_nqm_probe_timings_says_they_are_simulated(small_nqm: Path, tmp_path: Path):
    """recommend --throughput probe on an NQM probe printed '~0.8 s' for computed seconds."""
    r = str(copy_of(small_nqm, tmp_path / "r"))
    out = CliRunner().invoke(app, ["recommend", "-r", r, "--throughput", "probe"], env={"COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    assert "probe timings (simulated)" in out.output and "(simulated): the probe cost" in out.output
