"""One small hierarchy of user-facing errors. The CLI turns each into a one-line message and exit code."""

from __future__ import annotations

from typing import Any


class BatchtuneError(Exception):
    """Base class: the message says what went wrong and what to do next."""

    exit_code = 1


class RecipeError(BatchtuneError):
    """A recipe or override is malformed (unknown key, wrong type, bad value)."""

    exit_code = 2


class InputError(BatchtuneError):
    """A log, measurements file or results directory cannot be read as asked."""

    exit_code = 2


class MetricMissingError(InputError):
    """The target metric is not among those a run logs at its first evaluation."""


class AnalysisError(BatchtuneError):
    """The data cannot support the requested estimate (one point, all censored, NaN, failed fit)."""

    exit_code = 3


class NoProgress(AnalysisError):
    """A branched probe's controls made no measurable progress in the window after a checkpoint
    (the trunk plateaued there, or the metric is too noisy for the window): no local ratio can be
    read at that checkpoint."""


class RunsFailed(AnalysisError):
    """Every run failed for a reason of its own (diverged, out of memory, timed out, the trainer
    exited non-zero): the message carries the runs' reasons, not a missing metric."""


class NotRanked(AnalysisError):
    """Samples-to-target was analysed but no time-to-target ranking can be made (e.g. the reference
    never reached the target). Carries the analysis so a report can still show it."""

    def __init__(self, message: str, efficiency: Any):
        super().__init__(message)
        self.efficiency = efficiency


class ThroughputMissing(AnalysisError):
    """Samples-to-target is known but no throughput is: the critical batch stands, the ranking waits.

    Carries the sample-efficiency analysis so the caller can still show it."""

    def __init__(self, message: str, efficiency: Any):
        super().__init__(message)
        self.efficiency = efficiency


class BackendError(BatchtuneError):
    """A training or generation backend is unavailable or failed outside a single run."""

    exit_code = 4


class UnsafeCheckpoint(BackendError):
    """A checkpoint in the results directory holds more than tensors and plain containers (a pickle
    that could run code, or not a state dict): nothing in it is loaded, and the probe stops rather
    than seal the runs that were to start from it as failed (which would change the answer)."""

    exit_code = 2


class Terminated(BaseException):
    """SIGTERM arrived (preemption, `timeout`, a scheduler): unwind so children are stopped, exit 143.

    Not an Exception, so no ``except Exception`` on the way records it as a failed run."""

    def __init__(self, signum: int = 15):
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum
