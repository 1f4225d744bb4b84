"""A contended profile is timed again (bounded, with backoff) and the least contended kept.

The contention reading is injected (measure/contention.other_cores replaced by a value the test
sets) and the waits are recorded, not slept: no busy loops, no real waiting. The engine is the FAKE
one of tests/test_profile.py (computed seconds)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from batchtune.analysis.system.profile import analyse_throughput
from batchtune.backends import GENERATION_BACKENDS
from batchtune.errors import InputError
from batchtune.measure import contention, profile_retime
from batchtune.measure.profile import run_profile
from batchtune.recipe.load import load_recipe
from batchtune.records.store import ResultsStore
from batchtune.report.profile import render_profile
from tests.test_profile import FAKE_SWEEP, FakeGeneration

SWEEP = [*FAKE_SWEEP, "generation.modes=['fixed']", "generation.repeats=1", "generation.warmup=0"]


@pytest.fixture
def meter(monkeypatch):
    """Other processes' cores as the test says: ``loads[i]`` over attempt i (the last one after)."""
    monkeypatch.delenv(profile_retime.ENV, raising=False)  # the suite's conftest turns re-timing off
    monkeypatch.setitem(GENERATION_BACKENDS, "simulated", "tests.test_profile:FakeGeneration")
    monkeypatch.setattr(FakeGeneration, "calls", [])
    state = {"loads": [0.0], "attempt": 0, "waits": []}

    def other_cores(start, end=None):
        return state["loads"][min(state["attempt"], len(state["loads"]) - 1)]

    def wait(seconds):
        state["waits"].append(seconds)
        state["attempt"] += 1

    monkeypatch.setattr(contention, "other_cores", other_cores)
    monkeypatch.setattr(contention, "cpu_count", lambda: 2)
    monkeypatch.setattr(profile_retime, "_wait", wait)
    return state


def _stored(store: ResultsStore, recipe):
    points = store.throughput()
    return analyse_throughput(points, recipe, model_info=store.model_info(points[-1].profile_id))


def test_contended_then_quiet_is_timed_again_and_the_quiet_timing_kept(tmp_path, meter):
    meter["loads"] = [1.8, 0.1]
    recipe, store = load_recipe(None, SWEEP), ResultsStore(tmp_path)
    result = run_profile(recipe, store)
    assert meter["waits"] == [10.0]
    assert result.other_cores == pytest.approx(0.1) and result.contention_note is None
    assert "timed 2 times" in result.retimed and "1.8, 0.1 of 2" in result.retimed
    assert "kept timing 2" in result.retimed and result.to_dict()["retimed"] == result.retimed
    ids = list(dict.fromkeys(p.profile_id for p in store.throughput()))
    assert len(ids) == 2 and ids[-1] == result.profile_id  # both stored, the kept one last
    assert _stored(store, recipe).other_cores == pytest.approx(0.1)  # what recommend reads


def test_always_contended_stops_after_the_retries_and_keeps_the_least(tmp_path, meter):
    meter["loads"] = [1.6, 1.9, 1.2, 1.7]
    recipe, store = load_recipe(None, SWEEP), ResultsStore(tmp_path)
    result = run_profile(recipe, store)
    assert meter["waits"] == [10.0, 20.0]  # two more timings, the wait doubling
    assert result.other_cores == pytest.approx(1.2)
    assert "kept timing 3, the least contended (still contended)" in result.retimed
    assert result.contention_note is not None  # still warned: it is still contended
    assert _stored(store, recipe).other_cores == pytest.approx(1.2)
    out = Console(file=io.StringIO(), width=300)
    render_profile(out, result)
    text = out.file.getvalue()  # type: ignore[attr-defined]
    assert "Re-timed:" in text and "Contended:" in text


def test_a_quiet_profile_is_timed_once(tmp_path, meter):
    meter["loads"] = [0.2]
    result = run_profile(load_recipe(None, SWEEP), ResultsStore(tmp_path))
    assert meter["waits"] == [] and result.retimed == ""


def test_the_knob_and_the_environment_turn_it_off(tmp_path, meter, monkeypatch):
    meter["loads"] = [1.8, 0.1]
    off = load_recipe(None, [*SWEEP, "generation.retime_contended=0"])
    result = run_profile(off, ResultsStore(tmp_path / "a"))
    assert meter["waits"] == [] and "not re-timed" in result.retimed
    assert result.contention_note is not None  # it only warns, as before
    monkeypatch.setenv(profile_retime.ENV, "0")
    assert run_profile(load_recipe(None, SWEEP), ResultsStore(tmp_path / "b")).other_cores == 1.8
    assert meter["waits"] == []
    monkeypatch.setenv(profile_retime.ENV, "many")
    with pytest.raises(InputError, match="whole number"):
        profile_retime.retries(off)
