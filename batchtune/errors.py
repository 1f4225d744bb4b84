"""One small hierarchy of user-facing errors. The CLI turns each into a one-line message and exit code."""

from __future__ import annotations


class BatchtuneError(Exception):
    """Base class: the message says what went wrong and what to do next."""

    exit_code = 1


class RecipeError(BatchtuneError):
    """A recipe or override is malformed (unknown key, wrong type, bad value)."""

    exit_code = 2


class InputError(BatchtuneError):
    """A log, measurements file or results directory cannot be read as asked."""

    exit_code = 2


class AnalysisError(BatchtuneError):
    """The data cannot support the requested estimate (one point, all censored, NaN, failed fit)."""

    exit_code = 3


class BackendError(BatchtuneError):
    """A training or generation backend is unavailable or failed outside a single run."""

    exit_code = 4
