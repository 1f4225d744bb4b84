"""How busy the machine was with other work while something was timed.

A throughput profile taken while another job held the cores is slower than the machine, and by a
different factor at each point: the knee and the ranking move with the load (two default `tune` runs
with identical sample-efficiency tables picked different batches, one of them on a loaded box). The
meter reads, over a timed interval, the CPU time of the whole machine (``/proc/stat``) less that of
this process and its descendants (``/proc/<pid>/stat``): the **other processes' CPU cores**, averaged
over the interval. It reads nothing else and costs one scan of ``/proc`` per reading (milliseconds).
Off Linux it returns NaN (unknown), never a guess.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def _ticks_per_s() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 100.0


def _machine_busy_ticks() -> float | None:
    """CPU ticks spent busy (all but idle and iowait) since boot, all cores together."""
    try:
        first = (PROC / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu":
        return None
    values = [float(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)
    guest = sum(values[8:10]) if len(values) > 9 else 0.0  # guest time is counted in user already
    return sum(values) - idle - guest


def _stat_fields(pid: str) -> list[str] | None:
    try:
        raw = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    close = raw.rfind(")")  # the command name may hold spaces and parentheses
    return raw[close + 2 :].split() if close > 0 else None


def _own_tree_ticks() -> float:
    """CPU ticks of this process (with its reaped children) and of its live descendants."""
    me = str(os.getpid())
    parent: dict[str, str] = {}
    ticks: dict[str, float] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is None or len(fields) < 15:
            continue
        parent[entry.name] = fields[1]
        # utime stime (fields 14, 15); cutime cstime (16, 17): reaped children's time
        ticks[entry.name] = sum(float(v) for v in fields[11:15])
    total = 0.0
    for pid, t in ticks.items():
        p, hops = pid, 0
        while p in parent and p != me and hops < 64:
            p, hops = parent[p], hops + 1
        if p == me:
            total += t
    return total


@dataclass(frozen=True)
class Reading:
    wall: float
    busy: float | None
    own: float


def read() -> Reading:
    """A snapshot to pass to `other_cores` at the end of the interval."""
    busy = _machine_busy_ticks()
    own = _own_tree_ticks() if busy is not None else 0.0
    return Reading(time.perf_counter(), busy, own)


def other_cores(start: Reading, end: Reading | None = None) -> float:
    """Other processes' CPU cores busy on average between two readings; NaN when unknown."""
    end = end if end is not None else read()
    dt = end.wall - start.wall
    if start.busy is None or end.busy is None or dt <= 0:
        return math.nan
    other = (end.busy - start.busy) - (end.own - start.own)
    return max(0.0, other / _ticks_per_s() / dt)


def cpu_count() -> int:
    return os.cpu_count() or 1
