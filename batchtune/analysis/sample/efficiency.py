"""Sample efficiency's records: a run's data, one candidate's samples-to-target and verdict, and the
whole sweep's result with its critical batch and gradient-noise diagnostics (docs/method.md §3).
``candidates.py`` builds the candidates from runs; ``assess.py`` judges them.

Pure: plain frozen dataclasses; no engine import.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from batchtune.analysis.sample.critical import CriticalBatch
from batchtune.analysis.sample.evals import NO_EVALS, EvalCost
from batchtune.analysis.sample.noise import GradNormSlope, NoiseScale
from batchtune.analysis.sample.ratio import Verdict
from batchtune.analysis.sample.seeds import TargetEstimate
from batchtune.records.types import RunRecord, StepRecord

FAMILIES = ("main", "group_sweep", "fixed_lr", "offpolicy")  # offpolicy: -k{k}u{u} (plan.py)


@dataclass(frozen=True)
class RunData:
    record: RunRecord
    steps: tuple[StepRecord, ...]

    def curve(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        pts = [(s.samples, s.metrics[metric]) for s in self.steps if metric in s.metrics]
        if not pts:
            return np.empty(0), np.empty(0)
        arr = np.asarray(pts, dtype=float)
        return arr[:, 0], arr[:, 1]


@dataclass(frozen=True)
class CandidateEfficiency:
    label: str
    prompts: int
    group_size: int
    lr: float
    lr_rule: str
    family: str  # main | group_sweep | fixed_lr
    estimate: TargetEstimate | None  # None when no run of it finished usefully
    verdict: Verdict | None
    n_runs: int
    failures: tuple[str, ...]  # "seed 1: diverged (loss is nan)"
    gen_s_per_step: float  # medians over the steps of all its runs (measured while probing)
    train_s_per_step: float
    other_s_per_step: float
    samples_consumed: int  # what probing this candidate cost, all seeds
    wall_s: float
    critic_lr: float | None = None  # PPO: the critic's LR as the runs used it (carried, never re-planned)
    evals: EvalCost = NO_EVALS  # what one held-out evaluation cost its runs, and how often (evals.py)

    @property
    def batch_responses(self) -> int:
        return self.prompts * self.group_size

    @property
    def status(self) -> str:
        if self.estimate is None:
            return "failed"
        return self.verdict.status if self.verdict else "unknown"


def shape_header(unit: str) -> str:
    """The column head of a batch's shape: P x G, or sequences x length where samples are tokens."""
    return "seqs x len" if unit == "tokens" else "P x G"


@dataclass(frozen=True)
class SampleEfficiency:
    metric: str
    target: float
    higher_is_better: bool
    tolerance: float
    reference: str
    candidates: tuple[CandidateEfficiency, ...]
    critical: CriticalBatch | None
    grad_slope: GradNormSlope | None
    noise_scale: NoiseScale | None
    notes: tuple[str, ...]
    critic_grad_slope: GradNormSlope | None = None  # PPO: the critic's own batch scale (docs/method.md §3.5)
    extra_seeds: dict[str, int] = field(default_factory=dict)  # label -> sequential seeds added
    # a factor interval common to every candidate's absolute R: a branched probe's R(B0) extrapolated
    # from its trunk (R(B) = R(B0) x ratio). Ratios between candidates do not carry it.
    scale_ci: tuple[float, float] = (1.0, 1.0)
    # what a sample and a batch count: "samples" (responses) for RL; "tokens" for a pre-training
    # recipe's branched probe, where a batch is seqs x len tokens
    unit: str = "samples"
    # every run was imported from a trainer's logs, none is a probe's: the text names the runs, and
    # there is no probe cost to state
    imported: bool = False
    # the candidates came from a measurements file (recommend --measurements): no probe and no runs,
    # so the remedies for thin evidence are the file's
    from_measurements: bool = False

    @property
    def batch_noun(self) -> str:
        """How a batch size reads: "responses", or "tokens" for pre-training."""
        return "tokens" if self.unit == "tokens" else "responses"

    def shape_words(self, prompts: int, group_size: int) -> str:
        """A batch's shape in words: "8 prompts x 16 responses", or "8 sequences x 16 tokens"."""
        if self.unit == "tokens":
            return f"{prompts} sequences x {group_size} tokens"
        return f"{prompts} prompts x {group_size} responses"

    @property
    def shape_header(self) -> str:
        """The column head of a batch's shape: P x G, or sequences x length for pre-training."""
        return shape_header(self.unit)

    @property
    def rate_unit(self) -> str:
        """Throughput's unit: responses/s, or tokens/s for pre-training."""
        return "tok/s" if self.unit == "tokens" else "resp/s"

    def absolute_ci(self, est: TargetEstimate) -> tuple[float, float]:
        """``est``'s interval for R itself: the seeds' interval times ``scale_ci``."""
        return est.ci_low * self.scale_ci[0], est.ci_high * self.scale_ci[1]

    def get(self, label: str) -> CandidateEfficiency:
        for c in self.candidates:
            if c.label == label:
                return c
        raise KeyError(label)

    @property
    def total_samples(self) -> int:
        return sum(c.samples_consumed for c in self.candidates)

    @property
    def total_wall_s(self) -> float:
        return sum(c.wall_s for c in self.candidates)
