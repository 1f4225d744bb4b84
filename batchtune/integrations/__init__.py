"""What each trainer (verl, TRL, OpenRLHF) calls things: reading its logs into batchtune records and
writing the recommendation in its units. Pure Python; TensorBoard is imported only to read events.
"""

from batchtune.integrations.common import ImportedRun, LogKeys, RunInfo
from batchtune.integrations.emit import TRAINERS, EmittedConfig, RecommendationInput, emit
from batchtune.integrations.readers import FORMATS, ImportResult, import_runs, read_log

__all__ = [
    "FORMATS",
    "TRAINERS",
    "EmittedConfig",
    "ImportResult",
    "ImportedRun",
    "LogKeys",
    "RecommendationInput",
    "RunInfo",
    "emit",
    "import_runs",
    "read_log",
]
