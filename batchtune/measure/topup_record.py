"""The async probe's seed top-up record, ``<results>/async_topup.json`` (measure/async_topup.py runs
the rounds and writes it; `recommend` reads it): the margin, seed count and cap the rounds ran
under, each round (its candidates, why, and the seeds they were brought to) and where the
sequential rounds ended.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from batchtune import codec
from batchtune.errors import InputError
from batchtune.records.files import read_text, write_if_changed
from batchtune.records.store import ResultsStore

if TYPE_CHECKING:
    from batchtune.analysis.decide.async_topup import TopUpEnd, TopUpRound

TOP_UP_FILE = "async_topup.json"
TIMES = "the probe's own step times"


@dataclasses.dataclass(frozen=True)
class TopUpRecord:
    margin: float
    top: int
    rounds: tuple[TopUpRound, ...]
    times_source: str = TIMES
    cap: int = 0  # budget.async_top_up_max_seeds (<= top: no sequential rounds)
    end: TopUpEnd | None = None  # where the sequential rounds stopped (None: none ran, or not yet)

    def lines(self) -> list[str]:
        """What `recommend` says: who was topped up, in which round, and why."""
        seq = (
            f"; then, up to {self.cap} seeds, the best and the contenders its paired seeds did not "
            "separate from it doubled their seeds (budget.async_top_up_max_seeds; a candidate once topped "
            "up stays compared until its interval separates it)"
            if self.cap > self.top
            else ""
        )
        if not self.rounds:
            return [
                f"seed top-up (budget.async_top_up_seeds = {self.top}, margin {self.margin:.0%}): no "
                "candidate needed more seeds"
            ]
        head = (
            f"seed top-up (budget.async_top_up_seeds = {self.top}): candidates within "
            f"{self.margin:.0%} of the best estimated T ({self.times_source}) got {self.top} seeds, "
            f"until no contender lacked seeds{seq}"
        )
        rounds = [f"round {i}: {r.words(self.margin, self.top)}" for i, r in enumerate(self.rounds, 1)]
        return [head, *rounds, *([] if self.end is None else [self.end.words()])]

    def asked(self) -> dict[str, int]:
        """The seeds each candidate was asked for in the recorded rounds."""
        out: dict[str, int] = {}
        for r in self.rounds:
            for t in r.topped:
                out[t.label] = max(out.get(t.label, 0), r.seeds or self.top)
        return out


def load_top_up(store: ResultsStore) -> TopUpRecord | None:
    """The stored record of the probe's top-up rounds (None: none ran); a damaged one is an
    InputError that says how to start it afresh."""
    path = store.root / TOP_UP_FILE
    if not path.exists():
        return None
    if not path.is_file():
        raise InputError(f"{path} is not a file (a directory in its place?): move it away")
    data = codec.loads(read_text(path), str(path))
    try:
        return _record(data, str(path))
    except (KeyError, TypeError, ValueError, AttributeError, InputError) as exc:
        raise InputError(
            f"{path} is not a seed top-up record ({type(exc).__name__}: {exc}); delete it and run the "
            "probe again: it starts the rounds afresh, and the runs it made are kept"
        ) from None


def _record(data: Any, where: str) -> TopUpRecord:
    from batchtune.analysis.decide.async_topup import OpenLeader, TopUp, TopUpEnd, TopUpRound

    rounds = tuple(
        TopUpRound(
            str(r["best"]),
            codec.as_float(r["best_t"], where),
            tuple(codec.from_dict(TopUp, t, where) for t in r["topped"]),
            int(r.get("seeds", data["top"])),
            str(r.get("kind", "contenders")),
        )
        for r in data["rounds"]
    )
    top = int(data["top"])
    e = data.get("end")  # absent: a record before the field, or rounds not ended
    end = (
        None
        if e is None
        else TopUpEnd(
            str(e["best"]),
            int(e["seeds"]),
            tuple(codec.from_dict(OpenLeader, o, where) for o in e["open"]),
            codec.as_float(e["tol"], where),
            int(e.get("compared", len(e["open"]))),  # absent: a record before the field
            int(e.get("cap", data.get("cap", 0))),
        )
    )
    return TopUpRecord(
        codec.as_float(data["margin"], where),
        top,
        rounds,
        str(data["times_source"]),
        int(data.get("cap", top)),
        end,
    )


def save_top_up(store: ResultsStore, rec: TopUpRecord) -> None:
    data: dict[str, Any] = {
        "margin": rec.margin,
        "top": rec.top,
        "cap": rec.cap,
        "times_source": rec.times_source,
        "rounds": [dataclasses.asdict(r) for r in rec.rounds],
        "end": None if rec.end is None else dataclasses.asdict(rec.end),
    }
    write_if_changed(store.root / TOP_UP_FILE, codec.dumps(data, indent=2))
