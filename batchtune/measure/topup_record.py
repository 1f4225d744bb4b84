"""The async probe's seed top-up record, ``<results>/async_topup.json`` (measure/async_topup.py runs
the rounds and writes it; `recommend` reads it): the margin, seed count and cap the rounds ran
under, each round (its candidates, why, and the seeds they were brought to) and where the
sequential rounds ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from batchtune import codec
from batchtune.errors import InputError
from batchtune.recipe.ranges import NONNEG, RANGES, Range
from batchtune.records.files import read_text, write_if_changed
from batchtune.records.store import ResultsStore
from batchtune.records.types import PROBE_LABEL

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

    def lines(self, ranked: Collection[str] | None = None, with_runs: Collection[str] = ()) -> list[str]:
        """What `recommend` says: who was topped up, in which round, and why; ``ranked``: the
        candidates its ranking has (None: all), the others left out (``_only``) and counted, with
        how many of them have no runs (not in ``with_runs``: the candidates with runs in the results
        directory). No other cause is said: one with runs may be left out for several (a recipe that
        drops it, which the analysis' own note says; a sync_every that rules out its k; another
        group size at its batch, k and u)."""
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
        rounds, end, gone = self._only(ranked)
        said = [
            f"round {i}: {r.words(self.margin, self.top) if r.topped else 'only candidates not ranked here'}"
            for i, r in enumerate(rounds, 1)
        ]
        if gone:
            lost = end is None and self.end is not None
            unrun = len(gone - set(with_runs))  # the one cause these notes can tell
            why = f" ({unrun} with no runs in this directory)" if unrun else ""
            said.append(
                f"{len(gone)} candidate(s) these rounds topped up are not ranked here{why}, so the notes "
                "leave them out" + ("; so is where the rounds ended, which named one" if lost else "")
            )
        return [head, *said, *([] if end is None else [end.words()])]

    def end_for(self, ranked: Collection[str]) -> TopUpEnd | None:
        """Where the rounds ended, if it names only candidates in ``ranked`` (a bound or near tie
        with a candidate the ranking does not have is not this ranking's)."""
        return self._only(ranked)[1]

    def _only(self, ranked: Collection[str] | None) -> tuple[list[TopUpRound], TopUpEnd | None, set[str]]:
        """The rounds with only the candidates in ``ranked`` (a best estimate outside it unnamed), the
        end unless it names another, and the topped candidates left out. A recipe edited
        to drop a candidate keeps its rounds' record (6f34f19 ranks the rest): its notes must not
        name what `recommend` no longer ranks."""
        if ranked is None:
            return list(self.rounds), self.end, set()
        rounds = [
            dataclasses.replace(
                r,
                best=r.best if r.best in ranked else "(a candidate not ranked here)",
                topped=tuple(t for t in r.topped if t.label in ranked),
            )
            for r in self.rounds
        ]
        gone = {t.label for r in self.rounds for t in r.topped} - set(ranked)
        e = self.end
        named = set() if e is None else {e.best, *(o.label for o in e.open)}
        return rounds, e if named <= set(ranked) else None, gone

    def rule(self) -> tuple[float, int, int]:
        """(margin, top, cap) as they decide the rounds: every cap <= top is 0, none (no sequential
        rounds), so a recipe's 0 and a record's 3 under a top of 4 are one rule."""
        return self.margin, self.top, self.cap if self.cap > self.top else 0

    def asked(self) -> dict[str, int]:
        """The seeds each candidate was asked for in the recorded rounds."""
        out: dict[str, int] = {}
        for r in self.rounds:
            for t in r.topped:
                out[t.label] = max(out.get(t.label, 0), r.seeds or self.top)
        return out


def load_top_up(store: ResultsStore) -> TopUpRecord | None:
    """The stored record of the probe's top-up rounds (None: none ran); a damaged one (unreadable,
    a field missing, of the wrong kind or out of its range) is an InputError that names the field
    and says how to start it afresh."""
    path = store.root / TOP_UP_FILE
    if not path.exists():
        return None
    if not path.is_file():
        raise InputError(f"{path} is not a file (a directory in its place?): move it away")
    data = codec.loads(read_text(path), str(path))
    try:
        return _record(data)
    except (KeyError, TypeError, ValueError, AttributeError, InputError) as exc:
        why = (
            str(exc) if isinstance(exc, InputError)
            else f"lacks {exc}" if isinstance(exc, KeyError)
            else f"{type(exc).__name__}: {exc}"
        )  # fmt: skip
        raise InputError(
            f"{path} is not a seed top-up record ({why}); delete it and run the probe again: it "
            "starts the rounds afresh, and the runs it made are kept"
        ) from None


_KINDS = ("contenders", "sequential")  # TopUpRound.kind
_TIME = Range(0)  # an estimated T, seconds: finite, >= 0
_TOL = Range(0, 1, open_lo=True, open_hi=True)
_CAP = RANGES["budget.async_top_up_max_seeds"]  # also bounds a round's seeds: the runs it asks for
_TOP = Range(1, _CAP.hi)  # a record is written only where the top-up runs


def _record(data: Any) -> TopUpRecord:
    """The record from its stored JSON, every field checked (the rounds' runs and `recommend`'s
    notes are made from it); an error names the field, e.g. ``rounds[1].kind``."""
    d = _obj(data, "the record")
    top = _int(d["top"], "top", _TOP)
    rounds = tuple(
        _round(_obj(r, f"rounds[{i}]"), f"rounds[{i}]", top)
        for i, r in enumerate(_list(d["rounds"], "rounds"))
    )
    cap = _int(d.get("cap", 0), "cap", _CAP)  # absent: a record from before the sequential rounds
    end = None if d.get("end") is None else _end(_obj(d["end"], "end"), cap)
    if not isinstance(d["times_source"], str):
        raise InputError(f"times_source = {d['times_source']!r} is not a string")
    margin = _num(d["margin"], "margin", RANGES["budget.async_top_up_margin"])
    return TopUpRecord(margin, top, rounds, d["times_source"], cap, end)


def _round(r: dict[str, Any], at: str, top: int) -> TopUpRound:
    from batchtune.analysis.decide.async_topup import TopUp, TopUpRound

    topped = []
    for j, t in enumerate(_list(r["topped"], f"{at}.topped")):
        w = f"{at}.topped[{j}]"
        t = _obj(t, w)
        topped.append(
            TopUp(
                _label(t["label"], f"{w}.label"),
                _num(t["t"], f"{w}.t", _TIME),
                _int(t["seeds_before"], f"{w}.seeds_before"),
                codec.as_float(t.get("ratio"), f"{w}.ratio"),  # null or absent: a contenders round
                codec.as_float(t.get("low"), f"{w}.low"),
            )
        )
    if not topped:
        raise InputError(f"{at}.topped is empty: a round tops up at least one candidate")
    kind = r.get("kind", "contenders")  # absent: a record before the field
    if kind not in _KINDS:
        raise InputError(f"{at}.kind = {kind!r} is not one of {', '.join(_KINDS)}")
    best = _label(r["best"], f"{at}.best")
    seeds = _int(r.get("seeds", top), f"{at}.seeds", _CAP)  # absent: a record before the field
    return TopUpRound(best, _num(r["best_t"], f"{at}.best_t", _TIME), tuple(topped), seeds, kind)


def _end(e: dict[str, Any], cap: int) -> TopUpEnd:
    from batchtune.analysis.decide.async_topup import OpenLeader, TopUpEnd

    opened = []
    for j, o in enumerate(_list(e["open"], "end.open")):
        w = f"end.open[{j}]"
        o = _obj(o, w)
        opened.append(
            OpenLeader(
                _label(o["label"], f"{w}.label"),
                codec.as_float(o["ratio"], f"{w}.ratio"),  # null: no interval
                codec.as_float(o["low"], f"{w}.low"),
                _int(o["seeds"], f"{w}.seeds"),
            )
        )
    return TopUpEnd(
        _label(e["best"], "end.best"),
        _int(e["seeds"], "end.seeds"),
        tuple(opened),
        _num(e["tol"], "end.tol", _TOL),
        _int(e.get("compared", len(opened)), "end.compared"),  # absent: a record before the field
        _int(e.get("cap", cap), "end.cap", _CAP),
    )


def _obj(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise InputError(f"{where} is not a JSON object")
    return v


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise InputError(f"{where} is not a list")
    return v


def _num(v: Any, where: str, ok: Range) -> float:
    x = codec.as_float(v, where)
    if x not in ok:
        raise InputError(f"{where} = {v!r} is not a number {ok.describe()}")
    return x


def _int(v: Any, where: str, ok: Range = NONNEG) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v not in ok:
        raise InputError(f"{where} = {v!r} is not a whole number {ok.describe()}")
    return v


def _label(v: Any, where: str) -> str:
    if not isinstance(v, str) or not PROBE_LABEL.fullmatch(v):
        raise InputError(f"{where} = {v!r} is not a probe candidate's name (P<prompts>xG<group size>...)")
    return v


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
