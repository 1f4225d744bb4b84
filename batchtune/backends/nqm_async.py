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

from batchtune.backends.nqm_theory import curvatures, initial_theta
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
    loss0 = 0.5 * float(np.dot(curvatures(cfg), initial_theta(cfg) ** 2))
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


SMOOTH = 0.25  # half-width of the probe's moving average, as a share of the raw crossing's update


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
) -> tuple[float, list[float]]:
    """A probe of the drawn dynamics, one run per seed: (samples at the first crossing of the
    seed-averaged loss curve, each seed's own first crossing), both read after a centred moving
    average over +-SMOOTH x the raw crossing's update count (a flat approach is read late, not
    early). A crossing counts only when the run then stays below its initial loss for as many
    updates again (capped at ``max_updates``):
    a probe that sees a run blow up after the crossing rejects it (inf). inf when not reached."""
    _check(batch, delay, updates_per_batch)
    h = curvatures(cfg)
    d, u = delay, updates_per_batch
    rngs = [np.random.default_rng([s, batch, d, u, 0xA5]) for s in seeds]
    hist = [np.tile(initial_theta(cfg), (len(seeds), 1)) for _ in range(d + 1)]  # hist[0]: current
    sd = np.sqrt(cfg.noise_scale * h / batch)
    loss0 = 0.5 * float(np.dot(h, initial_theta(cfg) ** 2))
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

    def crossing(c: np.ndarray) -> float:
        raw = np.flatnonzero(c <= target_loss)
        w = int(SMOOTH * raw[0]) if raw.size else 0
        if w > 0 and np.all(np.isfinite(c[:stop])) and stop > 2 * w:  # centred moving average
            c = c.copy()
            c[w : stop - w] = np.convolve(c[:stop], np.ones(2 * w + 1) / (2 * w + 1), mode="valid")
        hit = np.flatnonzero(c <= target_loss)
        if not hit.size or np.any(c[hit[0] : stop] >= loss0):
            return math.inf
        n = int(hit[0])
        before = float(c[n - 1]) if n else loss0
        return _samples_at(n, batch, u, before, float(c[n]), target_loss)

    return crossing(curves.mean(axis=1)), [crossing(curves[:, i]) for i in range(len(seeds))]
