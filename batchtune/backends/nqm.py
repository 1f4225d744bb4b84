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
import os
import zipfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from batchtune.analysis.sample.lr import adam_sde_hparams, warmup_factor
from batchtune.analysis.system.hardware import SIMULATED_DEVICE
from batchtune.backends.nqm_theory import (  # noqa: F401  (re-exported)
    curvatures,
    expected_samples_to_target,
    expected_sgd_losses,
    initial_theta,
    nqm_b_simple,
    nqm_critical_batch,
    nqm_critical_batch_for_recipe,
    nqm_loss,
    nqm_minibatch_gradient,
)
from batchtune.backends.spec import (
    GenRequest,
    GenResult,
    ModelInfo,
    OutOfMemory,
    RunFailed,
    RunSpec,
    checkpoint_path,
)
from batchtune.errors import BackendError, UnsafeCheckpoint
from batchtune.recipe.schema import NQMConfig, OptimizerConfig, Recipe
from batchtune.records.types import StepRecord

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
        self._cache: dict[int, dict[int, np.ndarray]] = {}  # level -> index -> block
        self._last: tuple[int, np.ndarray] = (0, np.zeros(dim))

    def _draw(self, tag: int, level: int, index: int) -> np.ndarray:
        return np.random.default_rng([self.seed, tag, level, index]).standard_normal(self.dim)

    def block(self, level: int, index: int) -> np.ndarray:
        """Sum of xi over samples index*2^level + 1 ... (index+1)*2^level."""
        got = self._cache.get(level, {}).get(index)
        if got is not None:
            return got
        if level >= self.LEVELS:
            out = math.sqrt(2.0**level) * self._draw(0xA0, level, index)
        else:  # one draw splits the parent: keep both halves, as a sequential read wants the other next
            parent = self.block(level + 1, index // 2)
            left = 0.5 * parent + math.sqrt(2.0 ** (level - 1)) * self._draw(0xB0, level + 1, index // 2)
            halves = (left, parent - left)
            self._keep(level, index ^ 1, halves[1 - index % 2])
            out = halves[index % 2]
        self._keep(level, index, out)
        return out

    def _keep(self, level: int, index: int, block: np.ndarray) -> None:
        """Cache a block; a sequential read needs one pair of halves per level, so each level keeps
        its newest 4 (an LRU over all levels dropped the high halves long before they were read)."""
        row = self._cache.setdefault(level, {})
        if len(row) >= 4:
            del row[next(iter(row))]
        row[index] = block

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
    supports_checkpoints = True

    @staticmethod
    def metric_ranges(recipe: Recipe) -> dict[str, tuple[float, float]]:
        """``loss`` = 1/2 sum h_i theta_i^2 with every h_i > 0: never below 0, so a lower target is
        refused before the probe runs (measure/guards.py)."""
        return {"loss": (0.0, math.inf)}

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
        epochs = max(1, cand.updates_per_batch // max(1, recipe.algorithm.mini_batches))
        train_s = sim_train_step_s(cfg, batch) * epochs
        samples, step = 0, 0
        if spec.resume_from is not None:  # the exact state: the data position is `samples`
            theta, m, v, samples, step = load_nqm_checkpoint(spec.resume_from)
        saves = sorted(x for x in spec.save_at_samples if x > samples)
        # off-policy (docs/nqm.md): the gradient at the weights of `staleness` updates ago (a resumed
        # run starts with that history at its checkpoint's weights), each batch's noise reused by
        # `epochs` updates (updates_per_batch / mini_batches): backends/nqm_async.py's dynamics
        past: deque[np.ndarray] = deque([theta], maxlen=cand.staleness + 1)
        updates = step
        while samples < recipe.budget.max_samples:
            step += 1
            samples += batch
            lr = cand.lr * warmup_factor(samples, opt.warmup_samples)
            noise = noise_sd * stream.batch_sum(samples - batch, samples)
            grad = h * past[0] + noise
            grad_norm = float(np.sqrt(np.dot(grad, grad)))
            train_loss = float(0.5 * np.dot(grad, grad / h)) - const
            true_grad_sq = float(np.dot(h * theta, h * theta))
            for e in range(epochs):
                if e:
                    grad = h * past[0] + noise
                updates += 1
                theta, m, v = _update(opt, theta, m, v, grad, lr, updates, (beta1, beta2, eps))
                past.append(theta)
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
            while saves and samples >= saves[0]:  # saved before the yield: the caller may stop here
                assert spec.checkpoint_dir is not None, "save_at_samples needs a checkpoint_dir"
                save_nqm_checkpoint(
                    checkpoint_path(spec.checkpoint_dir, saves.pop(0)), theta, m, v, samples, step
                )
            tokens = samples * recipe.generation.max_new_tokens
            yield spec.step_record(
                step, samples, tokens, lr, metrics, grad_norm=grad_norm, gen_s=gen_s, train_s=train_s
            )


def _update(
    opt: OptimizerConfig,
    theta: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    grad: np.ndarray,
    lr: float,
    t: int,
    betas: tuple[float, float, float],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One SGD / Adam / AdamW update (the ``t``-th, for Adam's bias correction) of ``theta``;
    clipping as optimizer.grad_clip says. Returns (theta, m, v)."""
    beta1, beta2, eps = betas
    grad_norm = float(np.sqrt(np.dot(grad, grad)))
    if opt.grad_clip > 0 and grad_norm > opt.grad_clip:
        grad = grad * (opt.grad_clip / grad_norm)
    if opt.name == "sgd":
        return theta - lr * (grad + opt.weight_decay * theta), m, v
    if opt.name == "adam" and opt.weight_decay:
        grad = grad + opt.weight_decay * theta  # Adam: L2 in the gradient
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    m_hat = m / (1 - beta1**t)
    v_hat = v / (1 - beta2**t)
    update = m_hat / (np.sqrt(v_hat) + eps)
    if opt.name == "adamw":
        update = update + opt.weight_decay * theta  # AdamW: decoupled decay
    return theta - lr * update, m, v


def save_nqm_checkpoint(
    path: Path, theta: np.ndarray, m: np.ndarray, v: np.ndarray, samples: int, step: int
) -> None:
    """The whole NQM training state (parameters, Adam moments, counters; the data position is
    ``samples``, as SampleStream is keyed by position), written atomically to ``path``.npz."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, theta=theta, m=m, v=v, counters=np.array([samples, step], dtype=np.int64))
    os.replace(tmp, path.with_suffix(".npz"))


def load_nqm_checkpoint(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """The state ``save_nqm_checkpoint`` wrote, read with ``allow_pickle=False``: nothing in the file
    runs. A pickle in it (an object array, or a pickle file in its place) is someone else's file, as
    a planted torch checkpoint is (backends/checkpoint_file.py): the probe stops naming it
    (UnsafeCheckpoint, exit 2) instead of sealing the runs to start from it as failed."""
    file = path.with_suffix(".npz")
    try:
        with np.load(file, allow_pickle=False) as z:
            samples, step = (int(x) for x in z["counters"])
            return z["theta"].copy(), z["m"].copy(), z["v"].copy(), samples, step
    except ValueError as exc:
        if _holds_a_pickle(file, str(exc)):
            raise UnsafeCheckpoint(
                f"refused the checkpoint {file}: it holds a pickle (object data) that could run code, "
                "not the arrays batchtune writes; nothing in it ran. Probe into a fresh results_dir "
                "(and check who can write to this one)"
            ) from None
        raise RunFailed("failed", f"cannot read the NQM checkpoint {file}: {exc}") from None
    except (OSError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        raise RunFailed("failed", f"cannot read the NQM checkpoint {file}: {exc}") from None


def _holds_a_pickle(file: Path, message: str) -> bool:
    """np.load's ValueError is about pickled data: an object array in the archive, or a file that
    starts as a pickle does (protocol 2+: byte 0x80) where the .npz should be."""
    if "Object arrays cannot be loaded" in message:
        return True
    try:
        with file.open("rb") as f:
            return f.read(1) == b"\x80"
    except OSError:
        return False


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
    device_name = SIMULATED_DEVICE  # where a profile says it ran: not "auto"

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
