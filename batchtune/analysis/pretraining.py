"""`batchtune pretrain`: from pre-training loss curves at several batch sizes to the critical batch
at each target loss, B_opt and B_min where the WSD fit applies, and a token-keyed batch schedule
(docs/method.md §6).

Input: per-step logs (CSV or JSON lines), one row per logged step, with a run name, the batch in
tokens, the step and the loss. For every target loss each run gives one point (S_i, E_i = B_i S_i):
the steps and tokens it needed to first reach that loss (smoothed, monotone envelope; runs that
never reach it are left out and reported).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchtune.analysis.curves import samples_to_target
from batchtune.analysis.pretrain import StepsDataFit, WSDFit, fit_steps_data, fit_wsd_data_curve
from batchtune.analysis.pretrain_schedule import ScheduleStage, kaplan_critical_batch, schedule_from_bopt
from batchtune.errors import AnalysisError, InputError

COLUMNS = ("run", "batch_tokens", "step", "loss")


@dataclass(frozen=True)
class PretrainRun:
    name: str
    batch_tokens: float
    steps: np.ndarray
    loss: np.ndarray


@dataclass(frozen=True)
class TargetFit:
    target_loss: float
    points: tuple[tuple[str, float, float, float], ...]  # (run, batch_tokens, steps, tokens)
    never_reached: tuple[str, ...]
    hyperbola: StepsDataFit | None  # McCandlish: S_min, E_min, B_crit
    wsd: WSDFit | None  # Zhou et al. 2026: B_opt, B_min
    kaplan_b_crit_tokens: float  # the published prior at this loss, for comparison only
    notes: tuple[str, ...]

    @property
    def batch_tokens(self) -> float | None:
        """The batch this target calls for: B_opt from the WSD fit, else the critical batch."""
        if self.wsd is not None:
            return self.wsd.b_opt_tokens
        return self.hyperbola.b_crit_tokens if self.hyperbola is not None else None


@dataclass(frozen=True)
class PretrainAnalysis:
    fits: tuple[TargetFit, ...]
    schedule: tuple[ScheduleStage, ...]
    schedule_note: str


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start})") from None


def read_runs(paths: Sequence[Path], columns: dict[str, str]) -> list[PretrainRun]:
    """Read per-step rows from CSV or JSON-lines files; every problem names file, line and column."""
    names = {c: columns.get(c, c) for c in COLUMNS}
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise InputError(f"{p} not found")
        if p.suffix in (".jsonl", ".json"):
            records = []
            for i, line in enumerate(_text(p).splitlines(), 1):
                if line.strip():
                    try:
                        records.append((i, json.loads(line)))
                    except json.JSONDecodeError:
                        raise InputError(f"{p}:{i}: not valid JSON") from None
        else:
            records = list(enumerate(csv.DictReader(io.StringIO(_text(p), newline="")), 2))
        if not records:
            raise InputError(f"{p} has no rows")
        for i, row in records:
            values = []
            for logical in ("batch_tokens", "step", "loss"):
                col = names[logical]
                if col not in row:
                    raise InputError(f"{p}:{i}: no column {col!r} (map it with --map {logical}=COLUMN)")
                try:
                    values.append(float(row[col]))
                except (TypeError, ValueError):
                    raise InputError(f"{p}:{i}: column {col!r}: {row[col]!r} is not a number") from None
                low = {"batch_tokens": 0.0, "step": -1.0}.get(logical, -math.inf)  # batch > 0, step >= 0
                if not (math.isfinite(values[-1]) and values[-1] > low):
                    raise InputError(f"{p}:{i}: column {col!r}: {row[col]!r} is out of range")
            run = str(row.get(names["run"], p.stem))
            rows[run].append((values[0], values[1], values[2]))
    runs = []
    for name, vals in rows.items():
        arr = np.asarray(sorted(vals, key=lambda v: v[1]))
        if len(set(arr[:, 0])) != 1:
            raise InputError(f"run {name!r} changes its batch_tokens; give each batch its own run name")
        runs.append(PretrainRun(name, float(arr[0, 0]), arr[:, 1], arr[:, 2]))
    if len({r.batch_tokens for r in runs}) < 3:
        raise InputError("need runs at 3 or more batch sizes to fit the steps-data trade-off")
    return runs


def analyse(
    runs: Sequence[PretrainRun],
    targets: Sequence[float],
    *,
    base_lr: float,
    rule: str = "sqrt",
    ema_alpha: float = 0.5,
) -> PretrainAnalysis:
    if not targets:
        losses = np.concatenate([r.loss for r in runs])
        lo, hi = np.nanpercentile(losses, [20, 60])
        targets = list(np.linspace(hi, lo, 3))
    fits = []
    for target in sorted(targets, reverse=True):  # from the easiest to the hardest loss
        points, never, notes = [], [], []
        for run in runs:
            c = samples_to_target(run.steps, run.loss, target, higher_is_better=False, ema_alpha=ema_alpha)
            if c.censored:
                never.append(run.name)
            else:
                s = float(c.samples_to_target)
                points.append((run.name, run.batch_tokens, s, s * run.batch_tokens))
        hyper = wsd = None
        if len({p[1] for p in points}) >= 3:
            s_arr = np.array([p[2] for p in points])
            e_arr = np.array([p[3] for p in points])
            try:
                hyper = fit_steps_data(s_arr, e_arr)
            except AnalysisError as exc:
                notes.append(f"hyperbola: {exc}")
            try:
                wsd = fit_wsd_data_curve(s_arr, e_arr)
            except AnalysisError as exc:
                notes.append(f"WSD E(S): {exc}")
        else:
            notes.append(f"only {len(points)} batch size(s) reached loss {target:g}: no fit")
        fits.append(
            TargetFit(
                target_loss=float(target),
                points=tuple(points),
                never_reached=tuple(never),
                hyperbola=hyper,
                wsd=wsd,
                kaplan_b_crit_tokens=float(kaplan_critical_batch(target)),
                notes=tuple(notes),
            )
        )
    usable = [f for f in fits if f.batch_tokens is not None and math.isfinite(f.batch_tokens)]
    schedule: tuple[ScheduleStage, ...] = ()
    note = "no target gave a batch: nothing to schedule"
    if usable:
        # stage k starts once the data that reaching the previous target took at its batch is spent
        starts = [0.0]
        for f in usable[:-1]:
            e_min = f.wsd.e_min_tokens if f.wsd is not None else f.hyperbola.e_min_tokens
            starts.append(max(starts[-1] + 1.0, float(e_min)))
        schedule = schedule_from_bopt(starts, [f.batch_tokens for f in usable], base_lr, rule)
        note = (
            "each stage starts once the tokens needed for the previous target loss are spent; "
            f"LR scaled by the {rule} rule from base_lr at the first stage's batch"
        )
    return PretrainAnalysis(tuple(fits), schedule, note)
