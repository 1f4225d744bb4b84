"""The workflow of `check`: a trainer config against a probe's evidence (or a measurements file).
Inputs in, a result object out, no printing. `smoke` is in workflow/smoke.py."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchtune.errors import AnalysisError, InputError
from batchtune.records.types import OFFPOLICY_SUFFIX, candidate_label, offpolicy_suffix
from batchtune.workflow.recommend import recommend_from_args

if TYPE_CHECKING:
    from batchtune.analysis.decide.check import CheckResult, CheckTolerances
    from batchtune.integrations.trainer_configs import TrainerConfig

# ---- check ---------------------------------------------------------------------------------------

LR_RULES_CHECKABLE = ("sqrt", "linear", "none")


def tolerances(
    lr: float | None = None, time: float | None = None, waste: float | None = None
) -> CheckTolerances:
    """The check's tolerances: the defaults, each replaced by its option where one is given
    (`--lr-tolerance`, `--time-tolerance`, `--waste-tolerance`). Each is a finite number >= 0."""
    from batchtune.analysis.decide.check import CheckTolerances

    given = {"lr": lr, "time": time, "waste": waste}
    for name, value in given.items():
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise InputError(f"--{name}-tolerance {value:g}: give a finite number >= 0 (1+x bounds a ratio)")
    return dataclasses.replace(CheckTolerances(), **{k: v for k, v in given.items() if v is not None})


def check(
    config: Path,
    *,
    fmt: str = "auto",
    results: str | None = None,
    measurements: Path | None = None,
    baseline: Path | None = None,
    lr_rule: str = "auto",
    lr_tolerance: float | None = None,
    time_tolerance: float | None = None,
    waste_tolerance: float | None = None,
) -> tuple[TrainerConfig, CheckResult]:
    """Check a trainer config against a probe's results (or a measurements file), with the
    tolerances the options give (`tolerances`); returns (TrainerConfig, CheckResult).

    Evidence that cannot support an estimate (AnalysisError) becomes an "insufficient" check, so the
    caller still writes its JUnit and summary, and exits 3."""
    from batchtune.analysis.decide.batch_check import check_batch
    from batchtune.analysis.decide.check import (
        INSUFFICIENT,
        CheckItem,
        CheckResult,
        check_lr,
        check_time,
        interp_loglog,
    )
    from batchtune.integrations.trainer_configs import read_trainer_config

    tol = tolerances(lr=lr_tolerance, time=time_tolerance, waste=waste_tolerance)
    if (results is None) == (measurements is None):
        raise InputError("give the evidence: --results DIR (a probe's results) or --measurements FILE")
    if lr_rule not in ("auto", *LR_RULES_CHECKABLE):
        raise InputError(f"--lr-rule {lr_rule!r}: choose auto, {', '.join(LR_RULES_CHECKABLE)}")
    tc = read_trainer_config(config, fmt)
    base_value, base_unit, base_target = (
        _read_baseline(baseline) if baseline is not None else (None, None, None)
    )
    source = str(results or measurements)
    try:
        rec, _, _ = recommend_from_args(
            results=results, measurements=measurements, plot=False, command="check"
        )
    except AnalysisError as exc:
        item = CheckItem(
            "evidence", INSUFFICIENT, "-", "-", f"not enough evidence in {source}: {exc}", "batch"
        )
        return tc, CheckResult((item,), None, "")
    _refuse_pretraining(rec, source)
    ranking, rps = _time_ranking(rec)
    priced = _offpolicy_price(rec, tc, _probe_sync_every(results), ranking.unit)
    tc, eff, n = priced.config, rec.efficiency, float(priced.config.batch_responses)
    value = eff.target if math.isfinite(eff.target) else None  # as JSON holds it (NaN: null)
    target = {"metric": eff.metric, "target": value, "higher_is_better": eff.higher_is_better}
    notes = [*tc.notes, *priced.notes]
    from batchtune.integrations.emit import pick_offpolicy
    from batchtune.integrations.trainer_configs_async import pick_note

    offpolicy = pick_note(tc.staleness, tc.updates_per_batch, *pick_offpolicy(rec))  # k, u as run vs pick
    notes += [offpolicy] if offpolicy and priced.in_probe_units else []
    notes += _baseline_notes(baseline, base_target, target)
    batches, times, unit = list(ranking.batches), list(ranking.times), ranking.unit
    ref = eff.get(eff.reference)
    notes += [f"the evidence's own pick rests on thin evidence: {why}" for why in rec.evidence]
    rule = _lr_rule(lr_rule, ref.lr_rule, notes)
    predicted = interp_loglog(n, batches, times) if priced.on_curve else priced.time
    why = (
        priced.why
        if not priced.on_curve
        else f"N = {n:g} is outside the measured batches {batches[0]:g}-{batches[-1]:g}"
        if batches and not batches[0] <= n <= batches[-1]
        else "a neighbouring batch never reached the target"
    )
    items = (
        check_batch(n, eff.critical, batches, rps, tol.waste, ranking),
        check_lr(tc.lr, n, ref.lr, float(ref.batch_responses), rule, tol.lr),
        _check_concurrency(tc, rec.throughput.knee, n),
        check_time(predicted, unit, base_value, base_unit, tol.time, why),
    )
    return tc, CheckResult(items, predicted, unit, tuple(notes), target)


def _check_concurrency(tc: TrainerConfig, knee: Any, n: float) -> Any:
    """The config's concurrency per engine against the knee, capped at an engine's share of what it
    can have in flight: a step's ``n`` responses (in the probe's units), or, for verl fully_async,
    which streams prompts with no step's batch, what its rollouter keeps in flight."""
    from batchtune.analysis.decide.check import check_concurrency
    from batchtune.integrations.trainer_configs_async import FullyAsyncInterval

    iv = tc.own_units
    if isinstance(iv, FullyAsyncInterval):
        flight = iv.prompts_in_flight(tc.engines) * iv.group_size
        return check_concurrency(tc.generation_concurrency, knee, flight, tc.engines, streamed=True)
    return check_concurrency(tc.generation_concurrency, knee, n, tc.engines)


def _refuse_pretraining(rec: Any, source: str) -> None:
    if rec.efficiency.unit == "tokens":
        raise InputError(
            f"{source} holds a pre-training probe (batches in tokens): check reads RL trainer configs "
            "(verl, TRL, OpenRLHF); compare a pre-training config with `recommend --emit megatron` instead"
        )


def _lr_rule(asked: str, recorded: str, notes: list[str]) -> str:
    """The LR rule to check against: the one asked for, else the results' own where it is checkable,
    else sqrt (with a note saying so)."""
    if asked != "auto":
        return asked
    if recorded in LR_RULES_CHECKABLE:
        return recorded
    notes.append(f"the results record LR rule {recorded!r}: the sqrt rule is assumed (--lr-rule)")
    return "sqrt"


def _baseline_notes(
    baseline: Path | None, base_target: dict[str, Any] | None, target: dict[str, Any]
) -> list[str]:
    """A baseline read to another target compares nothing (refused); one without a target, a note."""
    if base_target is not None and not _same_target(base_target, target):
        raise InputError(
            f"the baseline {baseline} predicted the time to {_target_text(base_target)}, these results "
            f"are read to {_target_text(target)}: compare with a baseline of the same target (regenerate it)"
        )
    if baseline is not None and base_target is None:
        return [
            f"the baseline {baseline} does not record its target (an older batchtune wrote it): its "
            "time is compared as if it were to the same target; regenerate it to have that checked"
        ]
    return []


def _time_ranking(rec: Any) -> tuple[Any, list[float]]:
    """The recommendation's own ranking of its main batches (check and recommend cannot disagree),
    and their responses per second."""
    from batchtune.analysis.decide.batch_check import TimeRanking
    from batchtune.analysis.decide.ranking import within_uncertainty

    ranked = {r.name: r for r in rec.ranking.candidates}
    main = sorted(
        (c for c in rec.efficiency.candidates if c.family == "main" and c.label in ranked),
        key=lambda c: c.batch_responses,
    )
    absolute = rec.throughput.absolute
    pick = rec.ranking.by_name(rec.ranking.winner)
    ranking = TimeRanking(
        batches=tuple(float(c.batch_responses) for c in main),
        times=tuple(
            ranked[c.label].time_to_target_s if absolute else ranked[c.label].time_ratio for c in main
        ),
        unit="s" if absolute else "x reference",
        pick_name=pick.name,
        pick_batch=pick.batch_responses,
        pick_time=pick.time_to_target_s if absolute else pick.time_ratio,
        tied=tuple(c.batch_responses for c, *_ in within_uncertainty(rec.ranking)),
    )
    return ranking, [ranked[c.label].responses_per_s for c in main]


@dataclass(frozen=True)
class _Priced:
    """How `check` prices a config's time-to-target: at the probe's off-policy candidate it runs
    (``time``; None: that candidate never reached the target), or on the on-policy curve at its
    batch (``on_curve``), or not at all (``why``); ``config`` in the probe's units."""

    config: TrainerConfig
    time: float | None = None
    on_curve: bool = True
    why: str = ""
    notes: tuple[str, ...] = ()
    in_probe_units: bool = True  # False: k and u are the config's own units (TRL AsyncGRPO, verl fully_async)


def _probe_sync_every(results: str | None) -> int:
    """Trainer steps per weight sync in the probe's runs (its stored recipe); 1 for measurements."""
    if results is None:
        return 1
    from batchtune.workflow.loading import load

    a = load(None, [], results, stored=True).algorithm
    return a.runs_sync_every  # as the joint decision read the runs (joint.py)


def _offpolicy_price(rec: Any, tc: TrainerConfig, sync_every: int, unit: str) -> _Priced:
    """Where the config ``tc`` is priced: the ranked off-policy candidate it runs (its P, G, staleness k
    and updates u: ``P{p}xG{g}-k{k}u{u}``) where the probe measured it. The on-policy curve would
    price an async config at its sync batch's time, so an off-policy config the probe did not
    measure is priced there only with a note saying so. A TRL AsyncGRPOConfig (optimiser steps and
    versions) and a verl fully_async one (sync intervals) are first read in the probe's rollout
    batches (``in_rollout_batches``), and priced at nothing where that reading is not whole or
    matches several candidates."""
    from batchtune.integrations.trainer_configs_async import in_rollout_batches

    ranked = {r.name: r for r in rec.ranking.candidates}
    found = {}  # label -> (P, G, k, u) of each ranked off-policy candidate
    for c in rec.efficiency.candidates:
        named = OFFPOLICY_SUFFIX.search(c.label)
        if c.family == "offpolicy" and named and c.label in ranked:
            found[c.label] = (c.prompts, c.group_size, int(named[1]), int(named[2]))
    k_lo = k_hi = tc.staleness
    if tc.own_units is not None:
        read = in_rollout_batches(tc.own_units, sync_every)
        if isinstance(read, str):
            why = f"{tc.own_units.name} has no reading in the probe's rollout batches: {read}"
            return _Priced(tc, None, False, why, (f"{why}; no time-to-target is priced",), False)
        p, batch = read.batch_responses // tc.group_size, tc.settings["batch"]
        scale = read.batch_responses / tc.batch_responses  # TRL's batch in completions, verl's in prompts
        settings = {  # the lines stay the config's own (a step, an interval): the note says how it was scaled
            **tc.settings,
            "prompts": dataclasses.replace(tc.settings["prompts"], value=float(p)),
            "batch": dataclasses.replace(batch, value=batch.value * scale),
        }
        tc = dataclasses.replace(
            tc,
            prompts=p,
            staleness=float(read.staleness_hi),
            updates_per_batch=float(read.updates_per_batch),
            settings=settings,
        )
        k_lo, k_hi = read.staleness_lo, read.staleness_hi
        notes: tuple[str, ...] = (read.how,)
    else:
        notes = ()
    u, shape = tc.updates_per_batch, (tc.prompts, tc.group_size)
    hits = [lab for lab, (p, g, k, uu) in found.items() if (p, g) == shape and uu == u and k_lo <= k <= k_hi]
    wanted = candidate_label(*shape) + (
        offpolicy_suffix(k_hi, u) if k_lo == k_hi else f" at staleness {k_lo:g}-{k_hi:g}, u = {u:g}"
    )
    if len(hits) > 1:
        why = f"the config matches the probe's {' and '.join(sorted(hits))} (looked for {wanted})"
        return _Priced(tc, None, False, why, (*notes, f"{why}: no time-to-target is priced"))
    if hits:
        r = ranked[hits[0]]
        t = float(r.time_to_target_s if unit == "s" else r.time_ratio)
        why = f"the probe's candidate {hits[0]} never reached the target"
        notes += (f"time-to-target priced at the probe's {hits[0]}",)
        if tc.own_units is None and k_hi > 0 and sync_every > 1:  # V1, one-step-off, OpenRLHF async
            notes += (
                f"{tc.trainer} syncs weights after every step, the probe's {hits[0]} synced every "
                f"{sync_every} (algorithm.sync_every): the difference (time in syncs, lag) is not priced",
            )
        return _Priced(tc, t, False, why, notes)
    if k_hi > 0:  # off-policy, not measured: the on-policy curve, said
        notes += (
            f"check looked for the probe's candidate {wanted}, which it did not measure: time-to-target "
            f"is the on-policy curve's at N = {tc.batch_responses}, with no staleness priced",
        )
    return _Priced(tc, notes=notes)


def _same_target(a: dict[str, Any], b: dict[str, Any]) -> bool:
    x, y = a["target"], b["target"]
    same_value = (x is None and y is None) or (
        x is not None and y is not None and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
    )
    return a["metric"] == b["metric"] and a["higher_is_better"] == b["higher_is_better"] and same_value


def _target_text(t: dict[str, Any]) -> str:
    value = "(none)" if t["target"] is None else f"{t['target']:g}"
    return f"{t['metric']} {'>=' if t['higher_is_better'] else '<='} {value}"


def _read_baseline(path: Path) -> tuple[float, str, dict[str, Any] | None]:
    """The predicted time-to-target stored by an earlier `batchtune check --json`: value, unit and
    the target it was predicted to (None from a baseline written before it was recorded)."""
    from batchtune import codec

    if not path.is_file():
        raise InputError(f"baseline {path} not found (write one with `batchtune check ... --json > {path}`)")
    data = codec.loads(path.read_text(), str(path))
    t = data.get("predicted_time_to_target") if isinstance(data, dict) else None
    if not isinstance(t, dict) or not isinstance(t.get("unit"), str):
        raise InputError(
            f"{path}: no predicted_time_to_target {{value, unit}}; is it `batchtune check --json` output?"
        )
    value = codec.as_float(t.get("value"), f"{path}: predicted_time_to_target.value")
    if not (value > 0):
        raise InputError(f"{path}: the baseline has no finite time-to-target ({t.get('value')!r})")
    target = t.get("target")
    if target is not None and not (
        isinstance(target, dict)
        and isinstance(target.get("metric"), str)
        and isinstance(target.get("higher_is_better"), bool)
        and (
            target.get("target") is None
            or (isinstance(target["target"], int | float) and not isinstance(target["target"], bool))
        )
    ):
        raise InputError(
            f"{path}: predicted_time_to_target.target is not {{metric: text, target: a number or null, "
            "higher_is_better: true or false}"
        )
    return value, t["unit"], target
