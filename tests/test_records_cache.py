"""The store's decoded-steps cache never serves an old version of a rewritten steps file."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from batchtune.records.store import ResultsStore
from batchtune.records.types import StepRecord

RUN = "P4xG8-s0"


def _lines(rewards: list[float]) -> str:
    rows = [StepRecord(RUN, i, 32 * i, 64 * i, 1e-3, 4, 8, 0, {"reward": r}) for i, r in enumerate(rewards)]
    return "".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in rows)


def _store(tmp_path: Path, text: str) -> tuple[ResultsStore, Path]:
    store = ResultsStore(tmp_path)
    path = store.run_dir(RUN) / "steps.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return store, path


def _rewards(store: ResultsStore) -> list[float]:
    return [s.metrics["reward"] for s in store.steps(RUN)]


def _later_tick() -> None:
    """File times advance by the kernel's clock tick (a few ms): wait for the next one."""
    start = time.time_ns()
    while time.time_ns() - start < 20_000_000:
        time.sleep(0.005)


def test_a_file_edited_in_place_to_the_same_size_and_mtime_is_read_afresh(tmp_path: Path):
    store, path = _store(tmp_path, _lines([0.1, 0.2, 0.3]))
    assert _rewards(store) == [0.1, 0.2, 0.3]
    st = path.stat()
    _later_tick()
    with open(path, "r+") as fh:  # same inode, same size, the mtime set back: only ctime tells
        fh.write(_lines([0.4, 0.5, 0.6]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert _rewards(store) == [0.4, 0.5, 0.6]


def test_a_file_replaced_by_another_of_the_same_size_and_mtime_is_read_afresh(tmp_path: Path):
    store, path = _store(tmp_path, _lines([0.1, 0.2, 0.3]))
    assert _rewards(store) == [0.1, 0.2, 0.3]
    st = path.stat()
    other = path.with_name("other.jsonl")
    other.write_text(_lines([0.7, 0.8, 0.9]))
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)  # a copy restored from elsewhere: another inode
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert _rewards(store) == [0.7, 0.8, 0.9]


def test_an_unchanged_file_is_decoded_once(tmp_path: Path):
    store, _ = _store(tmp_path, _lines([0.1, 0.2]))
    first, again = store.steps(RUN), store.steps(RUN)
    assert first == again and all(a is b for a, b in zip(first, again, strict=True))
