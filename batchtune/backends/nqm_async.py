"""The noisy quadratic model with stale gradients and several updates per batch (issue 30, item 7).

Ground truth for the async decision, beside nqm_theory.py (whose on-policy behaviour is unchanged).
Update n (0-based) belongs to batch b = n // u; the batch's gradient noise is drawn once and reused
by its u updates (u epochs over the same samples), and the gradient is evaluated at the weights of
d updates ago (a delayed gradient, the NQM's stand-in for a rollout generated k updates earlier):

    theta_{n+1} = theta_n - alpha (h * theta_{n-d} + eps_b),    eps_b ~ N(0, n diag(h) / B)

with theta_{-1} = ... = theta_{-d} = theta_0. Samples after update n: B (n + 1) / u (a batch
is consumed evenly by its u updates; crossings are interpolated between updates).
Per coordinate the state z = (theta_n, ..., theta_{n-d}, eps_b) evolves linearly, so its second
moment matrix obeys an exact recursion: M <- A M A^T per update, and at each batch start the eps
row and column are reset to (n h / B, 0). E[L_n] = 1/2 sum_i h_i M_i[0, 0]: the expected loss is
exact (no clipping, no weight decay, plain SGD). ``simulate_samples_to_target`` runs the same
dynamics with drawn noise, several seeds at once: the cheap, probe-like estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from batchtune.analysis.sample.monotone import monotone_crossing
from batchtune.backends.nqm_theory import curvatures, initial_theta, nqm_loss
from batchtune.errors import AnalysisError
from batchtune.recipe.schema import NQMConfig


def _check(batch: int, delay: int, updates_per_batch: int) -> None:
    if batch < 1 or delay < 0 or updates_per_batch < 1:
        raise AnalysisError(
            f"need batch >= 1, delay >= 0, updates_per_batch >= 1 (got {batch}, {delay}, {updates_per_batch})"
        )


def _moments(cfg: NQMConfig, lr: float, batch: int, delay: int, u: int) -> Iterator[float]:
    """Yields E[L] after each update (module docstring), exact, for as long as it is asked."""
    h = curvatures(cfg)
    d, e = delay, delay + 1  # rows 0..d: theta history; row e: the batch noise
    th0 = initial_theta(cfg)
    m = np.zeros((cfg.dim, d + 2, d + 2))
    m[:, : d + 1, : d + 1] = (th0 * th0)[:, None, None]
    var = cfg.noise_scale * h / batch
    ah = (lr * h)[:, None]
    n = 0
    while True:
        if n % u == 0:  # a fresh batch: new, independent noise
            m[:, e, :] = 0.0
            m[:, :, e] = 0.0
            m[:, e, e] = var
        new = m[:, 0, :] - ah * m[:, d, :] - lr * m[:, e, :]  # row of the new theta: A M
        rows = np.concatenate([new[:, None, :], m[:, :d, :], m[:, e : e + 1, :]], axis=1)
        newc = rows[:, :, 0] - ah * rows[:, :, d] - lr * rows[:, :, e]  # (A M) A^T: columns
        m = np.concatenate([newc[:, :, None], rows[:, :, :d], rows[:, :, e : e + 1]], axis=2)
        n += 1
        yield 0.5 * float(np.dot(h, m[:, 0, 0]))


def expected_async_losses(
    cfg: NQMConfig, *, lr: float, batch: int, delay: int, updates_per_batch: int, n_updates: int
) -> np.ndarray:
    """E[L] after each of ``n_updates`` updates (module docstring), exact."""
    _check(batch, delay, updates_per_batch)
    gen = _moments(cfg, lr, batch, delay, updates_per_batch)
    return np.array([next(gen) for _ in range(n_updates)])


def _samples_at(n: int, batch: int, u: int, before: float, after: float, target: float) -> float:
    """Samples at the crossing between updates n - 1 and n, interpolated linearly, counting each
    update as B / u samples (we choose: a batch is consumed evenly by its u updates)."""
    frac = 1.0 if n == 0 or before <= after else (before - target) / (before - after)
    return batch * (n + min(1.0, max(0.0, frac))) / u


def expected_async_samples_to_target(
    cfg: NQMConfig,
    *,
    lr: float,
    batch: int,
    delay: int,
    updates_per_batch: int,
    target_loss: float,
    max_updates: int = 20000,
) -> float:
    """Samples until the expected loss first reaches ``target_loss``; inf if not within
    ``max_updates``, if the loss runs away (unstable), or if it has settled above the target (its
    best over the last half of the updates so far improves on the first half's by < 1e-4)."""
    _check(batch, delay, updates_per_batch)
    gen = _moments(cfg, lr, batch, delay, updates_per_batch)
    losses: list[float] = []
    loss0 = nqm_loss(cfg, initial_theta(cfg))
    for n in range(max_updates):
        cur = next(gen)
        if cur <= target_loss:
            before = losses[-1] if losses else loss0
            return _samples_at(n, batch, updates_per_batch, before, cur, target_loss)
        if not math.isfinite(cur) or cur > 1e6 * loss0:
            return math.inf
        losses.append(cur)
        settled = n >= 256 and n & (n - 1) == 0  # checked at powers of two
        if settled and min(losses[n // 2 :]) >= (1 - 1e-4) * min(losses[: n // 2]):
            return math.inf
    return math.inf


def expected_async_step_samples_to_target(
    cfg: NQMConfig,
    *,
    lr: float,
    batch: int,
    delay: int,
    updates_per_batch: int,
    target_loss: float,
    max_updates: int = 20000,
) -> float:
    """Samples until the expected loss READ AT STEP ENDS (after each batch's u updates, where a
    trainer evaluates and the probe's backend logs ``loss``) first reaches ``target_loss``, linear
    between step ends (step j ends at B (j + 1) samples); inf as ``expected_async_samples_to_target``.
    With u = 1 the two are the same; with u > 1 this one never credits a dip inside a reused batch."""
    _check(batch, delay, updates_per_batch)
    u = updates_per_batch
    loss0 = nqm_loss(cfg, initial_theta(cfg))
    kw = dict(lr=lr, batch=batch, delay=delay, updates_per_batch=u)
    r = expected_async_samples_to_target(cfg, target_loss=target_loss, max_updates=max_updates, **kw)  # type: ignore[arg-type]
    if not math.isfinite(r) or u == 1:
        return r
    # the step-end curve crosses within a batch of the per-update one, or later: run 4x as long
    n = min(max_updates, u * (4 * math.ceil(r / batch) + 1))
    ends = expected_async_losses(cfg, n_updates=n, **kw)  # type: ignore[arg-type]
    hit = np.flatnonzero(ends[u - 1 :: u] <= target_loss)
    if not hit.size:
        return math.inf
    j = int(hit[0])
    before = float(ends[u * j - 1]) if j else loss0
    return _samples_at(j, batch, 1, before, float(ends[u * j + u - 1]), target_loss)


SMOOTH = 0.25  # half-width of the probe's moving average, as a share of the raw crossing's update
SHRINK_FROM = math.inf  # seeds beyond which the half-width shrinks as SHRINK_FROM / seeds; inf: never
# (benchmarks/async_nqm_smoothing.py: 8 removes the late-reading floor but not the top-up's misses)


def simulate_samples_to_target(
    cfg: NQMConfig,
    *,
    lr: float,
    batch: int,
    delay: int,
    updates_per_batch: int,
    target_loss: float,
    seeds: list[int],
    max_updates: int = 20000,
    shrink_from: float = SHRINK_FROM,
    reading: str = "smoothed",
    at: str = "update",
    per_seed: bool = True,
) -> tuple[float, list[float]]:
    """A probe of the drawn dynamics, one run per seed: (samples at the first crossing of the
    seed-averaged loss curve, each seed's own first crossing), both read after a centred moving
    average of half-width SMOOTH x the raw crossing's update count x min(1, shrink_from / seeds
    averaged) (a single seed's curve: the full width; the default shrink_from inf: always the full
    width). The average keeps a noisy curve's first crossing from being read early, but on a convex,
    decelerating approach it lifts the curve (Jensen) and reads the crossing late by a bias more
    seeds do not remove: at 256 seeds up to 6.5% on the held-out candidates near the best, 55% on one
    reported one. shrink_from=8 removes that floor (1.8%, 2.5%) but reads a flat approach early (5%
    on a fresh one) and is noisier at 64 seeds; fed to the top-up's shipped rule it left the held-out
    max regret at 1.107 and raised the fresh set's from 1.031 to 1.116, so it is not the default
    (benchmarks/async_nqm_smoothing.py, async_nqm_seqtest.py --shrink-from 8).
    A crossing counts only when the run then stays below its initial loss for as many updates again
    (capped at ``max_updates``):
    a probe that sees a run blow up after the crossing rejects it (inf). inf when not reached.
    reading="isotonic" (opt-in, not the default): both crossings read instead from the curve's
    isotonic fit (``read_isotonic_crossing``; no smoothing, shrink_from unused): held-out worst
    bias 3.7% at 256 seeds, but a 64-seed sd of 0.047 against 0.034 (async_nqm_smoothing.py).
    at="step": the curves are read at step ends only (after each batch's u updates, as the probe's
    backend logs ``loss``; the truth to match is ``expected_async_step_samples_to_target``), each
    point B samples. per_seed=False: skip the seeds' own crossings (returned empty)."""
    if reading not in ("smoothed", "isotonic"):
        raise AnalysisError(f"reading must be 'smoothed' or 'isotonic' (got {reading!r})")
    if at not in ("update", "step"):
        raise AnalysisError(f"at must be 'update' or 'step' (got {at!r})")
    curves = simulate_loss_curves(
        cfg, lr=lr, batch=batch, delay=delay, updates_per_batch=updates_per_batch,
        target_loss=target_loss, seeds=seeds, max_updates=max_updates,
    )  # fmt: skip
    if at == "step":
        curves, updates_per_batch = curves[updates_per_batch - 1 :: updates_per_batch], 1
    loss0 = nqm_loss(cfg, initial_theta(cfg))

    def crossing(c: np.ndarray, averaged: int) -> float:
        if reading == "isotonic":
            return read_isotonic_crossing(
                c, target_loss=target_loss, batch=batch, updates_per_batch=updates_per_batch, loss0=loss0
            )
        w = probe_half_width(c, target_loss, averaged, shrink_from)
        return read_crossing(
            c,
            target_loss=target_loss,
            batch=batch,
            updates_per_batch=updates_per_batch,
            loss0=loss0,
            half_width=w,
        )

    mean = crossing(curves.mean(axis=1), len(seeds))
    return mean, [crossing(curves[:, i], 1) for i in range(len(seeds))] if per_seed else []


def simulate_loss_curves(
    cfg: NQMConfig,
    *,
    lr: float,
    batch: int,
    delay: int,
    updates_per_batch: int,
    target_loss: float,
    seeds: list[int],
    max_updates: int = 20000,
) -> np.ndarray:
    """The drawn dynamics (module docstring), one run per seed: the loss after each update (rows) of
    each seed (columns), run until the seed-averaged loss first reaches ``target_loss`` and as long
    again (at most ``max_updates`` rows); inf from a run's blow-up on."""
    _check(batch, delay, updates_per_batch)
    h = curvatures(cfg)
    d, u = delay, updates_per_batch
    rngs = [np.random.default_rng([s, batch, d, u, 0xA5]) for s in seeds]
    hist = [np.tile(initial_theta(cfg), (len(seeds), 1)) for _ in range(d + 1)]  # hist[0]: current
    sd = np.sqrt(cfg.noise_scale * h / batch)
    loss0 = nqm_loss(cfg, initial_theta(cfg))
    eps = np.zeros((len(seeds), cfg.dim))
    curves = np.full((max_updates, len(seeds)), np.inf)
    stop = max_updates
    for n in range(max_updates):
        if n >= stop:
            break
        if n % u == 0:
            eps = sd * np.stack([r.standard_normal(cfg.dim) for r in rngs])
        new = hist[0] - lr * (h * hist[d] + eps)
        hist = [new, *hist[:d]]
        curves[n] = 0.5 * (new * new) @ h
        if not np.all(np.isfinite(curves[n])) or np.any(curves[n] > 1e6 * loss0):
            curves[n:] = np.inf
            break
        if stop == max_updates and np.mean(curves[n]) <= target_loss:
            stop = min(max_updates, 2 * n + 2)  # confirm: run as long again
    return curves[:stop]


def probe_half_width(
    curve: np.ndarray, target_loss: float, averaged: int, shrink_from: float = SHRINK_FROM
) -> int:
    """The probe's moving-average half-width for a curve averaged over ``averaged`` seeds: SMOOTH x
    the raw crossing's update count x min(1, shrink_from / averaged); 0 when the curve never crosses."""
    raw = np.flatnonzero(curve <= target_loss)
    return int(SMOOTH * raw[0] * min(1.0, shrink_from / averaged)) if raw.size else 0


def read_crossing(
    curve: np.ndarray,
    *,
    target_loss: float,
    batch: int,
    updates_per_batch: int,
    loss0: float,
    half_width: int,
) -> float:
    """Samples at the first crossing of ``curve`` (loss per update) after a centred moving average of
    ``half_width`` (none when 0, when the curve is not finite, or when it is too short); inf when it
    does not cross, or when the curve reaches ``loss0`` again after the crossing."""
    c, w, stop = curve, half_width, len(curve)
    if w > 0 and np.all(np.isfinite(c)) and stop > 2 * w:  # centred moving average
        c = c.copy()
        c[w : stop - w] = np.convolve(curve, np.ones(2 * w + 1) / (2 * w + 1), mode="valid")
    hit = np.flatnonzero(c <= target_loss)
    if not hit.size or np.any(c[hit[0] :] >= loss0):
        return math.inf
    n = int(hit[0])
    before = float(c[n - 1]) if n else loss0
    return _samples_at(n, batch, updates_per_batch, before, float(c[n]), target_loss)


def read_isotonic_crossing(
    curve: np.ndarray, *, target_loss: float, batch: int, updates_per_batch: int, loss0: float
) -> float:
    """Samples where the isotonic (non-increasing) fit of ``curve`` (loss per update, with loss0 at
    0 samples before it) reaches ``target_loss`` (analysis/sample/monotone.monotone_crossing: the
    torch probe's reading; noise cannot make the fit cross early, and it needs no smoothing).
    Update n ends at B (n + 1) / u samples, as ``_samples_at`` counts them. The fit covers the
    finite prefix (a blown-up run is inf from its blow-up on); inf when it does not cross, or when
    the curve reaches ``loss0`` again at or after the crossing (as ``read_crossing``)."""
    finite = np.flatnonzero(~np.isfinite(curve))
    stop = int(finite[0]) if finite.size else len(curve)
    samples = batch * np.arange(len(curve) + 1, dtype=float) / updates_per_batch
    loss = np.r_[loss0, curve[:stop]]
    r = monotone_crossing(samples[: stop + 1], -loss, -target_loss)
    if r is None or np.any(curve[samples[1:] >= r] >= loss0):
        return math.inf
    return r
