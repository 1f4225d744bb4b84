"""B_opt and B_min at one target loss from what the grid of batches measured (docs/method.md §6).

The data's own evidence comes first, and is always reported:

- **B_opt, measured**: the grid batch with the fewest tokens to the target; its grid neighbours
  bracket the true minimum of E(B) (E(B) is unimodal: Zhou et al. 2026, arXiv 2601.05034).
- **B_min, bracket**: below B_min the target is never reached, so B_min lies between the largest
  batch that never reached the target (below the smallest reaching one) and the smallest batch that
  did. A never-reaching run is a lower bound only if it ran long enough; runs are capped by a budget,
  so the lower end reads "never reached within the budget".

Then a fit, checked, that refines each inside its bracket:

- **B_opt fit** (bopt_fit.py): a cubic in ``(log B, log E)`` over two octaves either side of the
  minimum, weighted by each batch's seeds over its seed variance; where that is not accepted, a
  polynomial through the measured minimum and up to four reached batches nearest it. Otherwise
  the measured minimum is reported (``b_opt_source``).
- **B_min fit**: Zhou et al.'s late stage ``E = A1 S + A0`` (``B_min = A1``) is, with ``E = B S``,
  the straight line ``1/S = (B - A1) / A0``: fitted on the smallest reached batches (3) in those
  coordinates, its root ``A1`` is B_min. Accepted when the slope and root are positive and the
  rms relative residual <= ``max_resid``; the root is then clamped to the bracket (the data win
  over the line). With no never-reaching batch below, a root under the smallest measured batch is
  an extrapolation and is labelled so; otherwise the bracket is reported.

Intervals, each labelled (``b_opt_ci_kind``, ``b_min_ci_kind``): where the B_opt window fit holds,
a bootstrap of that fit over seeds, fit windows and its bias on exact data (bopt_interval.py,
calibrated in benchmarks/pretrain_refine_recovery.py); elsewhere, and for B_min, a paired bootstrap
over seeds (a seed's runs at every batch resampled together, docs/method.md §8) in which each
resample contributes its grid bracket (``_seed_and_bracket_intervals``): the seed spread and the
grid bracket together, conservative, so agreeing seeds do not make it zero-width. None with one seed.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.pretrain.bmin_fit import fit_three_stage
from batchtune.analysis.pretrain.bopt_fit import SeedMeans, fit_b_opt
from batchtune.analysis.pretrain.bopt_interval import KIND as WINDOW_KIND
from batchtune.analysis.pretrain.bopt_interval import window_interval
from batchtune.errors import AnalysisError

DEFAULT_MAX_RESID = 0.05  # we choose: 5% rms (log or relative) before a fit is called poor
B_MIN_POINTS = 3
BRACKET_KIND = "seed spread and grid bracket (at least the bracket: conservative)"


@dataclass(frozen=True)
class BatchEstimate:
    """B_opt and B_min at ``target_loss``; batches and tokens in tokens, steps in optimiser steps.

    Per-batch values are medians over seeds (a seed that never reached counts as +inf). ``*_source``
    says what the reported value is: "fit", "measured" (B_opt: the grid minimum), "bracket" (B_min:
    geometric middle of the bracket, or its upper end when nothing below it was measured) or
    "extrapolated" (B_min: the fit's root below every measured batch).
    """

    target_loss: float
    batches_tokens: tuple[float, ...]
    steps_to_target: tuple[float, ...]
    tokens_to_target: tuple[float, ...]
    seeds_reached: tuple[int, ...]
    n_seeds: int
    b_opt_measured_tokens: float | None
    b_opt_bracket: tuple[float, float] | None
    b_opt_fit_tokens: float | None
    b_opt_fit_resid: float | None
    b_opt_tokens: float | None
    b_opt_source: str
    b_opt_ci: tuple[float, float] | None
    b_min_bracket: tuple[float | None, float] | None
    b_min_fit_tokens: float | None
    b_min_fit_resid: float | None
    b_min_tokens: float | None
    b_min_source: str
    b_min_ci: tuple[float, float] | None
    e_min_tokens: float | None  # tokens to target at the measured B_opt
    confidence: float
    notes: tuple[str, ...]
    # what each interval is ("" = none): bopt_interval.KIND where the window fit holds (calibrated
    # in benchmarks/pretrain_refine_recovery.py), else BRACKET_KIND (conservative)
    b_opt_ci_kind: str = ""
    b_min_ci_kind: str = ""
    # per batch: the standard error over seeds of its mean log tokens (nan: one seed, or a seed
    # never reached); the seed round's noise test (measure/pretrain_refine.py)
    log_tokens_se: tuple[float, ...] = ()


def _b_min(
    b: np.ndarray, s: np.ndarray, max_resid: float, flat: np.ndarray | None = None
) -> tuple[tuple | None, float | None, float | None, float | None, str, list[str]]:
    """(bracket, fit, fit residual, reported value, source, notes) from per-batch steps (inf = never).

    ``flat[i]``: batch i's never-reaching runs had plateaued above the target (None: assume so)."""
    ok = np.isfinite(s)
    if not ok.any():
        return None, None, None, None, "bracket", ["no batch reached this target: B_min above the grid"]
    first, lower, upper, below = _b_min_bracket(b, s, flat)
    notes: list[str] = []
    if below and below[-1] < first - 1 or (not below and first > 0):
        notes.append(
            "batches just below the smallest reaching one were still improving when the budget ran "
            "out: they do not bound B_min from below"
        )
    if (~ok[first:]).any():
        notes.append(
            "a batch above the smallest reaching one did not reach the target (budget or noise): "
            "it is not B_min evidence"
        )
    fit, resid, rejected = _three_stage_b_min(b, s, max_resid, lower, upper)
    if fit is None:  # the line on the smallest reached batches
        fit, resid, why = _line_b_min(b, s, max_resid, lower, upper)
        if rejected or why:
            notes.append(rejected + (why or "B_min from the line 1/S = (B - A1)/A0 instead"))
    if fit is not None and lower is None and fit < upper / 2:  # more than a doubling below the grid
        notes.append(
            f"the fit's B_min {fit:.4g} lies more than a doubling below the smallest measured batch "
            f"{upper:.4g}: not reported (measure smaller batches)"
        )
        fit = None
    if fit is not None:
        source = "fit" if lower is not None else "extrapolated"
        if lower is None:
            notes.append(f"B_min {fit:.4g} extrapolated below the smallest measured batch {upper:.4g}")
        return (lower, upper), fit, resid, fit, source, notes
    value = math.sqrt(lower * upper) if lower is not None else upper
    if lower is None:
        if first == 0:
            which = "every measured batch" if ok.all() else "the smallest measured batch"
            notes.append(f"{which} reached the target: B_min <= {upper:.4g}")
        else:  # smaller batches did not reach it but were still improving: no lower bound
            notes.append(f"the smallest batch that reached the target is {upper:.4g}: B_min <= {upper:.4g}")
    return (lower, upper), None, resid, value, "bracket", notes


def _b_min_bracket(
    b: np.ndarray, s: np.ndarray, flat: np.ndarray | None
) -> tuple[int, float | None, float, list[int]]:
    """(index of the smallest reaching batch, the bracket's low end or None, its high end, the
    indices below it that bound B_min from below); some batch must have reached the target."""
    first = int(np.argmax(np.isfinite(s)))
    below = [i for i in range(first) if flat is None or flat[i]]
    return first, (float(b[below[-1]]) if below else None), float(b[first]), below


def _line_b_min(
    b: np.ndarray, s: np.ndarray, max_resid: float, lower: float | None, upper: float
) -> tuple[float | None, float | None, str]:
    """(B_min, rms relative residual, "" or why not) from the line 1/S = (B - A1)/A0 through the
    B_MIN_POINTS smallest reached batches, its root clamped to the bracket."""
    reached = np.flatnonzero(np.isfinite(s))[:B_MIN_POINTS]
    if reached.size < 3:
        return None, None, ""
    x, y = b[reached], 1.0 / s[reached]
    slope, icpt = np.polyfit(x, y, 1, w=1.0 / y)
    if slope <= 0:
        return None, None, "steps to target do not fall with the batch near B_min: reporting the bracket"
    root = -icpt / slope
    resid = float(np.sqrt(np.mean(((slope * x + icpt) / y - 1.0) ** 2)))
    if root > 0 and resid <= max_resid:  # the data bracket wins over the line
        return float(min(max(root, lower or 0.0), upper)), resid, ""
    return (
        None,
        resid,
        (
            f"B_min line 1/S = (B - A1)/A0 rejected (root {root:.4g}, bracket "
            f"{lower or 0:.4g}..{upper:.4g}, rms residual {resid:.3f}): reporting the bracket"
        ),
    )


def _three_stage_b_min(
    b: np.ndarray, s: np.ndarray, max_resid: float, lower: float | None, upper: float
) -> tuple[float | None, float | None, str]:
    """(B_min, rms relative S residual, "" or why it was rejected) from the three-stage E(S) fit
    across every reached batch (bmin_fit.py), clamped to the bracket like the line."""
    f = fit_three_stage(b, s)
    if f is None:
        return None, None, ""
    if f.a1 > 0 and f.b >= 0 and f.resid <= max_resid:
        return float(min(max(f.a1, lower or 0.0), upper)), f.resid, ""
    return (
        None,
        None,
        (
            f"B_min three-stage fit B = A1 + A0/S + b/(S (S - S_min)) rejected (A1 {f.a1:.4g}, b {f.b:.3g}, "
            f"rms S residual {f.resid:.3f}); "
        ),
    )


def plateaued(tokens: object, loss: object, target: float, *, horizon: float = 4.0) -> bool:
    """Whether a run that never reached ``target`` had flattened out above it: the loss's slope
    against log tokens over the last half (in log tokens) of the run, projected ``horizon`` times
    further, still lies above the target. Only such a run is evidence that its batch is below B_min;
    one still falling was cut by the budget (we choose the rule; Zhou et al. give none)."""
    x, y = np.log(np.asarray(tokens, dtype=float)), np.asarray(loss, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < 4:
        return False
    tail = x >= 0.5 * (x[0] + x[-1])
    if tail.sum() < 3:
        return False
    slope, icpt = np.polyfit(x[tail], y[tail], 1)
    end = icpt + slope * x[-1]
    return bool(end + min(slope, 0.0) * math.log(horizon) > target)


def _aggregate(steps: np.ndarray) -> np.ndarray:
    """Per-batch median over the seeds that ran it (nan = not run); inf (never reached) sorts last:
    a majority must reach. np.nanmedian's answer, but without its masked-array path (~1 ms a call;
    the bootstrap calls this thousands of times): a sort puts nan after inf, and the median is the
    mean of the middle two of each column's n values (the same one twice for odd n)."""
    steps = np.asarray(steps, dtype=float)
    if steps.ndim != 2 or steps.shape[0] == 0:
        return np.asarray(np.nanmedian(steps, axis=0))
    ran = np.count_nonzero(~np.isnan(steps), axis=0)
    ordered = np.sort(steps, axis=0)
    cols = np.arange(steps.shape[1])
    lo, hi = np.maximum((ran - 1) // 2, 0), ran // 2
    out = (ordered[lo, cols] + ordered[np.minimum(hi, steps.shape[0] - 1), cols]) / 2.0
    for _ in range(int(np.count_nonzero(ran == 0))):  # as np.nanmedian warns
        warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=2)
    out[ran == 0] = np.nan
    return out


def resample_seeds(s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One paired bootstrap resample of ``s`` (seeds x batches, nan = not run): seeds drawn with
    replacement, each seed's runs at every batch together. A batch that not every seed ran keeps
    its own count of seeds: its runs among the drawn seeds, topped up by draws from its own runs."""
    n = s.shape[0]
    rows = np.asarray(rng.integers(0, n, size=(n,)), dtype=int)
    ran = ~np.isnan(s)
    if ran.all():
        return s[rows]
    out = np.full_like(s, np.nan)
    for j in range(s.shape[1]):
        mine = np.flatnonzero(ran[:, j])
        drawn: np.ndarray = rows[ran[rows, j]]
        vals = s[drawn, j][: mine.size]
        if vals.size < mine.size:
            vals = np.concatenate([vals, s[rng.choice(mine, mine.size - vals.size), j]])
        out[: vals.size, j] = vals
    return out


def _seed_and_bracket_intervals(
    b: np.ndarray,
    s: np.ndarray,
    flat: np.ndarray | None,
    max_resid: float,
    confidence: float,
    n_boot: int,
    rng_seed: int,
) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """B_opt and B_min intervals from a paired bootstrap over seeds that keeps the grid's bracket.

    Each resample gives a range, not a point: the grid bracket its data allow (B_opt: the
    neighbours of its measured minimum; B_min: its bracket, from 0 when nothing below was
    measured). A fit refines the point inside the bracket, but its error there is not known
    (on a doubling grid the B_opt fit is off by up to 10% on exact data, the B_min line by up to 2%
    on a 2^(1/2) grid), so a resample's fit alone would make the interval a point when seeds agree.
    The interval runs from the (1-c)/2 quantile of the low ends to the (1+c)/2 quantile of the high
    ends: at least the bracket, wider where the seeds disagree on it. The seed spread alone was
    zero-width when seeds agreed, and missed the truth."""
    rng = np.random.default_rng(rng_seed)
    opts: list[tuple[float, float]] = []
    mins: list[tuple[float, float]] = []
    for _ in range(n_boot):
        sm = _aggregate(resample_seeds(s, rng))
        meas, br = _measured_bracket(b, b * sm)
        if meas is not None and br is not None:
            opts.append((float(br[0]), float(br[1])))
        if np.isfinite(sm).any():  # only the bracket: the fits are not resampled (docstring)
            _, m_lo, m_hi, _ = _b_min_bracket(b, sm, flat)
            mins.append((float(m_lo or 0.0), m_hi))
    lo_q, hi_q = 0.5 - confidence / 2, 0.5 + confidence / 2

    def interval(pairs: list[tuple[float, float]]) -> tuple[float, float] | None:
        if not pairs:
            return None
        a = np.array(pairs)
        return float(np.quantile(a[:, 0], lo_q)), float(np.quantile(a[:, 1], hi_q))

    return interval(opts), interval(mins)


def _log_tokens_se(b: np.ndarray, s: np.ndarray) -> tuple[float, ...]:
    m = SeedMeans.of(b, s)
    return tuple(float(x) for x in np.where(m.ok & (m.n >= 2), np.sqrt(m.var / m.n), np.nan))


def _measured_bracket(b: np.ndarray, e: np.ndarray) -> tuple[float | None, tuple[float, float] | None]:
    """The batch with the fewest tokens ``e`` (inf = never reached) and its grid neighbours."""
    if not np.isfinite(e).any():
        return None, None
    k = int(np.argmin(np.where(np.isfinite(e), e, np.inf)))
    return float(b[k]), (float(b[max(k - 1, 0)]), float(b[min(k + 1, b.size - 1)]))


def _holding(ci: tuple[float, float] | None, value: float | None) -> tuple[float, float] | None:
    """``ci`` widened to hold the reported ``value`` (a window fit may sit outside the brackets)."""
    if ci is None or value is None or not math.isfinite(value):
        return ci
    return min(ci[0], value), max(ci[1], value)


def estimate_batches(
    batches_tokens: object,
    steps_per_seed: object,
    target_loss: float,
    *,
    confidence: float = 0.9,
    n_boot: int = 300,
    max_resid: float = DEFAULT_MAX_RESID,
    rng_seed: int = 0,
    plateaued_per_seed: object | None = None,
    ran_per_seed: object | None = None,
) -> BatchEstimate:
    """B_opt and B_min at one target from steps-to-target per seed and batch.

    ``steps_per_seed`` has shape (seeds, batches); +inf (or nan) where a run never reached the
    target. Batches must be distinct and positive; they are sorted here. ``plateaued_per_seed``
    (same shape, optional): whether each never-reaching run had flattened out above the target
    (:func:`plateaued`); a batch bounds B_min from below only if most of its runs had.
    ``ran_per_seed`` (same shape, optional): False where that seed did not run that batch (the
    refinement's seed rounds run more seeds beside B_opt); every batch needs one run.
    """
    b = np.asarray(batches_tokens, dtype=float).reshape(-1)
    s = np.atleast_2d(np.asarray(steps_per_seed, dtype=float))
    if s.shape[1] != b.size:
        raise AnalysisError(f"steps_per_seed has {s.shape[1]} batches, batches_tokens has {b.size}.")
    if b.size < 3 or np.unique(b).size != b.size or not np.all(b > 0):
        raise AnalysisError(f"need >= 3 distinct positive batches, got {b.tolist()}.")
    order = np.argsort(b)
    ran = np.ones(s.shape, dtype=bool)
    if ran_per_seed is not None:
        ran = np.atleast_2d(np.asarray(ran_per_seed, dtype=bool))
    if ran.shape != s.shape or not ran.any(axis=0).all():
        raise AnalysisError("ran_per_seed must have the shape of steps_per_seed and a run at every batch.")
    b, s, ran = b[order], s[:, order], ran[:, order]
    s = np.where(ran, np.where(np.isfinite(s) & (s > 0), s, np.inf), np.nan)
    flat = None
    if plateaued_per_seed is not None:
        pl = np.atleast_2d(np.asarray(plateaued_per_seed, dtype=bool))[:, order]
        flat = np.nanmean(np.where(ran, pl | np.isfinite(s), np.nan), axis=0) > 0.5
    s_med = _aggregate(s)
    e_med = b * s_med
    b_meas, b_br, b_fit, b_res, notes_opt, windowed = fit_b_opt(b, s, e_med, max_resid)
    m_br, m_fit, m_res, m_val, m_src, notes_min = _b_min(b, s_med, max_resid, flat)
    b_val = b_fit if b_fit is not None else b_meas
    k = None if b_meas is None else int(np.flatnonzero(b == b_meas)[0])
    opt_ci = min_ci = None
    opt_kind = ""
    if ran.sum(axis=0).max() >= 2 and b_val is not None and k is not None:
        opt_ci, min_ci = _seed_and_bracket_intervals(b, s, flat, max_resid, confidence, n_boot, rng_seed)
        opt_ci, min_ci = _holding(opt_ci, b_val), _holding(min_ci, m_val)
        at = (b, s, b_val, k, max_resid, confidence, n_boot, rng_seed)
        win_ci = window_interval(*at) if windowed else None
        opt_ci, opt_kind = (win_ci, WINDOW_KIND) if win_ci is not None else (opt_ci, BRACKET_KIND)
    return BatchEstimate(
        target_loss=float(target_loss),
        batches_tokens=tuple(float(x) for x in b),
        steps_to_target=tuple(float(x) for x in s_med),
        tokens_to_target=tuple(float(x) for x in e_med),
        seeds_reached=tuple(int(x) for x in np.isfinite(s).sum(axis=0)),
        n_seeds=int(ran.sum(axis=0).max()),
        b_opt_measured_tokens=b_meas,
        b_opt_bracket=b_br,
        b_opt_fit_tokens=b_fit,
        b_opt_fit_resid=b_res,
        b_opt_tokens=b_val,
        b_opt_source="fit" if b_fit is not None else "measured",
        b_opt_ci=opt_ci,
        b_opt_ci_kind=opt_kind,
        b_min_ci_kind=BRACKET_KIND if min_ci is not None else "",
        b_min_bracket=m_br,
        b_min_fit_tokens=m_fit,
        b_min_fit_resid=m_res,
        b_min_tokens=m_val,
        b_min_source=m_src,
        b_min_ci=min_ci,
        e_min_tokens=None if k is None else float(e_med[k]),
        confidence=float(confidence),
        notes=tuple(notes_opt + notes_min),
        log_tokens_se=_log_tokens_se(b, s),
    )
