"""The B_opt interval where the window fit holds (analysis/pretrain/bopt_fit.py; issue 32 item 3).

A bootstrap of the window fit itself, in three parts, each draw:

1. **Seeds**: each batch's mean log tokens redrawn from a Student t with its seeds' shrunk
   variance over its seeds and ``n - 1 + T_DOF_EXTRA`` degrees of freedom (3 seeds: 8): the
   spread of a mean whose variance is estimated from a few seeds and the pooled variance. A
   nonparametric resample of 3 seeds has 10 distinct draws per batch and reads the spread 18%
   narrow: on the recovery study's noisy curves it held the truth in 56-75% of cases, normal draws
   over one window without the bias term in 71-86%.
2. **Window**: the fit refitted over one of ``WINDOWS`` (1 to 2 octaves below the minimum, 1.5 to
   2.5 above), in turn: the choice of window is part of the estimator's error.
3. **Bias**: the draw moved by a uniform factor in ``exp(+-delta)``, ``delta = BIAS_PER_STEP`` per
   2^(1/4) of grid spacing beside the measured minimum: the window fit's error on exact data that
   no seed spread shows (on exact three-stage data refined to 2^(1/4): median ratio 1.002, up to 12.9% off;
   benchmarks/out/pretrain_refine_recovery.txt).

The interval is the (1-c)/2..(1+c)/2 quantiles of the draws, widened to hold the reported value.
Draws whose fit is not accepted take the batch with the fewest drawn tokens. The 90% interval held
the truth in 90.7% of the noisy-curve cases and 92.3% of the noisy three-stage ones
(benchmarks/out/pretrain_refine_recovery.txt; T_DOF_EXTRA and BIAS_PER_STEP were set on those).
Where the window fit is not accepted on the data, batch.py keeps the seed spread and grid bracket.
"""

from __future__ import annotations

import math

import numpy as np

from batchtune.analysis.pretrain.bopt_fit import WINDOW_ABOVE, WINDOW_BELOW, SeedMeans, fit_means
from batchtune.analysis.pretrain.refine import FINE_STEP

WINDOWS = (
    (WINDOW_BELOW, WINDOW_ABOVE),
    (2.0, 2.0**1.5),
    (2.0, 2.0**2.5),
    (4.0, 4.0),
    (2.0**1.5, 2.0**1.5),
    (2.0, 4.0),
    (2.0**1.5, 2.0**2.5),
)
T_DOF_EXTRA = 6.0  # the t's degrees of freedom: seeds - 1 + this (the pooled variance's share)
BIAS_PER_STEP = 0.05  # +-5% per 2^(1/4) of spacing beside the minimum (module docstring, part 3)
KIND = "bootstrap over seeds and fit window, with the fit's bias on exact data"


def window_interval(
    b: np.ndarray,
    s: np.ndarray,
    value: float,
    k: int,
    max_resid: float,
    confidence: float,
    n_boot: int,
    rng_seed: int,
) -> tuple[float, float] | None:
    """The interval (module docstring) around the window fit's ``value`` from steps ``s`` (seeds x
    batches, nan = not run) with the measured minimum at ``k``; None without two seeds anywhere."""
    m = SeedMeans.of(b, s)
    if not m.noise_known or n_boot < 1:
        return None
    rng = np.random.default_rng(rng_seed)
    w = m.weights()
    sd = np.sqrt(np.where(m.ok, m.var / m.n, 0.0))
    dof = m.n - 1 + T_DOF_EXTRA
    spacing = max(b[min(k + 1, b.size - 1)] / b[k], b[k] / b[max(k - 1, 0)])
    delta = BIAS_PER_STEP * math.log(spacing) / math.log(FINE_STEP)
    draws = np.empty(n_boot)
    for i in range(n_boot):
        mean = np.where(m.ok, m.mean + sd * rng.standard_t(dof), np.inf)
        fit = fit_means(b, mean, m.ok, w, max_resid, True, WINDOWS[i % len(WINDOWS)])
        draws[i] = fit[0] if fit is not None else b[int(np.argmin(mean))]
    draws *= np.exp(rng.uniform(-delta, delta, n_boot))
    lo, hi = np.quantile(draws, [0.5 - confidence / 2, 0.5 + confidence / 2])
    return float(min(lo, value)), float(max(hi, value))
