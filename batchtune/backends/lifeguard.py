"""Children die with their parent: no trainer, pool worker or grandchild outlives a killed batchtune.

Three layers, because no single one covers every way a probe ends:

1. ``PR_SET_PDEATHSIG`` (Linux ``prctl(2)``): the kernel sends a signal to a process when the thread
   that started it exits, even after ``kill -9``. Pool workers ask for SIGKILL; the command backend's
   guard process (below) for SIGTERM, so it can stop the trainer's whole group.
2. The guard (``python -m batchtune.backends.lifeguard -- ARGV``): the command backend starts the
   user's trainer through it, in a session of its own. The trainer and anything it forks (torchrun
   workers, a shell's children) stay in the guard's process group; when the guard is told to stop,
   or its parent dies, it sends SIGTERM to the group, then SIGKILL after a grace period. It exits
   with the trainer's exit code (128 + signal when the trainer was killed).
3. In batchtune itself: SIGTERM raises :class:`batchtune.errors.Terminated` so ``finally`` blocks
   stop their process groups, and an ``atexit`` hook kills any group still registered.

Elsewhere (macOS) layer 1 is absent; the guard then polls its parent's pid instead.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
GRACE_S = 5.0  # SIGTERM -> SIGKILL for the trainer's group
POLL_S = 0.2

_prctl: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        _prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (thread) dies. Async-signal-safe
    enough for a ``preexec_fn``: the libc function was resolved at import. False where unsupported."""
    if _prctl is None:
        return False
    return _prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def kill_on_parent_death() -> None:
    """``preexec_fn`` and pool ``initializer``: SIGKILL when the parent dies."""
    set_parent_death_signal(signal.SIGKILL)


def _term_on_parent_death() -> None:
    set_parent_death_signal(signal.SIGTERM)


# ---- groups batchtune has started ------------------------------------------------------------------
_LIVE_GROUPS: set[int] = set()


def register_group(pgid: int) -> None:
    _LIVE_GROUPS.add(pgid)


def unregister_group(pgid: int) -> None:
    _LIVE_GROUPS.discard(pgid)


def kill_groups() -> None:
    """SIGKILL every process group still registered (atexit, and after a SIGTERM)."""
    for pgid in list(_LIVE_GROUPS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _LIVE_GROUPS.discard(pgid)


atexit.register(kill_groups)


def start_guarded(argv: list[str], **popen: Any) -> subprocess.Popen:
    """Start ``argv`` under the guard, in a new session; the returned process is the guard, whose pid
    is the group id of the trainer and its children."""
    guard = [sys.executable, "-m", "batchtune.backends.lifeguard", str(os.getpid()), "--", *argv]
    proc = subprocess.Popen(guard, start_new_session=True, preexec_fn=_term_on_parent_death, **popen)
    register_group(proc.pid)
    return proc


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` (so ``finally`` blocks stop children).
    A no-op outside the main thread, where signal handlers cannot be set."""
    from batchtune.errors import Terminated

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# ---- the guard process -----------------------------------------------------------------------------
def _guard(parent_pid: int, argv: list[str]) -> int:
    """Run ``argv`` as a child in this process group; stop the group when told to or orphaned."""
    stop_at: list[float] = []  # when SIGKILL becomes due; empty while no stop was asked

    def stop(signum: int = signal.SIGTERM, frame: Any = None) -> None:
        if not stop_at:
            stop_at.append(time.monotonic() + GRACE_S)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(0, signal.SIGTERM)  # reaches this guard too: the handler is idempotent

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    have_pdeathsig = set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        return 143
    try:
        child = subprocess.Popen(argv, preexec_fn=kill_on_parent_death)
    except OSError as exc:
        sys.stderr.write(f"cannot start {argv[0]!r}: {exc.strerror or exc}\n")
        return 127
    while True:
        try:
            rc = child.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is not None and not stop_at:
            # the trainer exited: ask whatever it left in the group to go too (the backend then
            # sends SIGKILL to the group once this guard has exited)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(0, signal.SIGTERM)
            return rc if rc >= 0 else 128 - rc
        if not have_pdeathsig and os.getppid() != parent_pid:
            stop()
        if stop_at and (rc is not None or time.monotonic() > stop_at[0]):
            os.killpg(0, signal.SIGKILL)  # the trainer's leftovers and this guard
            return 137  # pragma: no cover - not reached


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.stderr.write("usage: python -m batchtune.backends.lifeguard PARENT_PID -- ARGV...\n")
        sys.exit(2)
    sys.exit(_guard(int(sys.argv[1]), sys.argv[3:]))
