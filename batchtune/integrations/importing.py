"""`batchtune import-logs`: bring runs users already have into a results directory.

The runs become the same RunRecord/StepRecord files a probe writes, so `batchtune recommend` analyses
them exactly like probe runs. The results directory's manifest records the target to judge them by.
"""

from __future__ import annotations

import copy
import glob
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchtune.errors import InputError
from batchtune.integrations.common import RunInfo
from batchtune.integrations.convert import label_apart
from batchtune.integrations.readers import ImportResult, import_runs, read_log
from batchtune.recipe.load import apply_overrides, recipe_from_dict
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore


def parse_mapping(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, key = item.partition("=")
        if not sep or not name or not key:
            raise InputError(f"--map {item!r}: expected NAME=KEY, e.g. --map metric=critic/score/mean")
        out[name.strip()] = key.strip()
    return out


def expand_paths(paths: Sequence[Path]) -> list[Path]:
    """Each path as given, or the sorted matches of a glob (``runs/*/checkpoint-*``; the shell
    usually expands it first, quoted it reaches here); a path or glob matching nothing is an error."""
    out: list[Path] = []
    for path in paths:
        text = str(path)
        if any(ch in text for ch in "*?["):
            matches = sorted(Path(m) for m in glob.glob(text))
            if not matches:
                raise InputError(f"{text} matches no file or folder")
            out.extend(matches)
        elif not Path(path).exists():
            raise InputError(f"{path} not found")
        else:
            out.append(Path(path))
    return out


def _same_file(a: str, b: str) -> bool:
    """Whether two sources name one file: a path typed relative one time and absolute the next is
    the same file (a relative one is read from the working directory)."""
    if a == b:
        return True
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return False


def check_run_ids(runs: Sequence[Any], store: ResultsStore) -> None:
    """Two different runs never share an id silently: not within one import, and not with a run of
    another file already in the results directory (the same file imported again is skipped)."""
    seen: dict[str, str] = {}
    for run in runs:
        if run.run_id in seen and not _same_file(seen[run.run_id], run.source):
            raise InputError(
                f"run id {run.run_id!r} is taken by both {seen[run.run_id]} and {run.source}: import them "
                "one at a time with --run-id NAME each (or name their folders apart)"
            )
        seen[run.run_id] = run.source
    stored = store.runs()
    existing = {r.run_id: r.source for r in stored}
    for run in runs:
        old = existing.get(run.run_id)
        if old is not None and not _same_file(old, run.source):
            raise InputError(
                f"{store.root} already holds run {run.run_id!r} from {old}; {run.source} is another run: "
                "give it its own id with --run-id NAME"
            )
    _check_seeds(runs, {(r.candidate, r.seed): (r.run_id, r.source) for r in stored})


def _check_seeds(runs: Sequence[Any], stored: dict[tuple[str, int], tuple[str, str]]) -> None:
    """Two runs of one candidate (the analysis groups runs by its label) are two seeds: with the same
    seed (every file of one import gets --seed's value; runs of one file without a seed column get
    0) the analysis could not pair them, and recommend stopped on it."""
    seen = dict(stored)
    for run in runs:
        other_id, other_src = seen.setdefault((run.candidate, run.seed), (run.run_id, run.source))
        if other_id != run.run_id:
            where = (
                f"runs {other_id!r} and {run.run_id!r} of {run.source}"
                if _same_file(other_src, run.source)
                else f"{other_src} and {run.source}"
            )
            raise InputError(
                f"{where} are both {run.candidate} at seed {run.seed}: give each its own seed "
                "(--map seed=KEY where the log says it, else import each with its own --seed N); runs "
                "of different batches need their own --prompts and --group-size, one import each"
            )


def _check_metric_logged(metric: str, runs: Sequence[Any], store: ResultsStore, named: bool) -> None:
    """The target metric the user named is logged by some run (imported now or before), else the
    import stops before writing: recommend would only fail on it later."""
    keys: set[str] = set()
    steps = [s for run in runs for s in run.steps]
    steps += [s for r in store.runs() for s in store.steps(r.run_id)]
    for s in steps:
        if metric in s.metrics:
            return
        keys.update(s.metrics)
    shown = ", ".join(sorted(keys)[:12]) + (", ..." if len(keys) > 12 else "")
    what = f"--metric {metric!r}" if named else f"target metric {metric!r} (the default)"
    raise InputError(
        f"{what}: no run logs it as a number (numeric keys logged: {shown or 'none'}); "
        "name one of them with --metric, or map it with --map"
    )


def _async_knobs(runs: Sequence[Any], store: ResultsStore, manifest: dict[str, Any] | None) -> list[str]:
    """The async knobs a recipe import-logs made gets once the directory holds runs at staleness k > 0
    beside on-policy ones: then `recommend` ranks them jointly (measure/async_topup.has_async_knobs).
    algorithm.mode = "async": the trainers' async runs generate and train apart, so their weight-sync
    seconds and the slowdown against the on-policy runs count (analysis/decide/async_joint.py).
    A probe's recipe says how its runs ran (its sync-mode k > 0 runs are one process): an import never
    changes it, else the next probe of that recipe is refused and recommend models them as two
    processes. Nor is a sync-mode staleness that an earlier import's --set stored."""
    if manifest is not None and manifest.get("source") != "import-logs":
        return []
    stored = manifest.get("recipe") if manifest else None
    stored = stored if isinstance(stored, dict) else {}
    mode = (stored.get("algorithm") or {}).get("mode", "sync")
    old_ks = list((stored.get("probe") or {}).get("staleness", [0]))
    if mode != "async" and old_ks != [0]:  # the user set how the runs ran: sync mode, k generated ahead
        return []
    ks = {r.staleness for r in runs} | {r.staleness for r in store.runs()}
    ks |= set(old_ks) if mode == "async" else set()
    if 0 not in ks or len(ks) < 2:  # no async run, or none on-policy to rank it against
        return []
    if mode == "async" and sorted(old_ks) == sorted(ks):
        return []  # the stored recipe already says so: nothing to rewrite
    return [f"probe.staleness={sorted(ks)}", 'algorithm.mode="async"']


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _keep_probe_recipe(root: Path, stored: Recipe, wanted: Recipe, overrides: Sequence[str]) -> None:
    """A probe's manifest is the recipe its next run is checked against (measure/probe.check_manifest):
    an import that rewrote its target got that probe refused ("changed: target.value"). Options that
    agree with it are fine; options that would change it are refused, naming where they belong:
    recommend's --set judges every run of the directory by another target without rewriting it."""
    old, new = _flat(stored.to_dict()), _flat(wanted.to_dict())
    changed = [key for key, value in new.items() if old.get(key) != value]
    if not changed:
        return
    shown = ", ".join(f"{key} {old.get(key)!r} -> {new[key]!r}" for key in changed[:4])

    def changes(item: str) -> bool:
        key = item.partition("=")[0].strip()
        return any(c == key or c.startswith(key + ".") for c in changed)

    sets = "".join(f" --set {shlex.quote(item)}" for item in overrides if changes(item))
    raise InputError(
        f"{root} holds a probe, and import-logs keeps its recipe as it is (the probe's next run there is "
        f"checked against it); these options would change {shown}: to judge the runs by that, run "
        f"`batchtune recommend --results {shlex.quote(str(root))}{sets}`, or import into another --results "
        "directory"
    )


def import_logs(
    paths: Sequence[Path],
    fmt: str,
    results: str,
    info: RunInfo,
    mapping: dict[str, str],
    target_overrides: list[str],
) -> tuple[ImportResult, Recipe, tuple[str, ...]]:
    """Read every path first (all-or-nothing), then write the runs and the manifest. Returns what was
    imported, the recipe stored, and the empty files skipped."""
    runs, empty = [], []
    for path in expand_paths(paths):
        if path.is_file() and not path.read_bytes().strip():  # one empty file among many: told, skipped
            empty.append(str(path))
            continue
        runs.extend(read_log(path, fmt, info, mapping))
    if not runs:
        what = "every file is empty" if empty else "no runs found"
        raise InputError(f"{what} in {', '.join(map(str, paths))}")
    store = ResultsStore(results)
    runs = label_apart(runs, store.runs())  # as import_runs will: the seeds are checked per candidate
    check_run_ids(runs, store)
    manifest = store.read_manifest()
    base = manifest["recipe"] if manifest else {}
    probe_made = manifest is not None and manifest.get("source") != "import-logs"
    overrides = [*_async_knobs(runs, store, manifest), *target_overrides]  # the user's --set last: it wins
    recipe = recipe_from_dict(apply_overrides(copy.deepcopy(base), overrides), "import-logs")  # checked first
    if probe_made:
        _keep_probe_recipe(store.root, recipe_from_dict(base, "import-logs"), recipe, target_overrides)
    named = any(o.startswith("target.metric=") for o in target_overrides)
    _check_metric_logged(recipe.target.metric, runs, store, named)  # recommend would fail on it later
    result = import_runs(store, runs)  # validates every run before writing any
    if manifest is None:
        store.write_manifest({"recipe": recipe.to_dict(), "source": "import-logs", "created": time.time()})
    elif overrides and not probe_made:
        store.write_manifest({**manifest, "recipe": recipe.to_dict()})
    return result, recipe, tuple(empty)
