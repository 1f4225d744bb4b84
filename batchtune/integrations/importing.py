"""`batchtune import-logs`: bring runs users already have into a results directory.

The runs become the same RunRecord/StepRecord files a probe writes, so `batchtune recommend` analyses
them exactly like probe runs. The results directory's manifest records the target to judge them by.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from batchtune.errors import InputError
from batchtune.integrations.common import RunInfo
from batchtune.integrations.readers import ImportResult, import_runs, read_log
from batchtune.recipe.load import apply_overrides, recipe_from_dict
from batchtune.recipe.schema import Recipe
from batchtune.records import ResultsStore


def parse_mapping(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, key = item.partition("=")
        if not sep or not name or not key:
            raise InputError(f"--map {item!r}: expected NAME=KEY, e.g. --map metric=critic/score/mean")
        out[name.strip()] = key.strip()
    return out


def import_logs(
    paths: Sequence[Path],
    fmt: str,
    results: str,
    info: RunInfo,
    mapping: dict[str, str],
    target_overrides: list[str],
) -> tuple[ImportResult, Recipe]:
    """Read every path first (all-or-nothing), then write the runs and the manifest."""
    runs = []
    for path in paths:
        if not Path(path).exists():
            raise InputError(f"{path} not found")
        runs.extend(read_log(path, fmt, info, mapping))
    if not runs:
        raise InputError(f"no runs found in {', '.join(map(str, paths))}")
    store = ResultsStore(results)
    manifest = store.read_manifest()
    base = manifest["recipe"] if manifest else {}
    recipe = recipe_from_dict(apply_overrides(base, target_overrides), "import-logs")  # checked first
    result = import_runs(store, runs)  # validates every run before writing any
    if manifest is None:
        store.write_manifest({"recipe": recipe.to_dict(), "source": "import-logs", "created": time.time()})
    elif target_overrides:
        store.write_manifest({**manifest, "recipe": recipe.to_dict()})
    return result, recipe
