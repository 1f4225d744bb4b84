"""JSON-ready dictionaries of the result objects, under the one codec (batchtune.codec)."""

from __future__ import annotations

import math
from typing import Any

from batchtune import codec
from batchtune.analysis.decide.recommend import Recommendation
from batchtune.analysis.sample.critical import CriticalBatch
from batchtune.analysis.sample.efficiency import CandidateEfficiency, SampleEfficiency
from batchtune.analysis.sample.intervals import interval_kind
from batchtune.analysis.sample.seeds import TargetEstimate


def _interval(low: float, high: float) -> list[float | str | None] | None:
    """[low, high] for JSON; None when it has no width (one seed on both sides, or the reference
    against itself): a zero-width pair would read as certainty the data do not have."""
    return None if low == high else [num(low), num(high)]


def num(x: float | None) -> float | str | None:
    """A JSON number under the one convention (batchtune.codec): NaN -> null, inf -> "inf"."""
    return None if x is None else codec.to_jsonable(float(x))


def full_run_estimate(
    eff: SampleEfficiency, rec: Recommendation | None
) -> tuple[str | None, TargetEstimate | None]:
    """One full run's samples-to-target estimate at the recommended candidate (or, before a
    recommendation, the critical batch's; else the reference's): what the probe's cost is measured
    against. None when that candidate never reached the target."""
    label = rec.winner.label if rec is not None else None
    if label is None and eff.critical is not None and eff.critical.batch is not None:
        label = next(
            (
                c.label
                for c in eff.candidates
                if c.family == "main" and c.batch_responses == eff.critical.batch
            ),
            None,
        )
    label = label or eff.reference
    est = eff.get(label).estimate
    if est is None or not math.isfinite(est.samples_to_target):
        return label, None
    return label, est


def cost_ratio_range(spent: float, eff: SampleEfficiency, est: TargetEstimate) -> tuple[float, float] | None:
    """The probe's cost over the full run's interval: (spent / upper, spent / lower); None when the
    interval is a point (one seed and nothing else to go on).

    Branched probes extrapolate R(B0) from a short trunk, so their full run (and this ratio) can be
    uncertain by several times: the range says how much (SampleEfficiency.absolute_ci)."""
    lo, hi = eff.absolute_ci(est)
    if not (math.isfinite(lo) and 0 < lo < hi):
        return None
    return spent / hi if math.isfinite(hi) else 0.0, spent / lo


def probe_cost(eff: SampleEfficiency, rec: Recommendation | None) -> dict[str, Any]:
    """probe_cost: samples spent, one full run's samples at the recommendation (with its interval),
    their ratio (with the range that interval gives), and the samples spent in steps of that
    candidate (``steps_equivalent``: a run longer than that many steps costs more than the probe)."""
    label, est = full_run_estimate(eff, rec)
    full = est.samples_to_target if est is not None else None
    span = cost_ratio_range(eff.total_samples, eff, est) if est is not None else None
    batch = eff.get(label).batch_responses if label is not None else None
    return {
        "samples": eff.total_samples,
        "wall_s": eff.total_wall_s,
        "full_run_samples": num(full),
        "full_run_ci": [num(v) for v in eff.absolute_ci(est)] if est is not None else None,
        "full_run_ci_kind": interval_kind(est, eff.scale_ci) if est is not None else None,
        "full_run_candidate": label,
        "ratio": num(eff.total_samples / full) if full else None,
        "ratio_range": [num(span[0]), num(span[1])] if span is not None else None,
        "steps_equivalent": num(eff.total_samples / batch) if batch else None,
    }


def _candidate_to_dict(c: CandidateEfficiency, eff: SampleEfficiency) -> dict[str, Any]:
    est = c.estimate
    ratio = c.verdict.ratio if c.verdict else None
    return {
        "name": c.label,
        "prompts": c.prompts,
        "group_size": c.group_size,
        "batch_responses": c.batch_responses,
        "lr": num(c.lr),
        "lr_rule": c.lr_rule,
        "family": c.family,
        "status": c.status,
        "status_reason": c.verdict.reason if c.verdict else "; ".join(c.failures),
        "samples_to_target": num(est.samples_to_target) if est else None,
        "samples_statistic": est.statistic if est else None,  # over seeds
        "samples_ci": [num(v) for v in eff.absolute_ci(est)] if est else None,
        "samples_ci_kind": interval_kind(est, eff.scale_ci) if est else None,
        "sample_ratio": num(ratio.ratio) if ratio else (1.0 if c.label == eff.reference else None),
        # null where there is no interval: the reference, or no seed spread on either side
        "sample_ratio_ci": _interval(ratio.ci_low, ratio.ci_high) if ratio else None,
        "n_seeds": est.n_seeds if est else 0,
        "extra_seeds": eff.extra_seeds.get(c.label, 0),  # sequential seeding
        "n_censored": est.n_censored if est else 0,
        "per_seed_samples_to_target": [num(v) for v in est.per_seed] if est else [],
        "failures": list(c.failures),
        "probe_samples": c.samples_consumed,
        "probe_wall_s": c.wall_s,
    }


def _critical_to_dict(crit: CriticalBatch) -> dict[str, Any]:
    quoted = crit.quoted_crossing
    return {
        "batch_responses": num(crit.batch),
        "lower": num(crit.lower),
        "upper": num(crit.upper),
        # the one 1+tol crossing quoted (CriticalBatch.quoted_crossing): the shape-free one where
        # there is one; the joint fit's own is fit.crossing, a diagnostic
        "crossing": num(quoted[0]) if quoted else None,
        "crossing_ci": [num(v) for v in quoted[1]] if quoted else None,
        "crossing_kind": quoted[2] if quoted else None,
        "failed_from": num(crit.failed_from),
        "shape_free": None
        if crit.shape_free is None
        else {
            "crossing": num(crit.shape_free.crossing),
            "ci": [num(v) for v in crit.shape_free.ci],
            "bracket": [num(v) for v in crit.shape_free.bracket],
            "b_crit_equivalent_ci": [num(v) for v in crit.shape_free.b_crit_ci],
            "open_above": crit.shape_free.open_above,  # no critical batch in the measured range
            "confidence": crit.shape_free.confidence,
        },
        "walk_batch": num(crit.walk_batch),
        "fit": None
        if crit.joint is None
        else {
            "model": crit.joint.chosen,
            # diagnostic: the model's crossing holds only if its shape does (36% coverage on the NQM)
            "crossing": num(crit.joint.best.crossing),
            "crossing_ci": [num(v) for v in crit.joint.best.crossing_ci],
            "b_crit": num(crit.joint.best.b_crit),
            "b_crit_ci": [num(v) for v in crit.joint.best.b_crit_ci],
            "exponent": num(crit.joint.best.exponent),
            "residual_rms_log": num(crit.joint.best.residual_rms_log),
            "delta_aic_mccandlish_minus_power": num(crit.joint.delta_aic),
            # diagnostic: the critical batch this crossing alone gives (batch_responses is read by
            # analysis/sample/crossing_batch.py: this one where the McCandlish shape holds)
            "batch_responses": num(crit.model_batch),
            "paired_seeds": crit.joint.paired,
            "runs": crit.joint.n_cells,
            "confidence": crit.joint.confidence,
            "summary": crit.fit_line(),
        },
        "reason": crit.reason,
    }


def efficiency_to_dict(eff: SampleEfficiency) -> dict[str, Any]:
    crit = eff.critical
    candidates = [_candidate_to_dict(c, eff) for c in eff.candidates]
    return {
        "reference": eff.reference,
        "metric": eff.metric,
        "target": num(eff.target),
        "higher_is_better": eff.higher_is_better,
        "tolerance": eff.tolerance,
        "unit": eff.unit,  # what samples and batches count: "samples" (responses), or "tokens"
        "critical_training_batch": None if crit is None else _critical_to_dict(crit),
        "gradient_noise": {
            "grad_norm_slope": num(eff.grad_slope.slope) if eff.grad_slope else None,
            "grad_norm_slope_ci": [num(v) for v in eff.grad_slope.slope_ci] if eff.grad_slope else None,
            "b_simple": num(eff.noise_scale.b_simple) if eff.noise_scale else None,
            "critic_grad_norm_slope": num(eff.critic_grad_slope.slope) if eff.critic_grad_slope else None,
        },
        "probe_cost": probe_cost(eff, None),
        "candidates": candidates,
        "notes": list(eff.notes),
    }


def recommendation_to_dict(rec: Recommendation) -> dict[str, Any]:
    eff, thr, w, wt = rec.efficiency, rec.throughput, rec.winner, rec.winner_throughput
    by_rank = {c.name: c for c in rec.ranking.candidates}
    wr = by_rank[w.label]
    data = efficiency_to_dict(eff)
    data["probe_cost"] = probe_cost(eff, rec)
    for c in data["candidates"]:
        r = by_rank.get(c["name"])
        t = thr.per_candidate.get(c["name"])
        c.update(
            {
                "responses_per_s": num(t.responses_per_s) if t else None,
                "gen_s_per_step": num(t.gen_s) if t else None,
                "train_s_per_step": num(t.train_s) if t else None,
                "other_s_per_step": num(t.other_s) if t else None,
                "rank": r.rank if r else None,
                "time_to_target_s": num(r.time_to_target_s) if r and thr.absolute else None,
                "time_ratio": num(r.time_ratio) if r else None,
                "time_ratio_ci": _interval(*r.time_ratio_ci) if r else None,
                # R/R0 of the ranking's R (its statistic over seeds): time_ratio = this / throughput_ratio
                "rank_sample_ratio": num(r.sample_ratio) if r else None,
                # what the rank orders by: the time moved by the skew of its interval (ranking.py)
                "expected_time_ratio": num(rec.ranking.expected_ratio(r)) if r else None,
                "throughput_ratio": num(r.throughput_ratio) if r else None,
            }
        )
    knee = thr.knee
    data.update(
        {
            "recommended": {
                "name": w.label,
                "prompts": w.prompts,
                "group_size": w.group_size,
                "batch_responses": w.batch_responses,
                "lr": num(w.lr),
                "lr_rule": w.lr_rule,
                "generation_concurrency": wt.generation_concurrency,
                "time_to_target_s": num(wr.time_to_target_s) if thr.absolute else None,
                "time_to_target_h": num(wr.time_to_target_s / 3600) if thr.absolute else None,
                "time_ratio": num(wr.time_ratio),
                "time_ratio_ci": _interval(*wr.time_ratio_ci),
                "samples_to_target": num(w.estimate.samples_to_target) if w.estimate else None,
                "responses_per_s": num(wt.responses_per_s),
                "reason": rec.ranking.reason,
                # how much faster than this pick another candidate could be (90% interval's end);
                # null when the pick's own R has no interval (one seed)
                "regret_high": None
                if w.estimate is None or w.estimate.no_interval
                else num(rec.ranking.regret_high),
                "regret_against": rec.ranking.regret_against,
                # how often the pick survives the throughput's repeat spread (decide/throughput_noise.py)
                "throughput_noise": None if rec.throughput_noise is None else rec.throughput_noise.to_dict(),
                "evidence": list(rec.evidence),  # why the pick rests on thin evidence; [] when it does not
                "confirm": rec.confirm,
            },
            "throughput_source": thr.source,
            "throughput_absolute": thr.absolute,
            "critical_generation_batch": None
            if knee is None
            else {
                "concurrency": num(knee.concurrency),
                "threshold": knee.threshold,
                "saturated": knee.saturated,
                "from_fit": num(knee.from_fit),
                "reason": knee.reason,
                "mode": thr.mode,
            },
            "notes": list(rec.notes),
        }
    )
    return {"recommended": data.pop("recommended"), **data}
