"""The noisy quadratic model's closed forms: loss, gradient noise scale, expected SGD dynamics and
the analytic critical batch (Zhang et al. 2019). Used by the NQM simulation backend and its tests.

See batchtune/backends/nqm.py for the model's definition.
"""

from __future__ import annotations

import math

import numpy as np

from batchtune.analysis.sample.lr import scaled_lr, warmup_factor
from batchtune.errors import AnalysisError
from batchtune.recipe.schema import NQMConfig, Recipe

# ---- the model ------------------------------------------------------------------------------------


def curvatures(cfg: NQMConfig) -> np.ndarray:
    """h_i = 1 / i^p for i = 1..dim (h_max = h_1 = 1)."""
    return 1.0 / np.arange(1, cfg.dim + 1, dtype=float) ** cfg.curvature_power


def initial_theta(cfg: NQMConfig) -> np.ndarray:
    return np.full(cfg.dim, float(cfg.init_scale))


def nqm_loss(cfg: NQMConfig, theta: np.ndarray) -> float:
    """The true (noise-free) loss L(theta) = 1/2 sum h_i theta_i^2."""
    return float(0.5 * np.dot(curvatures(cfg), np.square(theta)))


def nqm_b_simple(cfg: NQMConfig, theta: np.ndarray) -> float:
    """McCandlish et al. 2018's simple noise scale at theta: B_simple = tr(C) / |G|^2.

    tr(C) = n sum_i h_i and G = h * theta (the true gradient), so E|g_B|^2 = |G|^2 (1 + B_simple/B).
    """
    h = curvatures(cfg)
    grad_sq = float(np.sum(np.square(h * theta)))
    return math.inf if grad_sq == 0 else float(cfg.noise_scale * h.sum() / grad_sq)


def nqm_minibatch_gradient(
    cfg: NQMConfig, theta: np.ndarray, batch: int, rng: np.random.Generator
) -> np.ndarray:
    """One simulated minibatch gradient g = h * theta + eps, eps ~ N(0, n diag(h) / batch)."""
    h = curvatures(cfg)
    return h * theta + np.sqrt(cfg.noise_scale * h / batch) * rng.standard_normal(cfg.dim)


def expected_sgd_moments(
    cfg: NQMConfig, lrs: np.ndarray, batch: int, start: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(E[L] after each of ``len(lrs)`` plain-SGD steps at ``batch``, E[theta_i^2] after the last),
    from ``start`` = E[theta_i^2] (default: the initial point). The recursion above; exact without
    clipping and weight decay."""
    h = curvatures(cfg)
    th2 = np.square(initial_theta(cfg)) if start is None else np.asarray(start, dtype=float)
    out = np.empty(len(lrs))
    for t, lr in enumerate(lrs):
        th2 = (1.0 - lr * h) ** 2 * th2 + lr * lr * cfg.noise_scale * h / batch
        out[t] = 0.5 * np.dot(h, th2)
    return out, th2


def expected_sgd_losses(cfg: NQMConfig, lrs: np.ndarray, batch: int) -> np.ndarray:
    """E[L] after each of ``len(lrs)`` plain-SGD steps at ``batch`` from the initial point."""
    return expected_sgd_moments(cfg, lrs, batch)[0]


def expected_samples_to_target(
    cfg: NQMConfig, *, lr: float, batch: int, target_loss: float, warmup_samples: float, max_samples: float
) -> float:
    """Samples until the EXPECTED SGD loss first reaches ``target_loss`` (linear interpolation
    between steps); inf if not within ``max_samples``, or if the peak LR is unstable (lr * h_max >= 2:
    the expected loss eventually grows without bound).

    Warmup steps are iterated; after warmup the closed form at constant LR is used. Coordinates
    that start below their floor s_i rise while the rest fall, so the closed form is scanned in
    chunks of 256 steps until the rising ones have settled; from then on E[L] falls monotonically
    and the first step at or below the target is found by doubling and bisection (exact, fast).
    """
    h = curvatures(cfg)
    n = cfg.noise_scale
    max_steps = int(min(math.floor(max_samples / batch), 2**40))
    th2 = np.square(initial_theta(cfg))
    prev = 0.5 * float(np.dot(h, th2))
    if lr * h[0] >= 2.0:
        return math.inf
    if prev <= target_loss:
        return 0.0

    def crossing(t: int, before: float, after: float) -> float:  # t: first step at or below target
        return float(batch * (t - 1 + (before - target_loss) / (before - after)))

    t = 0
    while t < max_steps and warmup_factor((t + 1) * batch, warmup_samples) < 1.0:
        a = lr * warmup_factor((t + 1) * batch, warmup_samples)
        th2 = (1.0 - a * h) ** 2 * th2 + a * a * n * h / batch
        t += 1
        cur = 0.5 * float(np.dot(h, th2))
        if cur <= target_loss:
            return crossing(t, prev, cur)
        prev = cur
    q = (1.0 - lr * h) ** 2
    floor = lr * n / (batch * (2.0 - lr * h))  # s_i
    if 0.5 * float(np.dot(h, floor)) >= target_loss:
        return math.inf  # the floor is at or above the target: never reached in expectation
    t0, gap = t, th2 - floor

    def loss_at(k: np.ndarray) -> np.ndarray:  # E[L] at steps t0 + k (closed form)
        return 0.5 * ((q[None, :] ** k[:, None]) * gap + floor) @ h

    # Coordinates below their floor rise while the rest fall: scan in chunks until the rising ones
    # have settled (in practice the stiff ones, within ~1/(alpha h) steps); from then on L falls.
    rising = gap < 0
    k = 0
    while np.any(rising) and np.max(q[rising] ** k * -gap[rising] * h[rising]) > 1e-12 * target_loss:
        losses = loss_at(np.arange(k, k + 257))
        hit = np.flatnonzero(losses[1:] <= target_loss)
        if hit.size:
            j = k + int(hit[0]) + 1
            if t0 + j > max_steps:
                return math.inf
            return crossing(t0 + j, float(losses[j - k - 1]), float(losses[j - k]))
        k += 256
        if t0 + k >= max_steps:
            return math.inf

    def one(j: int) -> float:
        return float(loss_at(np.array([k + j]))[0])

    # Monotone from k on: doubling, then bisection for the first step at or below the target.
    hi = 1
    while one(hi) > target_loss:
        hi *= 2
        if t0 + k + hi // 2 >= max_steps:
            return math.inf
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if one(mid) > target_loss:
            lo = mid
        else:
            hi = mid
    if t0 + k + hi > max_steps:
        return math.inf
    return crossing(t0 + k + hi, one(hi - 1), one(hi))


def nqm_critical_batch(
    cfg: NQMConfig,
    *,
    target_loss: float,
    base_lr: float,
    reference_batch: int,
    rule: str,
    tolerance: float,
    warmup_samples: float,
) -> float:
    """The critical batch of the NQM under an LR scaling rule, from the exact expected SGD loss.

    Derivation. For plain SGD the second moments obey the linear recursion in the module docstring
    (take E of theta' = (1 - alpha h) theta - alpha eps, eps independent of theta, Var eps_i = n h_i/B),
    so E[L_t] = 1/2 sum_i h_i E[theta_i^2]_t is known in closed form at constant LR (step by step
    under warmup). With alpha(B) = scaled_lr(base_lr, B, reference_batch, rule) let
    R(B) = B * t*(B), t* the first (interpolated) step with E[L_t] <= target_loss. The critical
    batch is the B at which R(B) / R(B_ref) first exceeds 1 + tolerance (docs/method.md §3.2), found by a
    log-spaced scan then bisection in log B. Why it ends: at small alpha h_i the dynamics in
    samples depend only on alpha / B (invariance under the linear rule), with floor s_i ~ (alpha/B) n/2;
    as alpha h_i grows the floor rises by 2 / (2 - alpha h_i) in the stiff directions and the run
    diverges at alpha h_max = 2 (the curvature limit of Zhang et al.). Returns inf when no batch up
    to 2^20 x reference_batch leaves the tolerance.

    Limits: plain SGD without clipping or weight decay (Adam has no closed form here: measure it).
    This is the critical batch of the EXPECTED loss. A probe reads the first crossing of a smoothed
    noisy curve: within a few per cent of this well inside the stable range, but clearly earlier
    near the stability edge, where the stiff directions fluctuate strongly (docs/nqm.md: at
    alpha h_max = 1.92 the measured ratio was 1.23-1.70 against 1.70 expected).
    """
    if rule not in ("sqrt", "linear", "none"):
        raise AnalysisError(
            f"nqm_critical_batch needs a continuous LR rule (sqrt, linear, none), not {rule!r}"
        )

    def ratio_excess(batch: float, r_ref: float) -> float:
        lr = scaled_lr(base_lr, batch, reference_batch, rule)
        b = max(1, int(round(batch)))
        cap = (1 + tolerance) * r_ref * 1.01 + b
        r = expected_samples_to_target(
            cfg, lr=lr, batch=b, target_loss=target_loss, warmup_samples=warmup_samples, max_samples=cap
        )
        return r / r_ref - (1 + tolerance)

    r_ref = expected_samples_to_target(
        cfg,
        lr=base_lr,
        batch=reference_batch,
        target_loss=target_loss,
        warmup_samples=warmup_samples,
        max_samples=2.0**60,
    )
    if not math.isfinite(r_ref) or r_ref <= 0:
        raise AnalysisError(
            f"the reference batch {reference_batch} at lr {base_lr} never reaches loss {target_loss} "
            "in expectation (below its noise floor, or unstable): raise the target or lower the LR"
        )
    lo = float(reference_batch)
    for k in range(1, 81):
        hi = reference_batch * 2.0 ** (k / 4)
        if ratio_excess(hi, r_ref) > 0:
            break
        lo = hi
    else:
        return math.inf
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if ratio_excess(mid, r_ref) > 0:
            hi = mid
        else:
            lo = mid
        if hi - lo < 0.5:
            break
    return lo


def nqm_critical_batch_for_recipe(recipe: Recipe) -> float:
    """nqm_critical_batch with the recipe's nqm section, target, base LR, rule and warmup."""
    if recipe.optimizer.name != "sgd":
        raise AnalysisError("the NQM critical batch is known in closed form for optimizer.name = 'sgd' only")
    ref = recipe.lr_scaling.reference_batch or min(recipe.candidates.prompts) * recipe.candidates.group_size
    return nqm_critical_batch(
        recipe.nqm,
        target_loss=recipe.target.value,
        base_lr=recipe.optimizer.lr,
        reference_batch=ref,
        rule=recipe.lr_scaling.rule,
        tolerance=recipe.target.tolerance,
        warmup_samples=recipe.optimizer.warmup_samples,
    )
