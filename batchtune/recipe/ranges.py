"""The range of every numeric recipe field, checked at load (beside schema.py, which holds the defaults).

Every value must be finite (NaN and infinity never reach a run or a manifest); each field also gets
the interval its meaning allows. Lists are checked item by item and tables value by value. A field of
the schema without an entry here fails tests/test_reliability_codec.py, so a new field gets a range.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchtune.recipe.tables import field_types

if TYPE_CHECKING:
    from batchtune.recipe.schema import Recipe

INF = math.inf


@dataclass(frozen=True)
class Range:
    """The interval a value may take; ``open_lo``/``open_hi`` exclude the bound itself."""

    lo: float = -INF
    hi: float = INF
    open_lo: bool = False
    open_hi: bool = False
    why: str = ""  # appended to the message

    def __contains__(self, x: float) -> bool:
        above = x > self.lo if self.open_lo else x >= self.lo
        below = x < self.hi if self.open_hi else x <= self.hi
        return math.isfinite(x) and above and below

    def describe(self) -> str:
        if self.hi == INF:
            return f"{'>' if self.open_lo else '>='} {self.lo:g}"
        if self.lo == -INF:
            return f"{'<' if self.open_hi else '<='} {self.hi:g}"
        return f"in {'(' if self.open_lo else '['}{self.lo:g}, {self.hi:g}{')' if self.open_hi else ']'}"


ANY = Range()
POS = Range(0, INF, open_lo=True)
NONNEG = Range(0)
ONE_UP = Range(1)
UNIT = Range(0, 1)
BIG = 1e15  # "absurd" sizes: beyond any machine


def _size(hi: float = BIG) -> Range:
    return Range(1, hi)


RANGES: dict[str, Range] = {
    "run.workers": _size(4096),
    "run.ray_num_cpus": Range(0, 4096, open_lo=True),
    "run.ray_num_gpus": Range(-1, 4096, why="(-1: from hardware.num_gpus on CUDA)"),
    "run.ray_max_retries": Range(0, 1000),
    "model.hidden_size": _size(1 << 20),
    "model.intermediate_size": _size(1 << 22),
    "model.num_layers": _size(10_000),
    "model.num_heads": _size(4096),
    "model.num_kv_heads": _size(4096),
    "model.max_position_embeddings": _size(1 << 24),
    "model.pretrain_steps": Range(0, 1e9),
    "model.pretrain_lr": Range(0, 100, open_lo=True),
    "model.pretrain_batch": _size(1 << 24),
    "task.difficulty": _size(10_000),
    "task.train_size": _size(1e10),
    "task.eval_size": Range(0, 1e9, why="(0: no held-out set)"),
    "task.eval_every_samples": NONNEG,
    "algorithm.clip_eps": Range(0, 10, open_lo=True),
    "algorithm.kl_coef": Range(0, 1e6),
    "algorithm.mini_batches": _size(1 << 20),
    "algorithm.gamma": UNIT,
    "algorithm.lam": UNIT,
    "algorithm.critic_lr": Range(0, 100, why="(0: the actor's base LR)"),
    "algorithm.value_clip": Range(0, 1e6),
    "algorithm.micro_batch_responses": NONNEG,
    "algorithm.sync_every": _size(1 << 16),
    "algorithm.in_flight_cap": Range(0, 1 << 16, why="(0: max(staleness, 1))"),
    "optimizer.lr": Range(0, 100, open_lo=True),
    "optimizer.beta1": Range(0, 1, open_hi=True),
    "optimizer.beta2": Range(0, 1, open_hi=True),
    "optimizer.eps": Range(0, 1, open_lo=True),
    "optimizer.weight_decay": Range(0, 100),
    "optimizer.grad_clip": Range(0, 1e6, why="(0: no clipping)"),
    "optimizer.warmup_samples": NONNEG,
    "lr_scaling.reference_batch": Range(0, BIG, why="(0: the smallest candidate)"),
    "lr_scaling.table": Range(0, 100, open_lo=True),
    "candidates.prompts": _size(1 << 24),
    "candidates.group_size": _size(1 << 16),
    "candidates.group_sweep_total": Range(0, 1 << 30),
    "candidates.group_sweep_sizes": _size(1 << 16),
    "candidates.fixed_lr_prompts": _size(1 << 24),
    "target.value": Range(-1e9, 1e9, why="(a metric value, e.g. a reward in [0, 1] or a loss)"),
    "target.tolerance": Range(
        1e-3, 10, why="(about 0.1: R(B)/R(B0) <= 1 + tolerance; seeds resolve no less)"
    ),
    "target.ema_alpha": Range(0, 1, open_lo=True),
    "target.confidence": Range(0, 1, open_lo=True, open_hi=True),
    "budget.max_samples": _size(),
    "budget.band_factor": Range(1, 1000, why="(a candidate is stopped past band_factor * (1+tol) * R_ref)"),
    "budget.seeds": Range(0, 2**32 - 1),
    "budget.max_extra_seeds": Range(0, 1000),
    "budget.async_top_up_seeds": Range(0, 1000, why="(0: no top-up)"),
    "budget.async_top_up_margin": Range(0, 10, why="(a share of the best T, e.g. 0.1)"),
    "budget.async_top_up_max_seeds": Range(0, 1000, why="(<= async_top_up_seeds: none)"),
    "budget.full_run_samples": Range(0, BIG, why="(0: not stated)"),
    "budget.full_run_steps": Range(0, BIG, why="(0: not stated)"),
    "budget.full_run_batch": Range(0, BIG, why="(0: the middle of the main candidates)"),
    "budget.diverge_factor": Range(1, 1e12, open_lo=True, why="(a loss above it times its first value)"),
    "generation.max_new_tokens": _size(1 << 24),
    "generation.prompt_tokens": _size(1 << 24),
    "generation.temperature": Range(0, 100, open_lo=True),
    "generation.top_p": Range(0, 1, open_lo=True),
    "generation.concurrency": _size(1 << 24),
    "generation.repeats": _size(10_000),
    "generation.warmup": Range(0, 10_000),
    "generation.knee_threshold": Range(0, 10, open_lo=True),
    "generation.gpu_memory_utilization": Range(0, 1, open_lo=True),
    "generation.max_num_seqs": Range(0, 1 << 24),
    "generation.kv_cache_bytes": Range(0, 1 << 50),
    "generation.train_batches": _size(1 << 24),
    "generation.other_s_per_step": NONNEG,
    "generation.retime_contended": Range(0, 10),
    "generation.retime_wait_s": Range(0, 3600),
    "generation.eos_stop_prob": Range(0, 1, open_hi=True),
    "generation.seed": Range(0, 2**32 - 1),
    "hardware.peak_flops": NONNEG,
    "hardware.hbm_bytes_per_s": NONNEG,
    "hardware.num_gpus": _size(1 << 20),
    "hardware.threads": Range(0, 4096),
    "hardware.memory_bytes": NONNEG,
    "backend.timeout_s": Range(0, why="(0: none)"),
    "nqm.dim": _size(10_000_000),
    "nqm.curvature_power": Range(0, 10),
    "nqm.noise_scale": NONNEG,
    "nqm.init_scale": POS,
    "nqm.gen_t0_s": NONNEG,
    "nqm.gen_t1_s": NONNEG,
    "nqm.train_t0_s": NONNEG,
    "nqm.train_t1_s": NONNEG,
    "nqm.gen_max_concurrency": NONNEG,
    "pretrain.seq_len": _size(1 << 24),
    "pretrain.batches_tokens": _size(),
    "pretrain.max_tokens": _size(),
    "pretrain.targets": ANY,
    "pretrain.eval_every_tokens": _size(),
    "pretrain.eval_sequences": _size(1 << 24),
    "pretrain.markov_vocab": Range(2, 1 << 24),
    "pretrain.markov_order": _size(64),
    "pretrain.markov_branching": _size(1 << 24),
    "pretrain.markov_concentration": POS,
    "pretrain.data_seed": Range(0, 2**32 - 1),
    "pretrain.warmup_tokens": NONNEG,
    "pretrain.decay_fraction": Range(0, 1, open_hi=True),
    "pretrain.micro_batch_tokens": NONNEG,
    "probe.staleness": Range(0, 1 << 16),
    "probe.updates_per_batch": _size(1 << 16),
    "probe.refine_max_batches": Range(0, 1 << 16),
    "probe.refine_seeds": Range(0, 1 << 10),
    "probe.refine_rl_max_candidates": Range(0, 1 << 16),
    "branch.trunk_samples": _size(),
    "branch.checkpoints": Range(0, 1),  # 0: branches from initialisation
    "branch.window_samples": _size(),
    "branch.max_window_factor": ONE_UP,
    "branch.min_steps": _size(),
    "branch.confirm_seeds": _size(64),
    "branch.max_seeds": _size(64),
}


def numeric_fields(cls: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted name -> type of every numeric field (number, list or table of numbers) of ``cls``."""
    out: dict[str, Any] = {}
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        tp, name = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out.update(numeric_fields(tp, f"{name}."))
            continue
        args = typing.get_args(tp)
        item = args[-1] if typing.get_origin(tp) in (list, dict) and args else tp
        if item in (int, float):
            out[name] = tp
    return out


def _values(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [(f".{k}", v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    return [("", value)]


def check_ranges(recipe: Recipe) -> list[str]:
    """One message per value outside its field's range (NaN and infinity are outside every range)."""
    errors: list[str] = []
    data = dataclasses.asdict(recipe)
    for name in numeric_fields(type(recipe)):
        section, _, key = name.partition(".")
        rng = RANGES.get(name, ANY)  # a field without an entry still has to be finite
        for suffix, v in _values(data[section][key]):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue  # a type error, reported by the loader
            if v not in rng:
                why = f" {rng.why}" if rng.why else ""
                must = "a finite number" if rng is ANY else f"finite and {rng.describe()}"
                errors.append(f"{name}{suffix}: {v!r} must be {must}{why}")
    return errors
