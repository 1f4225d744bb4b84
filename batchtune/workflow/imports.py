"""`batchtune import-logs`: the options checked, the target they name turned into recipe overrides,
and the logs imported into a results directory. Inputs in, a result object out, no printing."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from batchtune.errors import InputError
from batchtune.integrations.common import RunInfo
from batchtune.recipe.schema import Recipe


@dataclass(frozen=True)
class ImportOutcome:
    """What an import wrote: runs added, runs already there, added runs stored as diverged (id, why),
    empty files skipped, and the recipe stored with the runs (its target judges them)."""

    results_dir: str
    added: tuple[str, ...]
    skipped: tuple[str, ...]
    diverged: tuple[tuple[str, str], ...]
    empty: tuple[str, ...]
    recipe: Recipe


def import_logs(
    paths: Sequence[Path],
    fmt: str,
    results: str,
    info: RunInfo,
    *,
    mapping: Sequence[str] = (),
    metric: str | None = None,
    target: float | None = None,
    lower_is_better: bool = False,
    overrides: Sequence[str] = (),
) -> ImportOutcome:
    """Import the logs at ``paths`` (format ``fmt``) into ``results``. ``info``: what the options say
    of the runs (0: the log's own); ``mapping``: NAME=KEY items; ``metric``, ``target`` and
    ``lower_is_better`` set the stored recipe's target and win over ``overrides`` (--set)."""
    from batchtune.integrations.importing import import_logs as import_runs
    from batchtune.integrations.importing import parse_mapping

    _check_info(info)
    keys = parse_mapping(mapping)
    target_overrides = [*overrides, *_target_overrides(metric, target, lower_is_better)]
    result, cfg, empty = import_runs(paths, fmt, results, info, keys, target_overrides)
    return ImportOutcome(results, result.added, result.skipped, result.diverged, empty, cfg)


def _target_overrides(metric: str | None, target: float | None, lower_is_better: bool) -> list[str]:
    out = []
    if metric is not None:
        out.append(f"target.metric={json.dumps(metric)}")  # a JSON string is a TOML string
    if target is not None:
        out.append(f"target.value={target}")
    if lower_is_better:
        out.append("target.higher_is_better=false")
    return out


def _check_info(info: RunInfo) -> None:
    """The options' values, each refused with the option that gave it."""
    for name, v in (
        ("--prompts", info.prompts),
        ("--group-size", info.group_size),
        ("--samples-per-step", info.samples_per_step),
        ("--staleness", info.staleness),
    ):
        if v < 0:
            raise InputError(f"{name} {v}: must be a positive count (0: the log's own)")
    if info.updates_per_batch < 1:
        raise InputError(f"--updates-per-batch {info.updates_per_batch}: must be at least 1")
    if not (math.isfinite(info.lr) and info.lr >= 0):
        raise InputError(f"--lr {info.lr}: must be a finite number > 0 (0: the log's own)")
