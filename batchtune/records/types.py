"""The records batchtune writes and reads: a run's steps, the run, throughput points, a model's shape.

Units are in the field names; docs/formats.md lists every field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

RUN_STATUSES = (
    "reached_target",  # stopped because the target was reached
    "budget_exhausted",  # ran its whole sample budget without reaching the target (censored)
    "stopped_outside_band",  # stopped early: clearly slower than the reference (censored)
    "completed",  # an imported run: no stop reason known
    "diverged",  # NaN or exploding loss
    "oom",  # out of memory at this batch
    "failed",  # the backend raised; message says why
    "timeout",  # an external command ran past its timeout
)
FAILED_STATUSES = ("diverged", "oom", "failed", "timeout")


def failed_before_training(record: RunRecord) -> bool:
    """Whether a probe's run failed before its first training step, as its backend said
    (``RunFailed(started=False)``: a user's trainer command that exited before its log held a step,
    e.g. not installed or a config it refused). Such a run measured nothing, so it is not data: the
    analysis leaves it out and a rerun of the probe runs it again
    (``ResultsStore.reopen_failed_starts``). A run that diverged, ran out of memory, timed out, was
    lost on Ray, or failed after training steps, is data and is kept."""
    return record.status == "failed" and record.failed_start and not record.imported


def candidate_label(prompts: int, group_size: int, *, fixed_lr: bool = False) -> str:
    """The one name of a candidate, e.g. ``P16xG8`` (``P16xG8-fixedlr`` for a fixed-LR control)."""
    return f"P{prompts}xG{group_size}" + ("-fixedlr" if fixed_lr else "")


def offpolicy_suffix(staleness: float, updates_per_batch: float) -> str:
    """The suffix of an off-policy candidate's name, ``P16xG8-k1u2`` (staleness k, updates per batch
    u): the plan names them so (measure/plan.py), and so do imports and checks of their runs."""
    return f"-k{staleness:g}u{updates_per_batch:g}"


OFFPOLICY_SUFFIX = re.compile(r"-k(\d+)u(\d+)$")  # offpolicy_suffix read back: (k, u)
PROBE_LABEL = re.compile(r"P(\d+)xG(\d+)(-.+)?")  # a probe candidate's name: candidate_label + suffix


class _Launched(Protocol):  # a run as launched: RunRecord, integrations' ImportedRun
    @property
    def candidate(self) -> str: ...
    @property
    def prompts(self) -> int: ...
    @property
    def group_size(self) -> int: ...
    @property
    def staleness(self) -> int: ...
    @property
    def updates_per_batch(self) -> int: ...
    @property
    def imported(self) -> bool: ...


def on_policy_updates(runs: Iterable[_Launched]) -> dict[tuple[int, int], int]:
    """Per batch shape (P, G): the updates per rollout batch u of its on-policy runs among ``runs``
    (RunRecord or an imported run), those at k = 0 under a label without the ``-k{k}u{u}`` suffix (a
    run at k = 0 and another u of its shape is ``-k0u{u}``: measure/plan.py,
    integrations/convert.label_apart). Per shape, not one u for all: with verl's fixed
    ppo_mini_batch_size, u = mini-batches x epochs grows with the batch (P4 at u = 1, P16 at u = 4 in
    an ordinary batch sweep). Where a shape has probe runs, theirs (the probe's algorithm.mini_batches,
    as its plan labels them): a log imported beside them under the plain label (as import-logs did
    before it split other u apart) does not move it. Else the imported runs' u: the smallest where
    several (runs imported before that rule pooled them). A shape without an on-policy run is absent."""
    plain = [r for r in runs if r.staleness == 0 and not OFFPOLICY_SUFFIX.search(r.candidate)]
    probed = {(r.prompts, r.group_size) for r in plain if not r.imported}
    out: dict[tuple[int, int], int] = {}
    for r in plain:
        shape = (r.prompts, r.group_size)
        if not r.imported or shape not in probed:
            out[shape] = min(out.get(shape, r.updates_per_batch), r.updates_per_batch)
    return out


@dataclass(frozen=True)
class StepRecord:
    """One optimiser step of one run. Cumulative counters are totals since the run began."""

    run_id: str
    step: int
    samples: int  # responses consumed so far (RL) or tokens (pre-training)
    tokens: int  # generated (RL) or trained (pre-training) tokens so far
    lr: float  # actor LR used at this step, after warmup
    prompts: int  # P of the run
    group_size: int  # G of the run
    seed: int
    metrics: dict[str, float] = field(default_factory=dict)  # reward, eval_reward, loss, kl, ...
    grad_norm: float | None = None  # actor, before clipping
    critic_grad_norm: float | None = None  # PPO critic, before clipping
    gen_s: float = 0.0  # seconds generating this step's rollouts
    train_s: float = 0.0  # seconds in forward/backward/optimiser step
    other_s: float = 0.0  # reward, reference log-probs, evaluation

    @property
    def timed(self) -> bool:  # an imported log's evaluation-only entry carries no step times
        return self.gen_s + self.train_s + self.other_s > 0


@dataclass(frozen=True)
class RunRecord:
    """One training run of one candidate at one seed, written when it ends."""

    run_id: str
    candidate: str  # label shared by the seeds of one candidate, e.g. "P16xG8" or "P16xG8-fixedlr"
    prompts: int
    group_size: int
    seed: int
    lr: float  # the (peak) actor LR this run used
    lr_rule: str  # sqrt | linear | none | table | given (imported or explicit)
    base_lr: float
    reference_batch: int  # total responses that base_lr belongs to
    status: str
    reason: str = ""
    steps: int = 0
    samples: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    gen_s: float = 0.0
    train_s: float = 0.0
    other_s: float = 0.0
    critic_lr: float | None = None
    backend: str = ""
    source: str = "probe"  # probe | a file it was imported from
    finished_at: float = 0.0  # unix time
    # runs executing at once on this machine while this one ran (1 = alone); 0 = unknown (imported).
    # Step times of runs sharing cores are contended, so Θ read from them is biased (recommend warns).
    parallel_runs: int = 0
    cpu_cores: int = 0  # os.cpu_count() of the machine that ran it; 0 = unknown
    # the backend said no training step ran (backends.spec.RunFailed.started): not data, run again
    failed_start: bool = False
    staleness: int = 0  # k: rollouts from the weights of k trainer steps ago (issue 30; absent: on-policy)
    updates_per_batch: int = 1  # u: optimiser updates per rollout batch (mini-batches x epochs)

    @property
    def batch_responses(self) -> int:
        return self.prompts * self.group_size

    @property
    def imported(self) -> bool:
        """Whether the run was imported from a trainer's log (``source`` names the file), not run by
        the probe (``source == "probe"``): the one test of it."""
        return self.source != "probe"


@dataclass(frozen=True)
class ThroughputPoint:
    """One measured point of generation or training throughput."""

    kind: str  # generation | training
    backend: str
    mode: str  # generation: fixed (EOS ignored) | eos; training: train
    concurrency: int  # generation: responses in flight; training: batch in responses
    status: str = "ok"  # ok | oom | failed
    responses_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    step_latency_s: float = 0.0  # generation: time for the whole batch; training: step time
    step_latency_spread_s: float = 0.0  # (max - min) / 2 over repeats
    peak_mem_bytes: int = 0
    preemptions: int = 0
    queued: int = 0  # vLLM: most requests held waiting with its KV cache full (a memory ceiling)
    repeats: int = 0
    prompt_tokens: int = 0
    max_new_tokens: int = 0
    mean_output_tokens: float = 0.0
    model: str = ""
    hardware: str = ""
    message: str = ""
    profile_id: str = ""
    other_cores: float = math.nan  # CPU cores other processes kept busy while timed (NaN: unknown)
    cpu_cores: int = 0  # the machine's CPU cores (0: not recorded)


@dataclass(frozen=True)
class ModelInfo:
    """The profiled model's shape, stored with its profile so the roofline analysis never builds a model."""

    name: str
    n_params: float
    n_active_params: float
    bytes_per_param: float
    n_layers: int
    n_kv_heads: int
    head_dim: int
