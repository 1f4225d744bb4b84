"""Where probe runs execute: in this process, in a local pool of worker processes, or on Ray; and
waiting for runs that another live process holds.

A run is claimed through the results store's lock (``ResultsStore.claim``); a run another process
holds is never touched here: ``run_jobs`` waits until it is finished, or until its holder has died
(the lock is free again), and then runs it itself.

Pool workers die with the main process (``PR_SET_PDEATHSIG``, see backends/lifeguard.py), and an
exception in the main process (Ctrl-C, or SIGTERM: see ``lifeguard.sigterm_raises``) stops the pool
instead of waiting for its runs to finish: runs not started are cancelled, each worker unwinds its
run (its ``finally`` blocks stop the trainer; the partial run is redone on resume) and exits, and one
still alive after ``STOP_GRACE_S`` is killed. Workers ignore SIGINT: a terminal's Ctrl-C reaches the
whole process group, and the main process alone decides, as it does for SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import queue as queue_mod
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from functools import partial
from typing import Any

from batchtune.backends import lifeguard
from batchtune.backends.spec import Candidate
from batchtune.events import ProbeEvents
from batchtune.measure import ray_executor
from batchtune.measure.plan import run_id
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore

# execute_run(recipe, results_dir, candidate, seed, base_lr, reference_batch, policy[, rid, spec_extra],
from batchtune.records.types import RunRecord

# execute_run(recipe, results_dir, candidate, seed, base_lr, reference_batch, policy[, rid, spec_extra],
# events=, parallel_runs=)
# measure.one_run's, passed in (a module-level function, so a spawned worker can unpickle it)
RunFn = Callable[..., RunRecord | None]

WAIT_POLL_S = 1.0  # how often a run held by another process is checked
STOP_GRACE_S = 15.0  # stopping the pool: SIGTERM -> SIGKILL for a worker still unwinding its run


class Runner:
    """Runs batches of runs where the recipe says (``run.executor``, at most ``run.workers`` at once):
    in this process, in a pool of worker processes kept for the runner's life (a branched probe runs
    many small batches: one pool, not one per batch), or on Ray. A context manager: the pool stops
    at its exit, and at once on an exception (SIGTERM, Ctrl-C or a worker's error)."""

    def __init__(self, recipe: Recipe, progress: ProbeEvents | None) -> None:
        self.recipe, self.progress = recipe, progress
        self._pool: _Pool | None = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if self._pool is not None:
            self._pool.close(failed=kind is not None)
            self._pool = None

    def run(self, run_fn: RunFn, args: list[tuple]) -> int:
        """Run each of ``args`` (``run_fn``'s positional arguments) once; returns the number run here
        (a run another process holds, or one finished meanwhile, is not run)."""
        if not args:
            return 0
        if self.recipe.run.executor == "ray":
            return ray_executor.run_on_ray(run_fn, args, self.progress)  # tasks, or Ray Jobs for commands
        workers = min(self.recipe.run.workers, len(args))
        if workers == 1:
            return sum(run_fn(*a, events=self.progress, parallel_runs=1) is not None for a in args)
        if self._pool is None:
            self._pool = _Pool(self.recipe.run.workers)
        return self._pool.run(run_fn, args, workers, self.progress)


_WORKER_EVENTS: Any = None  # the progress queue, inherited by each pool worker at its start
_IN_RUN = False  # whether this pool worker is running a run (SIGTERM unwinds it) or idle
_STOPPING = False  # SIGTERM came: the pool is being stopped, this worker exits after its run unwinds


def _init_worker(events: Any) -> None:
    """Pool worker start: die with the main process; SIGTERM unwinds a run (stopping a command's
    group) and then ends the worker, and ends an idle one at once, quietly (no traceback of its wait
    on the pool's queue). SIGINT is ignored: the main process stops the pool (``_Pool.close``). It
    is blocked until here (``_Pool.run`` starts workers so): a Ctrl-C while a worker starts prints
    no traceback either."""
    global _WORKER_EVENTS
    lifeguard.kill_on_parent_death()
    _WORKER_EVENTS = events

    from batchtune.errors import Terminated

    def on_term(signum: int, frame: Any) -> None:
        global _STOPPING
        if not _IN_RUN:
            os._exit(128 + signum)
        if _STOPPING:  # a second SIGTERM: let the first one's unwinding finish
            return
        _STOPPING = True
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, on_term)
    # a Python handler, not SIG_IGN: that would be inherited by a trainer the worker starts
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _execute_in_worker(run_fn: RunFn, parallel_runs: int, *args: Any) -> RunRecord | None:
    global _IN_RUN
    try:
        _IN_RUN = True
        try:
            return run_fn(*args, events=_WORKER_EVENTS, parallel_runs=parallel_runs)
        finally:
            _IN_RUN = False
    finally:
        # stopped mid-run: the run has unwound; exit rather than go back to the pool's queue for the
        # next run (the executor would hand it one). The outer ``finally`` also covers a SIGTERM that
        # lands in the inner one.
        if _STOPPING:
            os._exit(128 + signal.SIGTERM)


class _Pool:
    """A pool of spawned worker processes (fork after torch threads exist is unsafe) and the queue
    their progress events come back on."""

    def __init__(self, workers: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.events = ctx.Queue()  # handed to workers at their start: no manager process to outlive us
        self.pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(self.events,)
        )

    def run(self, run_fn: RunFn, args: list[tuple], parallel: int, progress: ProbeEvents | None) -> int:
        """``parallel``: how many of these runs share the machine at once (stored with each record)."""
        done = 0
        # submit() starts the workers: with SIGINT blocked, which they inherit until _init_worker has
        # them ignore it (a Ctrl-C while they import printed each one's traceback); and a Ctrl-C or
        # SIGTERM here is held until the executor's books are straight (a worker started but not
        # yet listed would escape the stop), then raised as usual
        with _signals_held(block_sigint=True) as held:
            pending: set[Future] = {self.pool.submit(_execute_in_worker, run_fn, parallel, *a) for a in args}
        for signum in held[:1]:
            signal.raise_signal(signum)
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(self.events, progress)
            for fut in finished:
                done += fut.result() is not None
        _drain(self.events, progress)
        return done

    def close(self, *, failed: bool) -> None:
        if failed:  # stop the workers now rather than wait for their runs
            with _signals_held() as repeated:  # a second Ctrl-C must not cut the stop short
                self._stop(repeated)
            return
        self.pool.shutdown(wait=True)
        self.events.close()

    def _stop(self, hurry: list[int]) -> None:
        """Cancel the runs not started, SIGTERM each worker (it unwinds its run, then exits), SIGKILL
        those alive after ``STOP_GRACE_S`` (or at once once ``hurry`` holds a signal: a repeated
        Ctrl-C or SIGTERM), and wait for the executor's thread, so that nothing is left for the
        interpreter's exit to wait for. (``shutdown(wait=False)`` alone left it waiting for the
        workers to finish every queued run, and forever once their progress filled the queue no one
        read any more.)"""
        procs = list((getattr(self.pool, "_processes", None) or {}).values())  # shutdown() drops
        manager = getattr(self.pool, "_executor_manager_thread", None)  # both references
        # the executor's thread cancels the pending runs only while the executor object lives: this
        # _Pool holds it until the thread is done
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            with contextlib.suppress(OSError, ValueError):
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline and not hurry:
            time.sleep(0.05)
        for proc in procs:
            if proc.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    proc.kill()
            proc.join(timeout=5)
        if manager is not None:
            manager.join(timeout=10)  # it sees the workers gone, fails their futures and returns
        self.events.close()


@contextlib.contextmanager
def _signals_held(*, block_sigint: bool = False) -> Iterator[list[int]]:
    """SIGINT and SIGTERM within the block are only noted in the yielded list (the main thread's
    handlers; elsewhere a no-op). ``block_sigint``: also block SIGINT in this thread, so that the
    processes it starts begin with SIGINT blocked."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in sigs}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT} if block_sigint else set())
    try:
        yield held
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _drain(events: Any, progress: ProbeEvents | None) -> None:
    while True:
        try:
            event = events.get_nowait()
        except (queue_mod.Empty, OSError, ValueError):
            return
        if progress is not None:
            progress(event["kind"], event)


def run_jobs(
    run_fn: RunFn,
    recipe: Recipe,
    store: ResultsStore,
    reference_batch: int,
    jobs: list[tuple[Candidate, int]],
    policy: Any,
    progress: ProbeEvents | None,
) -> int:
    """Run ``jobs`` until each is finished, here or by another live process (waited for, with a
    ``wait`` progress event naming the runs). Returns the number run by this process."""
    args = [(recipe, str(store.root), c, s, recipe.optimizer.lr, reference_batch, policy) for c, s in jobs]
    with Runner(recipe, progress) as runner:
        return run_until_finished(
            store, args, [run_id(c, s) for c, s in jobs], partial(runner.run, run_fn), progress
        )


def run_until_finished(
    store: ResultsStore,
    items: list[Any],
    ids: list[str],
    run: Callable[[list[Any]], int],
    progress: ProbeEvents | None,
) -> int:
    """``run(items)``, then wait for those another live process holds (``ids``: each item's run id)
    until each is finished there, or its holder has died and it is run here (its lock is free
    again). Returns the number run by this process."""
    done = run(items)
    announced: tuple[str, ...] = ()
    while True:
        left = [(item, rid) for item, rid in zip(items, ids, strict=True) if not store.is_finished(rid)]
        if not left:
            return done
        left_ids = tuple(rid for _, rid in left)
        if left_ids != announced and progress is not None:
            progress("wait", {"run_ids": list(left_ids), "message": held_elsewhere_message(left_ids)})
        announced = left_ids
        time.sleep(WAIT_POLL_S)
        done += run([item for item, _ in left])  # a run whose holder died is free again: run it here


def held_elsewhere_message(ids: tuple[str, ...] | list[str]) -> str:
    shown = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
    return f"still running elsewhere: {shown} (another batchtune process holds them; waiting)"
