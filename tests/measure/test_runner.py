"""measure/execute.Runner: one pool of worker processes for many batches of runs, stopped cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.drill_kit import sigint_as_a_terminal_sends_it

ROOT = Path(__file__).parents[2]


def quick_run(*args: object, events: object = None, parallel_runs: int = 1) -> None:
    """A run function for the pool (importable by a spawned worker): runs nothing."""
    return None


@pytest.mark.slow  # 15-17 s at load 4: two worker processes wait out a failing driver
def test_an_error_in_the_driver_stops_idle_workers_without_a_traceback() -> None:
    """A probe that stops on an error (here: exit 3 once the pool's workers are idle) says it in one
    line; its idle workers used to each print the traceback of their wait on the pool's queue."""
    script = textwrap.dedent(
        """
        from batchtune.recipe.load import load_recipe
        from batchtune.measure.execute import Runner
        from tests.measure.test_runner import quick_run

        if __name__ == "__main__":
            with Runner(load_recipe("recipes/nqm.toml", ["run.workers=2"]), None) as runner:
                runner.run(quick_run, [(), ()])
                runner.run(quick_run, [(), ()])  # the same pool again
                raise SystemExit(3)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 3, out.stderr
    # (what the workers printed; CPython's own resource tracker may still warn at exit, not checked)
    assert "Terminated" not in out.stderr and "measure/execute.py" not in out.stderr, out.stderr


def slow_run(marks: str, i: int, unwind_s: float, events: object = None, parallel_runs: int = 1) -> None:
    """A run for the pool that lasts a minute, marking its start with the worker's pid, and its end;
    unwinding it takes ``unwind_s`` (as stopping a trainer does)."""
    tmp = Path(marks, f".pid-{i}")  # written whole, then named: a marker is never seen empty
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, Path(marks, f"start-{i}"))
    try:
        time.sleep(60)
    finally:
        time.sleep(unwind_s)
    Path(marks, f"end-{i}").touch()


STOP_SCRIPT = textwrap.dedent(
    """
    import sys
    from batchtune.backends import lifeguard
    from batchtune.errors import Terminated
    from batchtune.measure import execute
    from batchtune.recipe.load import load_recipe
    from tests.measure.test_runner import slow_run

    if __name__ == "__main__":
        marks, unwind_s = sys.argv[1], float(sys.argv[2])
        if unwind_s > 10:  # a stubborn run: no SIGKILL before the second Ctrl-C
            execute.STOP_GRACE_S = 600
        recipe = load_recipe("recipes/nqm.toml", ["run.workers=2"])
        try:
            with lifeguard.sigterm_raises(), execute.Runner(recipe, None) as runner:
                runner.run(slow_run, [(marks, i, unwind_s) for i in range(6)])
        except KeyboardInterrupt:
            sys.exit(130)
        except Terminated as exc:
            sys.exit(128 + exc.signum)
    """
)


def _start_stop_script(marks: Path, unwind_s: float) -> subprocess.Popen:
    """STOP_SCRIPT in its own process group (a Ctrl-C to it reaches it and its workers only)."""
    return subprocess.Popen(
        [sys.executable, "-c", STOP_SCRIPT, str(marks), str(unwind_s)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=sigint_as_a_terminal_sends_it,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    ("to_group", "sig", "code"),
    [(True, signal.SIGINT, 130), (False, signal.SIGINT, 130), (False, signal.SIGTERM, 143)],
    ids=["ctrl-c-to-the-group", "sigint-to-the-driver", "sigterm-to-the-driver"],
)
def test_a_signal_stops_the_running_runs_and_starts_no_queued_one(tmp_path, to_group, sig, code) -> None:
    """Six minute-long runs on two workers (each taking a second to unwind), interrupted once two are
    under way: the two are stopped, the four queued never start, and the driver exits with 128 +
    signal, no worker printing a traceback. It used to go on starting the queued runs after
    'interrupted', then wait at exit for the workers, forever once their progress events filled the
    queue no one read any more; and a Ctrl-C reaching the workers (a terminal sends it to the whole
    group) printed their tracebacks."""
    proc = _start_stop_script(tmp_path, unwind_s=1)
    try:
        started = _wait_for_starts(tmp_path, proc, 2)
        os.killpg(proc.pid, sig) if to_group else proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)  # the runs last a minute: not waited for
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, err
    assert "Traceback" not in err and "execute.py" not in err, err
    assert sorted(p.name for p in tmp_path.glob("start-*")) == started, "a queued run started"
    assert not list(tmp_path.glob("end-*"))
    assert not [pid for pid in _worker_pids(tmp_path) if _alive(pid)], "a worker outlived the driver"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_second_ctrl_c_kills_workers_whose_runs_do_not_unwind(tmp_path) -> None:
    """Runs whose unwinding takes long (here a minute; the grace before SIGKILL is set to 600 s): the
    first Ctrl-C stops the pool and waits for it, a second one kills the workers at once rather
    than cutting the stop short (which left the workers running and the exit waiting for them)."""
    proc = _start_stop_script(tmp_path, unwind_s=60)
    try:
        _wait_for_starts(tmp_path, proc, 2)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None  # still waiting for the stubborn runs
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert not [pid for pid in _worker_pids(tmp_path) if _alive(pid)]


def _wait_for_starts(marks: Path, proc: subprocess.Popen, n: int) -> list[str]:
    deadline = time.monotonic() + 120
    while len(list(marks.glob("start-*"))) < n and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    started = sorted(p.name for p in marks.glob("start-*"))
    assert len(started) == n, (started, proc.poll())
    return started


def _worker_pids(marks: Path) -> list[int]:
    """The pids the workers wrote (each marker is renamed into place with its pid in it)."""
    return [int(p.read_text()) for p in marks.glob("start-*")]
