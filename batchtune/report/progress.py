"""Rich progress for long work. The core calls a plain callback; only this module draws."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from batchtune.events import ProbeEvents as ProgressFn


@contextlib.contextmanager
def probe_progress(console: Console, enabled: bool = True) -> Iterator[ProgressFn | None]:
    """A callback for run_probe that shows overall runs and the samples of each live run. Disabled
    (``--json``), it still says on stderr when it waits for runs another process holds, or runs
    again runs that failed before training, so a script never sits silent."""
    if not enabled:
        stderr = Console(stderr=True, highlight=False)

        def only_waits(kind: str, info: dict[str, Any]) -> None:
            if kind in ("wait", "retry"):
                stderr.print(info["message"], markup=False, soft_wrap=True)

        yield only_waits
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task("runs", total=None)
        live: dict[str, Any] = {}

        def on_event(kind: str, info: dict[str, Any]) -> None:
            rid = info.get("run_id", "")
            if kind == "plan" and info["total"] is None:  # a branched search: as many as it needs
                progress.update(overall, description="runs (as many as the branched search needs)")
            elif kind == "plan":
                progress.update(overall, total=info["total"], completed=info["total"] - info["todo"])
                # a later phase (sequential seeds) counts its own runs: say which, not "0 reused"
                what = info.get("phase") or f"{info['total'] - info['todo']} reused"
                progress.update(overall, description=f"runs ({what})")
            elif kind == "start":
                live[rid] = progress.add_task(f"  {rid}", total=None)
            elif kind == "step":
                if rid not in live:
                    live[rid] = progress.add_task(f"  {rid}", total=None)
                progress.update(live[rid], completed=info["samples"], total=info["max_samples"])
            elif kind == "end":
                if rid in live:
                    progress.remove_task(live.pop(rid))
                status = info.get("status", "")
                style = "green" if status == "reached_target" else "yellow"
                if status in ("diverged", "oom", "failed", "timeout"):
                    style = "magenta"
                reason = info.get("reason", "")
                if status == "reached_target" and reason:  # "reached the target at N samples" says it
                    progress.console.print(f"  [{style}]{rid}:[/] {reason}")
                else:
                    progress.console.print(f"  [{style}]{rid}: {status}[/] {reason}")
                progress.advance(overall)
            elif kind in ("wait", "retry"):  # runs another process holds; runs that failed to start
                progress.console.print(f"  [yellow]{escape(info['message'])}[/]")

        yield on_event


@contextlib.contextmanager
def simple_progress(console: Console, description: str, enabled: bool = True) -> Iterator[Any]:
    """A callback ``(done, total, description)`` for sweeps such as profile-gen."""
    if not enabled:
        yield None
        return
    with Progress(*Progress.get_default_columns(), console=console) as progress:
        task = progress.add_task(description, total=None)

        def on_progress(done: int, total: int, desc: str = "") -> None:
            progress.update(task, completed=done, total=total, description=desc or description)

        yield on_progress
