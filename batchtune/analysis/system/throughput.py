"""System efficiency from measurements: generation saturation, training time, end to end.

docs/method.md §4. Decoding re-reads every weight at each engine step, so at small concurrency the time per
step barely grows and throughput rises almost linearly; it saturates when decoding turns
compute-bound or memory caps concurrency. Training time grows roughly linearly with batch. The
end-to-end throughput of one RL step is the batch divided by the sum of its phases.

The knee of the generation curve (the critical generation batch) is ``knee.py``'s. All functions
take arrays and return small frozen records; nothing here measures anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear

from batchtune.errors import AnalysisError


def _positive_finite(name: str, values: object) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(values, dtype=float))
    if arr.ndim != 1:
        raise AnalysisError(f"{name} must be a flat list of numbers, got shape {arr.shape}.")
    if arr.size == 0:
        raise AnalysisError(f"{name} is empty: no measured points to analyse.")
    if not np.all(np.isfinite(arr)):
        raise AnalysisError(f"{name} contains NaN or inf: {arr.tolist()}. Drop failed points first.")
    if np.any(arr <= 0):
        raise AnalysisError(f"{name} must be > 0, got {arr.tolist()}. Drop failed or empty points.")
    return arr


def paired_arrays(x_name: str, x: object, y_name: str, y: object) -> tuple[np.ndarray, np.ndarray]:
    xa, ya = _positive_finite(x_name, x), _positive_finite(y_name, y)
    if xa.shape != ya.shape:
        raise AnalysisError(f"{x_name} has {xa.size} values but {y_name} has {ya.size}.")
    return xa, ya


def _nonneg_lsq(design: np.ndarray, target: np.ndarray, what: str) -> np.ndarray:
    """Least squares with both coefficients >= 0; columns scaled for conditioning."""
    scale = np.max(np.abs(design), axis=0)
    scale[scale == 0] = 1.0
    res = lsq_linear(design / scale, target, bounds=(0.0, np.inf), method="bvls")
    coef = res.x / scale
    if not res.success or not np.all(np.isfinite(coef)):
        raise AnalysisError(f"the {what} fit did not converge ({res.message}); check the points.")
    return coef


def _drop_roundoff(t0: float, t1: float, x: np.ndarray) -> tuple[float, float]:
    """Zero a coefficient whose term is round-off next to the other (a bound that is active)."""
    fixed, per_unit = float(t0), float(t1) * float(np.max(x))
    if per_unit <= 1e-10 * fixed:
        t1 = 0.0
    if fixed <= 1e-10 * per_unit:
        t0 = 0.0
    return float(t0), float(t1)


# --- Generation: the saturating model and its knee ------------------------------------------------


@dataclass(frozen=True)
class GenThroughputFit:
    """Saturating decode model: ``t(c) = t0_s + t1_s * c``, ``thr(c) = c / (t0_s + t1_s * c)``.

    ``t(c)`` is the time the engine needs to advance ``c`` concurrent sequences by one unit of
    output (one response, or one token: the model is unit-agnostic, so ``thr`` is in whatever unit
    the fitted throughput was in, responses/s or tokens/s, and ``t0_s``/``t1_s`` are seconds per
    that unit). ``t0_s`` is the per-step cost paid regardless of concurrency (re-reading the
    weights), ``t1_s`` the cost per extra sequence (compute, KV reads). Throughput saturates at
    ``max_throughput = 1 / t1_s`` (inf when ``t1_s == 0``: no saturation seen).
    """

    t0_s: float
    t1_s: float
    max_throughput: float
    n_points: int
    residual_rms_rel: float

    def predict(self, concurrency: object) -> np.ndarray:
        """Throughput at ``concurrency`` (array); 0 where concurrency <= 0."""
        c = np.asarray(concurrency, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            thr = c / (self.t0_s + self.t1_s * c)
        return np.where(c > 0, thr, 0.0)


def fit_gen_throughput(concurrency: object, throughput: object) -> GenThroughputFit:
    """Fit ``thr(c) = c / (t0 + t1 c)`` to measured (concurrency, throughput) points.

    We choose the linearised form ``y = c / thr = t0 + t1 c`` (time per step) fitted by weighted
    least squares with weights ``1 / y``: this minimises the *relative* error of the time per step,
    which to first order is the relative error of the throughput, so the small-concurrency points
    (small absolute throughput) count as much as the saturated ones. Both coefficients are
    constrained to be >= 0 (a negative ``t0`` or ``t1`` is unphysical: super-linear throughput);
    ``t1 = 0`` means the data show no saturation. Needs >= 2 distinct concurrencies.
    """
    c, thr = paired_arrays("concurrency", concurrency, "throughput", throughput)
    if np.unique(c).size < 2:
        raise AnalysisError(
            f"need throughput at >= 2 distinct concurrencies to fit saturation, got {c.tolist()}; "
            "profile at least two concurrency levels (e.g. a doubling)."
        )
    y = c / thr
    design = np.column_stack([np.ones_like(c), c]) / y[:, None]
    t0, t1 = _nonneg_lsq(design, np.ones_like(c), "generation-throughput")
    t0, t1 = _drop_roundoff(t0, t1, c)
    if t0 == 0.0 and t1 == 0.0:
        raise AnalysisError(f"generation-throughput fit collapsed to zero time for {thr.tolist()}.")
    fit_thr = c / (t0 + t1 * c)
    rms = float(np.sqrt(np.mean((fit_thr / thr - 1.0) ** 2)))
    return GenThroughputFit(
        t0_s=float(t0),
        t1_s=float(t1),
        max_throughput=float(1.0 / t1) if t1 > 0 else math.inf,
        n_points=int(c.size),
        residual_rms_rel=rms,
    )


# --- Training time and end to end -----------------------------------------------------------------


@dataclass(frozen=True)
class TrainTimeFit:
    """Training time per step: ``t(N) = t0_s + t1_s_per_sample * N`` (docs/method.md §4: roughly linear).

    ``assumed_proportional`` is True when only one batch size was measured: the model is then the
    proportional ``t(N) = t1 N`` through the origin (no fixed cost), which overstates the time of
    larger batches' fixed part and so, if anything, understates their throughput gain.
    """

    t0_s: float
    t1_s_per_sample: float
    n_points: int
    residual_rms_rel: float
    assumed_proportional: bool = False

    def predict(self, batch: object) -> np.ndarray:
        """Step time in seconds at ``batch`` samples (array)."""
        return self.t0_s + self.t1_s_per_sample * np.asarray(batch, dtype=float)


def fit_train_time(batch: object, step_time_s: object) -> TrainTimeFit:
    """Fit ``t = t0 + t1 N`` by least squares on relative error, ``t0, t1 >= 0``.

    One distinct batch (one point, or repeats of one batch): proportional model through the origin
    from the median time, flagged ``assumed_proportional``. Zero points: AnalysisError.
    """
    n, t = paired_arrays("batch", batch, "step_time_s", step_time_s)
    if np.unique(n).size < 2:
        t1 = float(np.median(t) / n[0])
        rms = float(np.sqrt(np.mean((t1 * n / t - 1.0) ** 2)))
        return TrainTimeFit(0.0, t1, int(n.size), rms, assumed_proportional=True)
    design = np.column_stack([np.ones_like(n), n]) / t[:, None]
    t0, t1 = _nonneg_lsq(design, np.ones_like(n), "training-time")
    t0, t1 = _drop_roundoff(t0, t1, n)
    if t1 == 0.0:
        raise AnalysisError(
            f"training time does not grow with batch ({dict(zip(n.tolist(), t.tolist(), strict=True))}); "
            "check that the step times were measured at the batches given."
        )
    rms = float(np.sqrt(np.mean(((t0 + t1 * n) / t - 1.0) ** 2)))
    return TrainTimeFit(float(t0), float(t1), int(n.size), rms)


def generation_time_s(batch_responses: float, gen_fit: GenThroughputFit, max_concurrency: float) -> float:
    """Time to generate ``N`` responses with at most ``max_concurrency`` decoding at once.

    ``t_gen = N / thr(min(N, max_concurrency))``. ``gen_fit`` must be in responses/s. Ignores the
    ragged last wave and long-tailed lengths (docs/method.md §4: profile real lengths for that).
    """
    n = float(_positive_finite("batch_responses", batch_responses)[0])
    cap = float(_positive_finite("max_concurrency", max_concurrency)[0])
    thr = float(gen_fit.predict(min(n, cap)))
    if not (math.isfinite(thr) and thr > 0):
        raise AnalysisError(f"generation model predicts throughput {thr} at concurrency {cap:g}.")
    return n / thr


@dataclass(frozen=True)
class EndToEnd:
    """One RL step end to end: ``responses_per_s = N / (gen_s + train_s + other_s)`` (docs/method.md §1).

    ``other_s`` holds reward, reference/old log-probs, critic and weight sync when not in the
    other two phases.
    """

    batch_responses: float
    gen_s: float
    train_s: float
    other_s: float
    step_s: float
    responses_per_s: float


def end_to_end_responses_per_s(
    batch_responses: object, gen_s: object, train_s: object, other_s: object = 0.0
) -> np.ndarray:
    """Vectorised ``N / (t_gen + t_train + t_other)`` (arrays broadcast)."""
    n = np.asarray(batch_responses, dtype=float)
    parts = [np.asarray(p, dtype=float) for p in (gen_s, train_s, other_s)]
    for name, p in zip(("gen_s", "train_s", "other_s"), parts, strict=True):
        if not np.all(np.isfinite(p)) or np.any(p < 0):
            raise AnalysisError(f"{name} must be finite and >= 0, got {p.tolist()}.")
    if not np.all(np.isfinite(n)) or np.any(n <= 0):
        raise AnalysisError(f"batch_responses must be finite and > 0, got {n.tolist()}.")
    step = parts[0] + parts[1] + parts[2]
    if np.any(step <= 0):
        raise AnalysisError("a step takes zero time (gen_s + train_s + other_s == 0).")
    return n / step


def end_to_end_throughput(
    batch_responses: float, gen_s: float, train_s: float, other_s: float = 0.0
) -> EndToEnd:
    """End-to-end throughput of one step from its phase times (seconds)."""
    thr = float(end_to_end_responses_per_s(batch_responses, gen_s, train_s, other_s))
    step = float(gen_s) + float(train_s) + float(other_s)
    return EndToEnd(float(batch_responses), float(gen_s), float(train_s), float(other_s), step, thr)


def predict_end_to_end(
    batch_responses: float,
    gen_fit: GenThroughputFit,
    train_fit: TrainTimeFit,
    max_concurrency: float,
    other_s: float = 0.0,
) -> EndToEnd:
    """docs/method.md §5 step 2: predict Θ(N) from the generation and training models at batch ``N``."""
    gen_s = generation_time_s(batch_responses, gen_fit, max_concurrency)
    train_s = float(train_fit.predict(batch_responses))
    return end_to_end_throughput(batch_responses, gen_s, train_s, other_s)
