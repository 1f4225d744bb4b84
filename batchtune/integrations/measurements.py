"""Measurements files: what a user measured elsewhere, written down for `batchtune recommend`.

A TOML file with a ``[study]`` table and one ``[[candidate]]`` table per candidate (see
docs/formats.md and recipes/hunyuan-grpo-measurements.toml). Per candidate: P, G, the LR or its rule,
samples-to-target (a number, optionally with a CI, or curves per seed), and throughput (responses/s,
per-step seconds, or a ratio to the reference's throughput).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchtune.analysis.decide.recommend import Throughput, ThroughputModel
from batchtune.analysis.sample.assess import assess
from batchtune.analysis.sample.curves import estimate_from_value, estimate_over_seeds, samples_to_target
from batchtune.analysis.sample.efficiency import CandidateEfficiency, SampleEfficiency
from batchtune.analysis.system.throughput import end_to_end_throughput
from batchtune.errors import AnalysisError, InputError
from batchtune.recipe.schema import TargetConfig
from batchtune.records import candidate_label

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_NUM = (int, float)
STUDY_KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "metric": (str,),
    "target": _NUM,
    "higher_is_better": (bool,),
    "tolerance": _NUM,
    "confidence": _NUM,
    "ema_alpha": _NUM,
    "reference": (str,),
    "unit": (str,),
    "source": (str,),
    "algorithm": (str,),
}
CANDIDATE_KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "prompts": (int,),
    "group_size": (int,),
    "lr": _NUM,
    "lr_rule": (str,),
    "critic_lr": _NUM,
    "samples_to_target": _NUM,
    "samples_ci": (list,),
    "curve": (list,),
    "responses_per_s": _NUM,
    "throughput_ratio": _NUM,
    "gen_s_per_step": _NUM,
    "train_s_per_step": _NUM,
    "other_s_per_step": _NUM,
    "note": (str,),
}
CURVE_KEYS: dict[str, tuple[type, ...]] = {"seed": (int,), "samples": (list,), "metric": (list,)}
LR_RULES_GIVEN = ("given", "sqrt", "linear", "none", "table")  # how each candidate's LR was chosen
_POSITIVE = ("prompts", "group_size", "samples_to_target", "responses_per_s", "throughput_ratio")
# an LR of 0 (or none given) means "not known": the winner's LR is then not emitted
_NONNEGATIVE = ("lr", "critic_lr", "gen_s_per_step", "train_s_per_step", "other_s_per_step")


@dataclass(frozen=True)
class Study:
    """The [study] table; its defaults are the recipe's target defaults (recipe/schema.py)."""

    name: str  # default: the file's stem
    metric: str = "metric"
    target: float = math.nan  # required when a candidate gives curves
    higher_is_better: bool = TargetConfig.higher_is_better
    tolerance: float = TargetConfig.tolerance
    confidence: float = TargetConfig.confidence
    ema_alpha: float = TargetConfig.ema_alpha
    reference: str = ""  # default: the smallest LR-scaled candidate
    unit: str = "responses"
    source: str = ""
    algorithm: str = "grpo"  # grpo | ppo: what an emitted trainer config is for


@dataclass(frozen=True)
class MeasuredCandidate:
    efficiency: CandidateEfficiency
    responses_per_s: float | None  # absolute end-to-end throughput, when known
    throughput_ratio: float | None  # relative to the reference, when only that is known
    critic_lr: float | None
    note: str


@dataclass(frozen=True)
class Measurements:
    study: Study
    candidates: tuple[MeasuredCandidate, ...]
    path: str


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check(table: dict[str, Any], schema: dict[str, tuple[type, ...]], where: str, errors: list[str]) -> None:
    for key, value in table.items():
        if key not in schema:
            errors.append(f"{where}.{key}: unknown key (known: {', '.join(sorted(schema))})")
        elif isinstance(value, bool) and bool not in schema[key]:
            errors.append(f"{where}.{key}: expected a number, got {value!r}")
        elif not isinstance(value, schema[key]):
            errors.append(f"{where}.{key}: wrong type {type(value).__name__}")


def _read_toml(p: Path) -> tuple[Path, dict[str, Any]]:
    """The file's path (a shipped example may be named as recipes are) and its TOML."""
    if not p.is_file():
        from batchtune.recipe.load import shipped_recipes

        shipped = shipped_recipes().get(p.stem if p.suffix == ".toml" else str(p))
        if shipped is None or p.parent not in (Path("."), Path("recipes")):
            raise InputError(f"measurements file {p} not found")
        p = shipped  # a shipped example by name, as recipes are (recipes/NAME.toml from anywhere)
    try:
        return p, tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{p} is not valid TOML: {exc}") from None
    except RecursionError:
        raise InputError(f"{p} is nested too deep to be a measurements file") from None


def _check_candidate(c: Any, where: str, errors: list[str]) -> None:
    """The checks of one [[candidate]] table, each problem appended to ``errors``."""
    if not isinstance(c, dict):
        errors.append(f"{where}: expected a [[candidate]] table")
        return
    n_before = len(errors)
    _check(c, CANDIDATE_KEYS, where, errors)
    if len(errors) > n_before:
        return  # wrong types: the checks below would read them
    for key in ("prompts", "group_size"):
        if key not in c:
            errors.append(f"{where}.{key}: required")
    has_r = "samples_to_target" in c or "curve" in c
    if not has_r:
        errors.append(f"{where}: give samples_to_target or curve")
    elif "samples_to_target" in c and "curve" in c:
        errors.append(f"{where}: give samples_to_target or curve, not both (one would be ignored)")
    thr = [k for k in ("responses_per_s", "throughput_ratio", "gen_s_per_step") if k in c]
    if not thr:
        errors.append(f"{where}: give responses_per_s, throughput_ratio or gen_s_per_step")
    elif len(thr) > 1:
        errors.append(f"{where}: give one of {', '.join(thr)}, not several (one would be ignored)")
    rule = c.get("lr_rule", "given")
    if rule not in LR_RULES_GIVEN:
        errors.append(f"{where}.lr_rule: {rule!r} is not one of {', '.join(LR_RULES_GIVEN)}")
    for key in (*_POSITIVE, *_NONNEGATIVE):
        v = c.get(key)
        if isinstance(v, (int, float)) and not (math.isfinite(v) and (v > 0 if key in _POSITIVE else v >= 0)):
            errors.append(
                f"{where}.{key}: {v!r} must be a finite number {'> 0' if key in _POSITIVE else '>= 0'}"
            )
    listed = c.get("curve")
    seeds = [  # of the right type: a wrong one is reported by _check
        cv["seed"]
        for cv in (listed if isinstance(listed, list) else [])
        if isinstance(cv, dict) and isinstance(cv.get("seed"), int) and not isinstance(cv["seed"], bool)
    ]
    if len(set(seeds)) != len(seeds):
        errors.append(f"{where}.curve: seeds repeat ({seeds}); each curve is one seed")
    for j, curve in enumerate(c.get("curve", []) if isinstance(c.get("curve"), list) else []):
        if not isinstance(curve, dict):
            errors.append(f"{where}.curve[{j}]: expected a table")
            continue
        _check(curve, CURVE_KEYS, f"{where}.curve[{j}]", errors)
        s, m = curve.get("samples", []), curve.get("metric", [])
        if not isinstance(s, list) or not isinstance(m, list) or len(s) != len(m) or not s:
            errors.append(f"{where}.curve[{j}]: samples and metric need the same non-zero length")
        elif not all(_is_num(v) for v in [*s, *m]):
            errors.append(f"{where}.curve[{j}]: samples and metric must be numbers")
        elif not all(math.isfinite(v) and v >= 0 for v in s) or any(
            b < a for a, b in zip(s, s[1:], strict=False)
        ):
            errors.append(f"{where}.curve[{j}].samples: must be finite, >= 0 and never decrease")
    ci = c.get("samples_ci")
    if ci is not None and (len(ci) != 2 or not all(_is_num(v) for v in ci)):
        errors.append(f"{where}.samples_ci: expected [low, high] numbers")


def _check_study_values(study_raw: dict[str, Any], errors: list[str]) -> None:
    """The ranges of the [study] values, each problem appended to ``errors``."""
    if study_raw.get("algorithm", Study.algorithm) not in ("grpo", "ppo"):
        errors.append(f"study.algorithm: {study_raw['algorithm']!r} is not 'grpo' or 'ppo'")
    for key, ok, what in (
        ("tolerance", lambda v: 0 <= v < math.inf, ">= 0"),
        ("confidence", lambda v: 0 < v < 1, "in (0, 1)"),
        ("ema_alpha", lambda v: 0 <= v < 1, "in [0, 1)"),
        ("target", math.isfinite, "finite"),
    ):
        v = study_raw.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not ok(v):
            errors.append(f"study.{key}: {v!r} must be {what}")


def load_measurements(path: str | Path) -> Measurements:
    """Parse and validate a measurements file; every problem is reported at once."""
    p, data = _read_toml(Path(path))
    errors: list[str] = []
    recipe_tables = {"run", "backend", "candidates", "target"} & set(data)
    if recipe_tables and "study" not in data and "candidate" not in data:
        raise InputError(
            f"{p} is a recipe, not a measurements file: batchtune recommend {path} --results DIR"
        )
    for key in data:
        if key not in ("study", "candidate"):
            errors.append(f"{key}: unknown table (expected [study] and [[candidate]])")
    study_raw = data.get("study", {})
    if not isinstance(study_raw, dict):
        errors.append("study: expected a [study] table")
        study_raw = {}
    _check(study_raw, STUDY_KEYS, "study", errors)
    cands_raw = data.get("candidate", [])
    if not isinstance(cands_raw, list) or len(cands_raw) < 2:
        errors.append("candidate: needs at least two [[candidate]] tables")
        cands_raw = []
    for i, c in enumerate(cands_raw):
        _check_candidate(c, f"candidate[{i}]", errors)
    _check_study_values(study_raw, errors)
    if any("curve" in c for c in cands_raw if isinstance(c, dict)) and "target" not in study_raw:
        errors.append("study.target: required when a candidate gives curves")
    if errors:
        raise InputError(f"{len(errors)} problem(s) in {p}: " + "; ".join(errors))

    given: dict[str, Any] = {
        k: (float(v) if STUDY_KEYS[k] is _NUM else v) for k, v in study_raw.items() if k != "name"
    }
    study = Study(name=study_raw.get("name") or p.stem, **given)
    out = [_candidate(c, study, p) for c in cands_raw]
    labels = [m.efficiency.label for m in out]
    if len(set(labels)) != len(labels):
        raise InputError(f"{p}: candidate names repeat ({', '.join(labels)}); give each a distinct name")
    if study.reference and study.reference not in labels:
        raise InputError(f"{p}: study.reference {study.reference!r} names no candidate ({', '.join(labels)})")
    return Measurements(study=study, candidates=tuple(out), path=str(p))


def _candidate(c: dict[str, Any], study: Study, path: Path) -> MeasuredCandidate:
    rule = c.get("lr_rule", "given")
    fixed = rule == "none"
    name = c.get("name") or candidate_label(c["prompts"], c["group_size"], fixed_lr=fixed)
    if "curve" in c:
        crossings = [
            samples_to_target(
                np.asarray(cv["samples"], float),
                np.asarray(cv["metric"], float),
                study.target,
                higher_is_better=study.higher_is_better,
                ema_alpha=study.ema_alpha,
            )
            for cv in c["curve"]
        ]
        estimate = estimate_over_seeds(crossings, confidence=study.confidence)
    else:
        ci = c.get("samples_ci")
        if ci is not None and (len(ci) != 2 or not ci[0] <= c["samples_to_target"] <= ci[1]):
            raise InputError(f"{path}: {name}.samples_ci must be [low, high] around samples_to_target")
        estimate = estimate_from_value(float(c["samples_to_target"]), tuple(ci) if ci else None)
    keys = ("gen_s_per_step", "train_s_per_step", "other_s_per_step")
    gen, train, other = (float(c.get(k, 0.0)) for k in keys)
    rps = c.get("responses_per_s")
    if rps is None and gen + train + other > 0:
        rps = end_to_end_throughput(c["prompts"] * c["group_size"], gen, train, other).responses_per_s
    eff = CandidateEfficiency(
        label=name,
        prompts=c["prompts"],
        group_size=c["group_size"],
        lr=float(c.get("lr", math.nan)),
        lr_rule=rule,
        family="fixed_lr" if fixed else "main",
        estimate=estimate,
        verdict=None,
        n_runs=max(1, len(c.get("curve", []))),
        failures=(),
        gen_s_per_step=gen,
        train_s_per_step=train,
        other_s_per_step=other,
        samples_consumed=0,
        wall_s=0.0,
    )
    return MeasuredCandidate(
        efficiency=eff,
        responses_per_s=float(rps) if rps is not None else None,
        throughput_ratio=float(c["throughput_ratio"]) if "throughput_ratio" in c else None,
        critic_lr=float(c["critic_lr"]) if "critic_lr" in c else None,
        note=c.get("note", ""),
    )


def measurements_reference(m: Measurements) -> str:
    """study.reference, else the smallest LR-scaled candidate (as the invariance test uses)."""
    if m.study.reference:
        return m.study.reference
    main = [mc.efficiency for mc in m.candidates if mc.efficiency.family == "main"]
    if not main:
        raise AnalysisError(f"{m.path}: every candidate is a fixed-LR control; name study.reference")
    return min(main, key=lambda e: e.batch_responses).label


def throughput_from_measurements(m: Measurements) -> ThroughputModel:
    by = {mc.efficiency.label: mc for mc in m.candidates}
    ref = by[measurements_reference(m)]
    ref_rps = ref.responses_per_s
    if ref_rps is None and any(mc.responses_per_s is not None for mc in m.candidates):
        raise AnalysisError(
            f"{m.path}: the reference {ref.efficiency.label} has only a throughput_ratio while others "
            "give responses_per_s; give the reference an absolute throughput (or all of them ratios)"
        )
    per: dict[str, Throughput] = {}
    absolute = True
    for label, mc in by.items():
        if mc.responses_per_s is not None:
            rps = mc.responses_per_s
        elif mc.throughput_ratio is not None and ref_rps is not None:
            rps = mc.throughput_ratio * ref_rps
        elif mc.throughput_ratio is not None:
            rps, absolute = mc.throughput_ratio, False
        else:
            raise AnalysisError(f"{m.path}: no throughput for {label}")
        e = mc.efficiency
        per[label] = Throughput(rps, e.gen_s_per_step or None, e.train_s_per_step or None, e.other_s_per_step)
    return ThroughputModel("measurements file", absolute, per)


def assess_measurements(m: Measurements) -> SampleEfficiency:
    s = m.study
    return assess(
        [mc.efficiency for mc in m.candidates],
        metric=s.metric,
        target=s.target,
        higher_is_better=s.higher_is_better,
        tolerance=s.tolerance,
        confidence=s.confidence,
        reference=measurements_reference(m),
    )
