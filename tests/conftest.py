"""Test-suite settings shared by every test (and by the CLI subprocesses tests start), and a report
of the default tests that take longer than they should.

The default suite (``-m 'not slow'``) must stay under 5 minutes on 2 shared cores, so a test that is
not marked slow should take well under 10 s. Wall time on a shared machine says as much about the
other jobs as about the test, so each phase is also charged the CPU seconds it used: this process's
(every thread) plus those of the child processes it waited for (the CLI subprocesses and the
trainers). A test over 10 s of wall whose CPU is small was slowed by load; one whose CPU is large is
slow itself. This is a report, never a failure: a timed test flakes on a loaded machine.

``BATCHTUNE_TEST_TIMES=path`` also writes every phase as one JSON line (nodeid, phase, wall_s, cpu_s),
to compare two runs of the suite by CPU rather than by wall.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest


def _cache_click_commands() -> None:
    """Build each typer app's click command once, not on every ``CliRunner().invoke``.

    typer rebuilds the whole command tree on each invoke, and with postponed annotations that means
    evaluating every option's type hints again: ~40 ms of CPU an invoke here, for the ~45 test files
    that call the CLI in process (~5 s of test_malformed_inputs.py's ~10 s). The real CLI builds it
    once per process (``app()``), so one build reused is what a user's process does too. The key
    includes the app's registrations, so an app that gains a command is built again.
    """
    import typer.main
    import typer.testing

    build = typer.main.get_command
    built: dict[tuple[int, int, int, int], tuple[Any, Any]] = {}

    def cached(app: Any) -> Any:
        key = (id(app), len(app.registered_commands), len(app.registered_groups), id(app.registered_callback))
        hit = built.get(key)
        if hit is None or hit[0] is not app:
            hit = built[key] = (app, build(app))
        return hit[1]

    typer.testing._get_command = cached  # type: ignore[attr-defined]


_cache_click_commands()

# the suite runs on shared machines, where nearly every throughput profile reads contended: time
# each profile once (tests of the re-timing itself unset this; measure/profile_retime.py)
os.environ.setdefault("BATCHTUNE_RETIME_CONTENDED", "0")

LIMIT_S = 10.0  # a default test over this (setup + call + teardown) is listed at the end
_TIMES: dict[str, dict[str, float]] = {}  # nodeid -> {"wall_s", "cpu_s"}, summed over its phases
_TIME_KEY = "batchtune_phase_times"  # a user property on each test report


@pytest.fixture(scope="session")
def small_nqm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results directory of tests/small_nqm.py's probe, run once per session. Read-only: tests
    that change it, or run a command that writes into it, take ``small_nqm.copy_of`` it first."""
    from tests.small_nqm import run_small_probe

    results = tmp_path_factory.mktemp("small_nqm") / "r"
    run_small_probe(results)
    return results


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
    wall, cpu = time.perf_counter(), _cpu_s()
    result = yield
    wall_s, cpu_s = time.perf_counter() - wall, _cpu_s() - cpu
    # carried on the test's reports, so the summary sees it under pytest-xdist too (the README's
    # command runs the tests in worker processes; the summary is written by the controller)
    item.user_properties.append((_TIME_KEY, {"wall_s": wall_s, "cpu_s": cpu_s}))
    path = os.environ.get("BATCHTUNE_TEST_TIMES")
    if path:
        line = {"nodeid": item.nodeid, "phase": phase, "wall_s": round(wall_s, 3), "cpu_s": round(cpu_s, 3)}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _timed(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _timed(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _timed(item, "teardown"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":  # the teardown report carries all three phases
        return
    total = _TIMES.setdefault(report.nodeid, {"wall_s": 0.0, "cpu_s": 0.0})
    for key, value in report.user_properties:
        if key == _TIME_KEY:
            total["wall_s"] += value["wall_s"]
            total["cpu_s"] += value["cpu_s"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    over = sorted(
        ((t["wall_s"], t["cpu_s"], n) for n, t in _TIMES.items() if t["wall_s"] > LIMIT_S), reverse=True
    )
    if not over:
        return
    load = os.getloadavg()[0]
    terminalreporter.section(f"tests over {LIMIT_S:.0f} s (setup + call + teardown; load now {load:.1f})")
    for wall_s, cpu_s, nodeid in over:
        terminalreporter.write_line(f"{wall_s:6.1f} s wall {cpu_s:6.1f} s CPU  {nodeid}")
    terminalreporter.write_line(
        "a test slow by CPU needs a cheaper fixture, or @pytest.mark.slow if it is covered in fast form"
    )
