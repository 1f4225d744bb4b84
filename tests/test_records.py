"""The results store: atomic, append-only, resumable, safe with two processes."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp

import pytest

from batchtune.errors import InputError
from batchtune.records.files import read_jsonl
from batchtune.records.store import ResultsStore
from batchtune.records.types import RunRecord, StepRecord, ThroughputPoint


def _step(i: int, run_id: str = "P4xG8-s0") -> StepRecord:
    return StepRecord(
        run_id,
        i,
        samples=32 * i,
        tokens=320 * i,
        lr=1e-3,
        prompts=4,
        group_size=8,
        seed=0,
        metrics={"reward": 0.1 * i, "nanny": float("nan")},
        grad_norm=1.0 / (i + 1),
    )


def _record(run_id: str = "P4xG8-s0", status: str = "reached_target", samples: int = 64) -> RunRecord:
    """A sealed run ending at ``samples``: where its last step (``_step``) is, as a probe seals it."""
    steps = samples // 32
    return RunRecord(run_id, "P4xG8", 4, 8, 0, 1e-3, "sqrt", 1e-3, 32, status, steps=steps, samples=samples)


def test_round_trip_and_nan(tmp_path):
    store = ResultsStore(tmp_path)
    with store.claim("P4xG8-s0") as w:
        for i in range(3):
            w.append(_step(i))
        w.finish(_record())
    steps = store.steps("P4xG8-s0")
    assert [s.step for s in steps] == [0, 1, 2]
    assert steps[2].metrics["reward"] == pytest.approx(0.2)
    assert steps[0].metrics["nanny"] != steps[0].metrics["nanny"]  # NaN survives as NaN
    for line in (tmp_path / "runs/P4xG8-s0/steps.jsonl").read_text().splitlines():
        json.loads(line)  # standard JSON, no bare NaN
    (rec,) = store.runs()
    assert rec.batch_responses == 32 and rec.finished_at > 0


def test_steps_read_while_a_run_grows_see_every_new_step(tmp_path):
    """Decoded steps are cached per version of the file: a growing (or redone) run is read afresh."""
    store = ResultsStore(tmp_path)
    with store.claim("P4xG8-s0") as w:
        w.append(_step(0))
        w.append(_step(1))
        assert [s.step for s in store.steps("P4xG8-s0")] == [0, 1]
        w.append(_step(2))
        assert [s.step for s in store.steps("P4xG8-s0")] == [0, 1, 2]
        w.finish(_record())
    again = store.steps("P4xG8-s0")
    assert [s.step for s in again] == [0, 1, 2]
    again.clear()  # callers get their own list, not the cache
    assert len(store.steps("P4xG8-s0")) == 3
    assert store.steps("no-such-run") == []


def test_one_run_and_runs_by_id_prefix(tmp_path):
    store = ResultsStore(tmp_path)
    assert store.run("P4xG8-s0") is None and store.runs("P4") == []
    for rid in ("P4xG8-s0", "P4xG8-s1", "P4xG8-s10"):
        store.add_finished_run(_record(rid, samples=0), [_step(0, rid)])
    with store.claim("P4xG8-s2") as w:  # unfinished: no record yet
        w.append(_step(0, "P4xG8-s2"))
        assert store.run("P4xG8-s2") is None
    rec = store.run("P4xG8-s1")
    assert rec is not None and rec.run_id == "P4xG8-s1"
    assert [r.run_id for r in store.runs("P4xG8-s1")] == ["P4xG8-s1", "P4xG8-s10"]
    assert len(store.runs()) == 3


def test_finished_run_is_never_reclaimed(tmp_path):
    store = ResultsStore(tmp_path)
    assert store.add_finished_run(_record(samples=0), [_step(0)])
    assert not store.add_finished_run(_record(samples=32), [_step(0), _step(1)])
    assert len(store.steps("P4xG8-s0")) == 1


def test_unfinished_run_is_redone_and_stale_steps_kept(tmp_path):
    store = ResultsStore(tmp_path)
    with store.claim("P4xG8-s0") as w:
        w.append(_step(0))
        w.append(_step(1))
        # crash: no finish()
    assert not store.is_finished("P4xG8-s0")
    with store.claim("P4xG8-s0") as w:
        assert w is not None
        w.append(_step(0))
        w.finish(_record(samples=0))
    assert len(store.steps("P4xG8-s0")) == 1
    stale = list((tmp_path / "runs/P4xG8-s0").glob("steps.stale-*.jsonl"))
    assert len(stale) == 1 and len(stale[0].read_text().splitlines()) == 2


def test_torn_last_line_is_ignored_but_corruption_is_an_error(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"a": 2')
    assert read_jsonl(path) == [{"a": 1}]
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(InputError, match="x.jsonl:2"):
        read_jsonl(path)


def _hold_and_report(root, ready, release, out):
    store = ResultsStore(root)
    with store.claim("P4xG8-s0") as w:
        out.put(w is not None)
        ready.set()
        release.wait(10)


def test_two_processes_never_write_one_run(tmp_path):
    ctx = mp.get_context("spawn")
    ready, release, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_hold_and_report, args=(str(tmp_path), ready, release, out))
    proc.start()
    assert ready.wait(30)
    assert out.get(timeout=10) is True
    with ResultsStore(tmp_path).claim("P4xG8-s0") as w:
        assert w is None  # held by the other process
    release.set()
    proc.join(30)
    with ResultsStore(tmp_path).claim("P4xG8-s0") as w:
        assert w is not None


def _append_points(root, k):
    store = ResultsStore(root)
    for i in range(50):
        store.append_throughput([ThroughputPoint("generation", "x", "fixed", i, profile_id=str(k))])


def test_concurrent_throughput_appends_stay_whole(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append_points, args=(str(tmp_path), k)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    points = ResultsStore(tmp_path).throughput()
    assert len(points) == 150


def test_missing_field_is_a_clear_error(tmp_path):
    (tmp_path / "runs/x").mkdir(parents=True)
    (tmp_path / "runs/x/run.json").write_text('{"run_id": "x"}')
    with pytest.raises(InputError, match="record lacks"):
        ResultsStore(tmp_path).runs()


@pytest.mark.parametrize("label", ["P8xG8", "P4xG4-fixedlr", "B64"])
def test_a_label_that_disagrees_with_its_batch_is_refused(tmp_path, label):
    store = ResultsStore(tmp_path)
    with store.claim("P4xG8-s0") as w:
        w.finish(_record())
    path = tmp_path / "runs/P4xG8-s0/run.json"
    path.write_text(path.read_text().replace('"candidate": "P4xG8"', f'"candidate": "{label}"'))
    with pytest.raises(InputError, match=f"{path}: candidate '{label}' disagrees with its prompts = 4"):
        store.runs()


@pytest.mark.parametrize("label", ["P4xG8-fixedlr", "B32", "my-run"])
def test_labels_that_agree_or_are_an_imports_own_name_pass(tmp_path, label):
    store = ResultsStore(tmp_path)
    with store.claim("P4xG8-s0") as w:
        w.finish(_record())
    path = tmp_path / "runs/P4xG8-s0/run.json"
    path.write_text(path.read_text().replace('"candidate": "P4xG8"', f'"candidate": "{label}"'))
    assert store.runs()[0].candidate == label


def test_imported_is_the_one_test_of_a_runs_source():
    """Whether a run came from a log or the probe was `source != "probe"`, written apart in each
    module that asked (assess, candidates, recommend, advice, ...). It is RunRecord.imported (and an
    imported run's, before it is stored); no other module compares a source with "probe"."""
    import re
    from pathlib import Path

    from batchtune.integrations.common import ImportedRun

    assert not _record().imported and dataclasses.replace(_record(), source="run.jsonl").imported
    assert ImportedRun("a", "P4xG8", 4, 8, 0, 1e-3, (), "run.jsonl").imported
    pattern = re.compile(r"""source\s*[!=]=\s*["']probe["']""")
    root = Path(__file__).resolve().parents[1] / "batchtune"
    home = root / "records" / "types.py"
    found = [str(p) for p in root.rglob("*.py") if p != home and pattern.search(p.read_text())]
    assert not found, f"use RunRecord.imported, not a comparison of its source with 'probe', in {found}"
