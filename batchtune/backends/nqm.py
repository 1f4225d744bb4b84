"""The noisy quadratic model (NQM): a SIMULATION backend for tests and demos, not a model.

Zhang et al. 2019, "Which Algorithmic Choices Matter at Which Batch Sizes? Insights From a Noisy
Quadratic Model" (arXiv 1907.04164). In the eigenbasis of the curvature, with d = ``nqm.dim``:

    L(theta) = 1/2 sum_i h_i theta_i^2,    h_i = 1 / i^p        (p = nqm.curvature_power)
    per-sample gradient noise covariance  C = n diag(h)       (n = nqm.noise_scale)
    minibatch gradient of B samples:      g = h * theta + eps,  eps ~ N(0, C / B)
    theta_0 = init_scale (every coordinate; deterministic, so the expected dynamics are exact)

The optimiser updates are real (SGD, Adam, AdamW in numpy); the data, the "model" and every time
are simulated. "samples" is the batch N = P * G per step; G means nothing here (there are no
prompts, only samples), it only sets N. Times are *simulated seconds* from the linear time model
in ``nqm`` (never wall clock; nothing here sleeps). See docs/nqm.md.

Expected SGD dynamics (exact, per coordinate, with alpha_t the LR of step t; no clipping):
    E[theta_i^2]_{t+1} = (1 - alpha_t h_i)^2 E[theta_i^2]_t + alpha_t^2 n h_i / B
so at a constant LR  E[theta_i^2]_t = (1 - alpha h_i)^{2t} (theta_0^2 - s_i) + s_i  with the noise
floor  s_i = alpha n / (B (2 - alpha h_i)); stable only while alpha h_max < 2.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from batchtune.backends.spec import GenRequest, GenResult, ModelInfo, OutOfMemory, RunFailed, RunSpec
from batchtune.errors import AnalysisError, BackendError
from batchtune.lr import adam_sde_hparams, scaled_lr, warmup_factor
from batchtune.recipe import NQMConfig, Recipe
from batchtune.records import StepRecord

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


def expected_sgd_losses(cfg: NQMConfig, lrs: np.ndarray, batch: int) -> np.ndarray:
    """E[L] after each of ``len(lrs)`` plain-SGD steps at ``batch`` (the recursion above; exact
    without clipping and weight decay)."""
    h = curvatures(cfg)
    th2 = np.square(initial_theta(cfg))
    out = np.empty(len(lrs))
    for t, lr in enumerate(lrs):
        th2 = (1.0 - lr * h) ** 2 * th2 + lr * lr * cfg.noise_scale * h / batch
        out[t] = 0.5 * np.dot(h, th2)
    return out


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
    batch is the B at which R(B) / R(B_ref) first exceeds 1 + tolerance (METHOD §3.2), found by a
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


# ---- the simulated time model ---------------------------------------------------------------------


def sim_decode_step_s(cfg: NQMConfig, concurrency: float) -> float:
    """Simulated seconds for one decode step of ``concurrency`` sequences: t0 + t1 * c."""
    return cfg.gen_t0_s + cfg.gen_t1_s * concurrency


def sim_train_step_s(cfg: NQMConfig, batch: float) -> float:
    """Simulated seconds for one optimiser step on ``batch`` samples: t0 + t1 * B."""
    return cfg.train_t0_s + cfg.train_t1_s * batch


# ---- training -------------------------------------------------------------------------------------


class SampleStream:
    """One seed's stream of simulated samples: per-sample noise xi_1, xi_2, ... ~ N(0, I_d).

    A batch covering samples (a, b] has gradient noise eps = sqrt(n h) * (S(b) - S(a)) / B, with
    S(x) = xi_1 + ... + xi_x, i.e. sample j contributes the offset of its own loss
    1/2 sum_i h_i (theta_i - c_ji)^2, c_ji = sqrt(n / h_i) xi_ji (Zhang et al.'s NQM as data).
    Every candidate of one seed reads the SAME stream in the same order, as a seeded data loader
    would: a batch of 2B holds exactly the samples of two consecutive batches of B (common random
    numbers, so R(B)/R(B0) compares like with like).

    Sums over dyadic blocks are drawn top-down with Levy's Brownian-bridge construction: a block of
    2^k samples with sum T splits into halves T/2 + sqrt(2^(k-2)) z and T/2 - sqrt(2^(k-2)) z, the
    exact conditional law; so a 1024-sample batch costs about one draw, not 1024. Each split draws
    from its own generator keyed by (seed, level, index): reproducible in any process, any order.
    """

    LEVELS = 40  # top blocks hold 2^40 samples: one tree for every budget

    def __init__(self, seed: int, dim: int):
        self.seed = seed % 2**32
        self.dim = dim
        self._cache: dict[tuple[int, int], np.ndarray] = {}
        self._last: tuple[int, np.ndarray] = (0, np.zeros(dim))

    def _draw(self, tag: int, level: int, index: int) -> np.ndarray:
        return np.random.default_rng([self.seed, tag, level, index]).standard_normal(self.dim)

    def block(self, level: int, index: int) -> np.ndarray:
        """Sum of xi over samples index*2^level + 1 ... (index+1)*2^level."""
        key = (level, index)
        got = self._cache.pop(key, None)
        if got is not None:
            self._cache[key] = got  # most recently used last
            return got
        if level >= self.LEVELS:
            out = math.sqrt(2.0**level) * self._draw(0xA0, level, index)
        else:
            parent = self.block(level + 1, index // 2)
            left = 0.5 * parent + math.sqrt(2.0 ** (level - 1)) * self._draw(0xB0, level + 1, index // 2)
            out = left if index % 2 == 0 else parent - left
        if len(self._cache) > 4 * self.LEVELS:  # sequential reads need ~2 blocks per level: drop LRU
            for old in list(self._cache)[: 2 * self.LEVELS]:
                del self._cache[old]
        self._cache[key] = out
        return out

    def prefix(self, x: int) -> np.ndarray:
        """S(x) = xi_1 + ... + xi_x, as the sum of the dyadic blocks of x's binary expansion."""
        if x == self._last[0]:
            return self._last[1]
        total = np.zeros(self.dim)
        pos = 0
        for level in range(x.bit_length() - 1, -1, -1):
            if x >> level & 1:
                total += self.block(level, pos >> level)
                pos += 1 << level
        return total

    def batch_sum(self, start: int, stop: int) -> np.ndarray:
        """xi_{start+1} + ... + xi_stop; reading batches in order reuses the previous prefix."""
        head = self.prefix(start)
        tail = self.prefix(stop)
        self._last = (stop, tail)
        return tail - head


class NQMBackend:
    """Noisy quadratic model training: a simulation, not a model (module docstring, docs/nqm.md).

    Each step draws a simulated minibatch gradient of N = P*G samples, applies a real SGD/Adam/AdamW
    update, and yields a StepRecord whose metrics are
      ``loss``            the true NQM loss L(theta) after the update (simulated; lower is better),
      ``sim_train_loss``  the minibatch objective at the pre-update theta, 1/2 sum g_i^2/h_i - n d/(2B),
                          centred so its mean is L(theta) (noisy, std ~ n sqrt(d/2) / B),
      ``sim_b_simple``    the true B_simple = tr(C)/|G|^2 at the pre-update theta (absent at G = 0),
    ``grad_norm`` the pre-clip minibatch gradient norm, gen_s/train_s simulated seconds, and tokens
    = samples * generation.max_new_tokens. optimizer.grad_clip <= 0 disables clipping. Raises
    RunFailed("diverged") when the loss is not finite or exceeds budget.diverge_factor x its start.
    """

    name = "nqm"

    def train(self, spec: RunSpec) -> Iterator[StepRecord]:
        recipe, cand = spec.recipe, spec.candidate
        cfg, opt = recipe.nqm, recipe.optimizer
        if opt.name not in ("sgd", "adam", "adamw"):
            raise BackendError(f"the nqm backend supports sgd, adam, adamw; not {opt.name!r}")
        batch = cand.batch_responses
        h = curvatures(cfg)
        trace_c = cfg.noise_scale * float(h.sum())
        const = cfg.noise_scale * cfg.dim / (2.0 * batch)
        stream = SampleStream(spec.seed, cfg.dim)
        noise_sd = np.sqrt(cfg.noise_scale * h) / batch
        theta = initial_theta(cfg)
        loss0 = nqm_loss(cfg, theta)
        beta1, beta2, eps = opt.beta1, opt.beta2, opt.eps
        if recipe.lr_scaling.adam_sde and not cand.fixed_lr and opt.name != "sgd":
            moved = adam_sde_hparams(beta1, beta2, eps, batch / spec.reference_batch)
            beta1, beta2, eps = moved.beta1, moved.beta2, moved.eps
        m = np.zeros(cfg.dim)
        v = np.zeros(cfg.dim)
        gen_s = sim_decode_step_s(cfg, batch) * recipe.generation.max_new_tokens
        train_s = sim_train_step_s(cfg, batch)
        samples, step = 0, 0
        while samples < recipe.budget.max_samples:
            step += 1
            samples += batch
            lr = cand.lr * warmup_factor(samples, opt.warmup_samples)
            grad = h * theta + noise_sd * stream.batch_sum(samples - batch, samples)
            grad_norm = float(np.sqrt(np.dot(grad, grad)))
            train_loss = float(0.5 * np.dot(grad, grad / h)) - const
            true_grad_sq = float(np.dot(h * theta, h * theta))
            if opt.grad_clip > 0 and grad_norm > opt.grad_clip:
                grad = grad * (opt.grad_clip / grad_norm)
            if opt.name == "sgd":
                theta = theta - lr * (grad + opt.weight_decay * theta)
            else:
                if opt.name == "adam" and opt.weight_decay:
                    grad = grad + opt.weight_decay * theta  # Adam: L2 in the gradient
                m = beta1 * m + (1 - beta1) * grad
                v = beta2 * v + (1 - beta2) * grad * grad
                m_hat = m / (1 - beta1**step)
                v_hat = v / (1 - beta2**step)
                update = m_hat / (np.sqrt(v_hat) + eps)
                if opt.name == "adamw":
                    update = update + opt.weight_decay * theta  # AdamW: decoupled decay
                theta = theta - lr * update
            loss = float(0.5 * np.dot(h, theta * theta))
            if not math.isfinite(loss) or loss > recipe.budget.diverge_factor * loss0:
                raise RunFailed(
                    "diverged",
                    f"simulated NQM loss {loss:.3g} passed {recipe.budget.diverge_factor:g}x its initial "
                    f"{loss0:.3g} at step {step} (lr {lr:.3g}; SGD is unstable above 2/h_max = "
                    f"{2 / h[0]:.3g}); lower the LR or its scaling",
                )
            metrics = {"loss": loss, "sim_train_loss": train_loss}
            if true_grad_sq > 0:
                metrics["sim_b_simple"] = trace_c / true_grad_sq
            yield StepRecord(
                run_id=spec.run_id,
                step=step,
                samples=samples,
                tokens=samples * recipe.generation.max_new_tokens,
                lr=lr,
                prompts=cand.prompts,
                group_size=cand.group_size,
                seed=spec.seed,
                metrics=metrics,
                grad_norm=grad_norm,
                gen_s=gen_s,
                train_s=train_s,
            )


# ---- generation -----------------------------------------------------------------------------------

# A notional 0.5B dense decoder (Qwen2.5-0.5B-like shape) for the roofline; nothing is loaded.
_SIM_MODEL = ModelInfo(
    name="simulated-0.5B-dense",
    n_params=0.5e9,
    n_active_params=0.5e9,
    bytes_per_param=2.0,
    n_layers=24,
    n_kv_heads=2,
    head_dim=64,
)


def sim_response_lengths(
    mode: str, n: int, max_new_tokens: int, eos_stop_prob: float, seed: int
) -> np.ndarray:
    """Lengths of one simulated batch: fixed = max_new_tokens each; eos = min(Geometric(p),
    max_new_tokens), the law (and seeding) of gen_transformers.draw_lengths, a long tail. With
    p = 0 a simulated engine has no EOS to sample, so eos equals fixed."""
    if mode == "fixed" or eos_stop_prob <= 0:
        return np.full(n, max_new_tokens, dtype=np.int64)
    rng = np.random.default_rng([seed, n, 0xE05])
    return np.minimum(rng.geometric(eos_stop_prob, size=n), max_new_tokens).astype(np.int64)


class SimulatedGeneration:
    """Generation backend "simulated": a simulation, not a model or an engine. Every number it
    returns is simulated seconds or bytes, computed, never measured, and it never sleeps.

    Decode model (saturating): a step advancing c sequences takes t(c) = nqm.gen_t0_s +
    nqm.gen_t1_s * c. A static batch decodes until its longest response is done, c shrinking as
    responses finish: elapsed = sum over steps of t(c_active) = t0 * max(L) + t1 * sum(L). Fixed mode
    gives c / ((t0 + t1 c) T) responses/s, saturating at 1 / (t1 T); eos mode pays t0 for the whole
    tail while fewer sequences share it. Prefill and the prompt are not modelled. Memory (reported
    as peak_mem_bytes) = weights + KV cache of the notional 0.5B model; nqm.gen_max_concurrency > 0
    raises OutOfMemory above it.
    """

    name = "simulated"

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.cfg = recipe.nqm

    def model_info(self) -> ModelInfo:
        return _SIM_MODEL

    def generate(self, request: GenRequest) -> GenResult:
        c = request.concurrency
        cap = self.cfg.gen_max_concurrency
        if cap > 0 and c > cap:
            raise OutOfMemory(
                f"simulated KV cache holds {cap} sequences, asked for {c} (nqm.gen_max_concurrency)"
            )
        lengths = sim_response_lengths(
            request.mode, c, request.max_new_tokens, self.recipe.generation.eos_stop_prob, request.seed
        )
        elapsed_s = self.cfg.gen_t0_s * float(lengths.max()) + self.cfg.gen_t1_s * float(lengths.sum())
        m = _SIM_MODEL
        kv_bytes = 2 * m.n_layers * m.n_kv_heads * m.head_dim * m.bytes_per_param
        peak = (
            m.n_params * m.bytes_per_param + c * (request.prompt_tokens + request.max_new_tokens) * kv_bytes
        )
        return GenResult(
            responses=c, output_tokens=int(lengths.sum()), elapsed_s=elapsed_s, peak_mem_bytes=int(peak)
        )

    def train_step_s(self, batch_responses: int, seq_tokens: int) -> float:
        """Simulated seconds: nqm.train_t0_s + nqm.train_t1_s * batch (seq_tokens is ignored)."""
        return sim_train_step_s(self.cfg, batch_responses)

    def close(self) -> None:
        return None
