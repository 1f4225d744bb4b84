"""Runs whose trainer never started (``records.failed_before_training``): not data.

Every probe (grid, branched, pre-training) reopens them so it runs them again, says so, notes those
still failing at its end, and stops at once when the run everything else depends on (the grid's
reference, a branched probe's trunk) could not start: the others would fail the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchtune.errors import BackendError
from batchtune.events import ProbeEvents
from batchtune.records.store import ResultsStore
from batchtune.records.types import RunRecord, failed_before_training


def _named(records: Sequence[RunRecord]) -> str:
    ids = [r.run_id for r in records]
    return ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")


def reopen(store: ResultsStore, progress: ProbeEvents | None) -> list[RunRecord]:
    """Make the runs that failed before training last time unfinished again, so this probe runs
    them; a ``retry`` event says so."""
    reopened = store.reopen_failed_starts()
    if reopened and progress is not None:
        message = (
            f"running again {len(reopened)} run(s) that failed before training last time "
            f"({_named(reopened)}: {reopened[0].reason})"
        )
        progress("retry", {"run_ids": [r.run_id for r in reopened], "message": message})
    return reopened


def note(store: ResultsStore) -> str | None:
    """A note naming the runs that failed before their first training step (run again next time)."""
    failed = [r for r in store.runs() if failed_before_training(r)]
    if not failed:
        return None
    return (
        f"{len(failed)} run(s) failed before their first training step ({_named(failed)}: "
        f"{failed[0].reason}); they measured nothing, so the next probe runs them again"
    )


def stop_if_none_started(records: Sequence[RunRecord], who: str, not_run: str) -> None:
    """BackendError (exit 4) when ``records`` (``who``: the reference, the trunk) all failed before
    their first training step: ``not_run`` says what was therefore not started."""
    if records and all(failed_before_training(r) for r in records):
        raise BackendError(
            f"{who} failed before its first training step ({_named(records)}), so {not_run}: "
            f"{records[0].reason}; fix the trainer or its environment and rerun (runs that failed "
            "before training are run again)"
        )
