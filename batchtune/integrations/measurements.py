"""Measurements files: what a user measured elsewhere, written down for `batchtune recommend`.

A TOML file with a ``[study]`` table and one ``[[candidate]]`` table per candidate (see
docs/formats.md and recipes/hunyuan-grpo-measurements.toml). Per candidate: P, G, the LR or its rule,
samples-to-target (a number, optionally with a CI, or curves per seed), and throughput (responses/s,
per-step seconds, or a ratio to the reference's throughput).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from batchtune.analysis.decide.recommend import Throughput, ThroughputModel
from batchtune.analysis.sample.assess import assess
from batchtune.analysis.sample.curves import samples_to_target
from batchtune.analysis.sample.efficiency import CandidateEfficiency, SampleEfficiency
from batchtune.analysis.sample.seeds import estimate_from_value, estimate_over_seeds
from batchtune.analysis.system.throughput import end_to_end_throughput
from batchtune.errors import AnalysisError, InputError
from batchtune.recipe.ranges import NONNEG, POS, Range
from batchtune.recipe.schema import TargetConfig
from batchtune.recipe.tables import read_table
from batchtune.records.types import candidate_label

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LR_RULES_GIVEN = ("given", "sqrt", "linear", "none", "table")  # how each candidate's LR was chosen
# an LR of 0 (or none given) means "not known": the winner's LR is then not emitted
CANDIDATE_RANGES: dict[str, Range] = {
    **dict.fromkeys(
        ("prompts", "group_size", "samples_to_target", "responses_per_s", "throughput_ratio"), POS
    ),
    **dict.fromkeys(("lr", "critic_lr", "gen_s_per_step", "train_s_per_step", "other_s_per_step"), NONNEG),
}


@dataclass(frozen=True)
class CurveTable:
    """One ``[[candidate.curve]]``: a seed's learning curve (metric against samples)."""

    seed: int | None = None
    samples: list[float] = field(default_factory=list)
    metric: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class CandidateTable:
    """One ``[[candidate]]`` table as written; None: not given."""

    name: str = ""
    prompts: int | None = None
    group_size: int | None = None
    lr: float | None = None
    lr_rule: str = "given"
    critic_lr: float | None = None
    samples_to_target: float | None = None
    samples_ci: list[float] | None = None
    curve: list[CurveTable] | None = None
    responses_per_s: float | None = None
    throughput_ratio: float | None = None
    gen_s_per_step: float | None = None
    train_s_per_step: float | None = None
    other_s_per_step: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Study:
    """The [study] table; its defaults are the recipe's target defaults (recipe/schema.py)."""

    name: str = ""  # default: the file's stem
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


def _check_candidate(c: Any, where: str, errors: list[str]) -> CandidateTable | None:
    """One [[candidate]] table, typed; None (each problem appended to ``errors``) when it has one."""
    if not isinstance(c, dict):
        errors.append(f"{where}: expected a [[candidate]] table")
        return None
    n_before = len(errors)
    t: CandidateTable = read_table(CandidateTable, c, where, errors)
    if len(errors) > n_before:
        return None  # wrong types: the checks below would read them
    for key in ("prompts", "group_size"):
        if getattr(t, key) is None:
            errors.append(f"{where}.{key}: required")
    if t.samples_to_target is None and t.curve is None:
        errors.append(f"{where}: give samples_to_target or curve")
    elif t.samples_to_target is not None and t.curve is not None:
        errors.append(f"{where}: give samples_to_target or curve, not both (one would be ignored)")
    thr = [k for k in ("responses_per_s", "throughput_ratio", "gen_s_per_step") if getattr(t, k) is not None]
    if not thr:
        errors.append(f"{where}: give responses_per_s, throughput_ratio or gen_s_per_step")
    elif len(thr) > 1:
        errors.append(f"{where}: give one of {', '.join(thr)}, not several (one would be ignored)")
    if t.lr_rule not in LR_RULES_GIVEN:
        errors.append(f"{where}.lr_rule: {t.lr_rule!r} is not one of {', '.join(LR_RULES_GIVEN)}")
    for key, rng in CANDIDATE_RANGES.items():
        v = getattr(t, key)
        if v is not None and v not in rng:
            errors.append(f"{where}.{key}: {c[key]!r} must be a finite number {rng.describe()}")
    _check_curves(t.curve or [], f"{where}.curve", errors)
    if t.samples_ci is not None and len(t.samples_ci) != 2:
        errors.append(f"{where}.samples_ci: expected [low, high] numbers")
    return t if len(errors) == n_before else None


def _check_curves(curves: list[CurveTable], where: str, errors: list[str]) -> None:
    seeds = [cv.seed for cv in curves if cv.seed is not None]
    if len(set(seeds)) != len(seeds):
        errors.append(f"{where}: seeds repeat ({seeds}); each curve is one seed")
    for j, curve in enumerate(curves):
        s, m = curve.samples, curve.metric
        if len(s) != len(m) or not s:
            errors.append(f"{where}[{j}]: samples and metric need the same non-zero length")
        elif not all(math.isfinite(v) and v >= 0 for v in s) or any(
            b < a for a, b in zip(s, s[1:], strict=False)
        ):
            errors.append(f"{where}[{j}].samples: must be finite, >= 0 and never decrease")


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
    study: Study = read_table(Study, study_raw, "study", errors)
    cands_raw = data.get("candidate", [])
    if not isinstance(cands_raw, list) or len(cands_raw) < 2:
        errors.append("candidate: needs at least two [[candidate]] tables")
        cands_raw = []
    tables = [_check_candidate(c, f"candidate[{i}]", errors) for i, c in enumerate(cands_raw)]
    _check_study_values(study_raw, errors)
    if any("curve" in c for c in cands_raw if isinstance(c, dict)) and "target" not in study_raw:
        errors.append("study.target: required when a candidate gives curves")
    if errors:
        raise InputError(f"{len(errors)} problem(s) in {p}: " + "; ".join(errors))

    study = dataclasses.replace(study, name=study.name or p.stem)
    out = [_candidate(t, study, p) for t in tables if t is not None]
    labels = [m.efficiency.label for m in out]
    if len(set(labels)) != len(labels):
        raise InputError(f"{p}: candidate names repeat ({', '.join(labels)}); give each a distinct name")
    if study.reference and study.reference not in labels:
        raise InputError(f"{p}: study.reference {study.reference!r} names no candidate ({', '.join(labels)})")
    return Measurements(study=study, candidates=tuple(out), path=str(p))


def _candidate(t: CandidateTable, study: Study, path: Path) -> MeasuredCandidate:
    prompts, group_size = t.prompts or 0, t.group_size or 0  # both required: checked before
    fixed = t.lr_rule == "none"
    name = t.name or candidate_label(prompts, group_size, fixed_lr=fixed)
    if t.curve is not None:
        crossings = [
            samples_to_target(
                np.asarray(cv.samples, float),
                np.asarray(cv.metric, float),
                study.target,
                higher_is_better=study.higher_is_better,
                ema_alpha=study.ema_alpha,
            )
            for cv in t.curve
        ]
        estimate = estimate_over_seeds(crossings, confidence=study.confidence)
    else:
        stt, ci = t.samples_to_target or 0.0, t.samples_ci
        if ci is not None and not ci[0] <= stt <= ci[1]:
            raise InputError(f"{path}: {name}.samples_ci must be [low, high] around samples_to_target")
        estimate = estimate_from_value(stt, (ci[0], ci[1]) if ci else None)
    gen, train, other = t.gen_s_per_step or 0.0, t.train_s_per_step or 0.0, t.other_s_per_step or 0.0
    rps = t.responses_per_s
    if rps is None and gen + train + other > 0:
        rps = end_to_end_throughput(prompts * group_size, gen, train, other).responses_per_s
    eff = CandidateEfficiency(
        label=name,
        prompts=prompts,
        group_size=group_size,
        lr=math.nan if t.lr is None else t.lr,
        lr_rule=t.lr_rule,
        family="fixed_lr" if fixed else "main",
        estimate=estimate,
        verdict=None,
        n_runs=max(1, len(t.curve or [])),
        failures=(),
        gen_s_per_step=gen,
        train_s_per_step=train,
        other_s_per_step=other,
        samples_consumed=0,
        wall_s=0.0,
    )
    return MeasuredCandidate(eff, rps, t.throughput_ratio, t.critic_lr, t.note)


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
    eff = assess(
        [mc.efficiency for mc in m.candidates],
        metric=s.metric,
        target=s.target,
        higher_is_better=s.higher_is_better,
        tolerance=s.tolerance,
        confidence=s.confidence,
        reference=measurements_reference(m),
    )
    return dataclasses.replace(eff, from_measurements=True)
