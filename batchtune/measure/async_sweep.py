"""The default off-policy sweep (``probe.async_sweep = "auto"``): time a few steps of each main
candidate here, prune the (k, u) grid with the pipeline model (analysis/decide/async_sweep.py), and
keep the decision in the results directory so a resumed probe and `recommend` see the same plan.

    <results>/async_sweep.json   {"cells": {label: {kept, reason, step_time_s}}, "times": {...},
                                  "traces": {label: {"gen": [...], "train": [...]}}}

The main candidates are timed in one process (algorithm.mode = "sync"): generation and training
each alone, the best case the pruning rule asks for. Each timed step's own times are kept (the
traces) and played through the pipeline simulation, so a deeper queue (k >= 2) is kept where the
measured variation of the step times makes it pay.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchtune import backends, codec
from batchtune.analysis.decide.async_sweep import SweepCell, prune_sweep
from batchtune.backends.spec import Candidate, RunFailed
from batchtune.measure.plan import Plan, timing_spec
from batchtune.recipe.schema import Recipe
from batchtune.records.files import atomic_write_text, locked_waiting
from batchtune.records.store import ResultsStore

SWEEP_FILE = "async_sweep.json"
TIMED_STEPS = 8  # per main candidate; the first (warm-up) is left out
SCRATCH = "async-sweep-timing"
SWEEP_LOCK = ".async_sweep.lock"
SWEEP_HELD = (
    "another batchtune process is timing the off-policy sweep in {}; waiting for its decision "
    "(then read here)"
)


@dataclass(frozen=True)
class SweepDecision:
    cells: dict[str, SweepCell]  # off-policy label -> kept or pruned, and why
    times: dict[str, tuple[float, float]]  # main label -> (gen s per batch, train s per update)
    source: str  # where the times come from, in words
    # main label -> (gen s of each timed batch, train s per update of each), in order; {}: none kept
    traces: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = dataclasses.field(default_factory=dict)

    @property
    def pruned(self) -> list[str]:
        return [lab for lab, c in self.cells.items() if not c.kept]

    def lines(self) -> list[str]:
        """What a plan says about the sweep: kept, pruned and why."""
        kept = [lab for lab, c in self.cells.items() if c.kept]
        out = [
            f"async sweep (probe.async_sweep = auto): {len(kept)} of {len(self.cells)} off-policy "
            f"candidates kept by the pipeline model ({self.source})"
        ]
        out += [f"pruned {lab}: {self.cells[lab].reason}" for lab in self.pruned]
        return out


Trace = tuple[tuple[float, ...], tuple[float, ...]]


def _time_stages(recipe: Recipe, cand: Candidate, scratch: Path, ref_batch: int) -> Trace:
    """(gen_s of each batch, train_s per update of each) over a few steps of ``cand`` alone, the
    first (warm-up) left out."""
    sync = dataclasses.replace(recipe, algorithm=dataclasses.replace(recipe.algorithm, mode="sync"))
    spec = timing_spec(sync, cand, scratch, ref_batch)  # sync's optimizer is the recipe's
    stream = backends.load("training", recipe.backend.training)().train(spec)
    gens: list[float] = []
    trains: list[float] = []
    try:
        for rec in stream:
            if rec.step > 0:
                gens.append(rec.gen_s)
                trains.append(rec.train_s)
            if len(gens) >= TIMED_STEPS:
                break
    except RunFailed:
        pass  # timed up to where it failed; a probe records the failure itself
    finally:
        stream.close()
    gens, trains = (gens[1:], trains[1:]) if len(gens) >= 2 else (gens, trains)
    u = cand.updates_per_batch or recipe.algorithm.mini_batches
    other = recipe.generation.other_s_per_step
    return tuple(g + other for g in gens), tuple(t / u for t in trains)


def decide(
    recipe: Recipe,
    plan: Plan,
    times: dict[str, tuple[float, float]],
    source: str,
    traces: dict[str, Trace] | None = None,
) -> SweepDecision:
    """Keep or prune each off-policy candidate of ``plan`` from its main candidate's times (and the
    timed steps' own times, ``traces``, where kept)."""
    traces = traces or {}
    by = plan.by_label()
    m = recipe.algorithm.mini_batches
    s = recipe.algorithm.runs_sync_every
    cells: dict[str, SweepCell] = {}
    for main in plan.main:
        gen, upd = times.get(main, (math.nan, math.nan))
        mine = [by[lab] for lab in plan.offpolicy if lab.startswith(f"{main}-k")]
        if not (math.isfinite(gen) and math.isfinite(upd)):  # not timed: run all the trainer can run
            cells.update({c.label: _untimed(c.staleness, c.updates_per_batch, s) for c in mine})
            continue
        grid = [(c.staleness, c.updates_per_batch) for c in mine]
        gt, tt = traces.get(main, ((), ()))
        verdict = {
            (c.staleness, c.updates_per_batch): c
            for c in prune_sweep(
                gen, upd, mini_batches=m, cells=grid, sync_every=s, gen_trace=gt, train_trace=tt
            )
        }
        cells.update({c.label: verdict[(c.staleness, c.updates_per_batch)] for c in mine})
    return SweepDecision(cells, times, source, traces)


def _untimed(k: int, u: int, sync_every: int) -> SweepCell:
    """A cell of a main candidate not timed: run, unless the async trainer refuses its k (as
    prune_sweep says where timed; such a run would fail at its start)."""
    if 1 <= k < sync_every - 1:
        return SweepCell(k, u, math.nan, False, f"k = {k} cannot keep a weight sync every {sync_every} steps")
    return SweepCell(k, u, math.nan, True, "")


def _load(store: ResultsStore) -> SweepDecision | None:
    path = store.root / SWEEP_FILE
    if not path.is_file():
        return None
    data = codec.loads(path.read_text(), str(path))
    cells = {lab: codec.from_dict(SweepCell, c, f"{path}: {lab}") for lab, c in data["cells"].items()}
    times = {
        lab: (codec.as_float(t[0], str(path)), codec.as_float(t[1], str(path)))
        for lab, t in data["times"].items()
    }
    traces = {
        lab: (
            tuple(codec.as_float(x, str(path)) for x in t["gen"]),
            tuple(codec.as_float(x, str(path)) for x in t["train"]),
        )
        for lab, t in data.get("traces", {}).items()
    }
    return SweepDecision(cells, times, str(data["source"]), traces)


def stored_traces(store: ResultsStore) -> dict[str, Trace]:
    """The timed steps' own times per main label, as the results directory keeps them ({}: none)."""
    d = _load(store)
    return dict(d.traces) if d is not None else {}


def _save(store: ResultsStore, d: SweepDecision) -> None:
    data: dict[str, Any] = {
        "cells": {lab: dataclasses.asdict(c) for lab, c in d.cells.items()},
        "times": {lab: list(t) for lab, t in d.times.items()},
        "source": d.source,
        "traces": {lab: {"gen": list(g), "train": list(t)} for lab, (g, t) in d.traces.items()},
    }
    store.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(store.root / SWEEP_FILE, codec.dumps(data, indent=2))


def sweep_decision(
    recipe: Recipe,
    plan: Plan,
    *,
    save: bool,
    time: bool = True,
    on_wait: Callable[[], None] = lambda: None,
) -> SweepDecision | None:
    """The stored decision of the results directory, else one from timing the main candidates now
    (kept there when ``save``: the probe's; a plan only previews it; ``time`` False: nothing timed,
    nothing pruned). None without the auto sweep. ``on_wait()`` is called once first where another
    process is timing it (``save``: this one then waits for its decision)."""
    if recipe.probe.async_sweep != "auto" or not plan.offpolicy:
        return None
    store = ResultsStore.of(recipe)
    if not save:
        return _decision(recipe, plan, store, save=False, time=time)
    # one process times and decides: another probe on the directory waits, then reads its decision
    # (two at once each timed, in one scratch folder the first to end deleted; the last to save won)
    with locked_waiting(store.root / SWEEP_LOCK, on_wait):
        return _decision(recipe, plan, store, save=True, time=time)


def _decision(recipe: Recipe, plan: Plan, store: ResultsStore, *, save: bool, time: bool) -> SweepDecision:
    stored = _load(store)
    if stored is not None and set(stored.cells) == set(plan.offpolicy):
        return stored
    if not time:
        return decide(recipe, plan, {}, "not timed: every candidate is kept")
    scratch = store.root / SCRATCH
    times: dict[str, tuple[float, float]] = {}
    traces: dict[str, Trace] = {}
    try:
        for c in (plan.by_label()[lab] for lab in plan.main):
            gens, trains = _time_stages(recipe, c, scratch, plan.reference_batch)
            times[c.label] = (
                statistics.fmean(gens) if gens else math.nan,
                statistics.fmean(trains) if trains else math.nan,
            )
            traces[c.label] = (gens, trains)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    source = (
        f"{TIMED_STEPS} steps of each main candidate timed here in one process, "
        "each step's own times played through the pipeline simulation"
    )
    d = decide(recipe, plan, times, source, traces)
    if save:
        _save(store, d)
    return d


def pruned_plan(recipe: Recipe, plan: Plan, on_wait: Callable[[], None] = lambda: None) -> Plan:
    """``plan`` without the off-policy candidates the auto sweep pruned (the probe runs this one);
    ``on_wait()``: as sweep_decision's."""
    d = sweep_decision(recipe, plan, save=True, on_wait=on_wait)
    if d is None or not d.pruned:
        return plan
    gone = set(d.pruned)
    return dataclasses.replace(
        plan,
        candidates=tuple(c for c in plan.candidates if c.label not in gone),
        offpolicy=tuple(lab for lab in plan.offpolicy if lab not in gone),
    )
