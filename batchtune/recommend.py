"""`batchtune recommend`: time-to-target T(B) = R(B) / Θ(B) for every candidate (METHOD.md §1, §5).

R(B) comes from probe runs, imported logs or a measurements file; Θ(B) from a generation/training
profile of this hardware, from the timings the probe recorded, or from the measurements file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchtune.analysis.efficiency import CandidateEfficiency, SampleEfficiency, assess
from batchtune.analysis.ranking import Ranking, rank_time_to_target
from batchtune.analysis.throughput import Knee, generation_time_s
from batchtune.errors import AnalysisError
from batchtune.measurements import Measurements
from batchtune.profile_analysis import ProfileResult
from batchtune.serialize import efficiency_to_dict, num


@dataclass(frozen=True)
class Throughput:
    """Predicted end-to-end throughput of one candidate: N / (t_gen + t_train + t_other)."""

    responses_per_s: float
    gen_s: float | None = None
    train_s: float | None = None
    other_s: float | None = None
    generation_concurrency: int | None = None


@dataclass(frozen=True)
class ThroughputModel:
    source: str  # profile | probe timings | measurements file
    absolute: bool  # False when only ratios to the reference are known
    per_candidate: dict[str, Throughput]
    knee: Knee | None = None  # the critical generation batch, when a profile exists
    mode: str = ""  # generation mode the prediction used (eos or fixed)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recommendation:
    efficiency: SampleEfficiency
    throughput: ThroughputModel
    ranking: Ranking
    winner: CandidateEfficiency
    winner_throughput: Throughput
    confirm: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return recommendation_to_dict(self)


def throughput_from_profile(
    profile: ProfileResult | None, cands: Sequence[CandidateEfficiency], other_s: float
) -> ThroughputModel | None:
    """Predict Θ(N) from the measured generation and training curves of a profile (METHOD §5.2).

    Generation uses the EOS sweep when there is one (real RL lengths are long-tailed), else the
    fixed-length one, at the largest concurrency that fitted in memory: min(N, c_max). The fits and
    the knee are the profile's own (profile_analysis.analyse_throughput), not refitted here.
    """
    if profile is None or profile.train_fit is None:
        return None
    for mode in ("eos", "fixed"):
        m = profile.modes.get(mode)
        if m is not None and m.fit is not None and len({p.concurrency for p in m.ok_points}) >= 2:
            break
    else:
        return None
    c_max = float(max(p.concurrency for p in m.ok_points))
    notes: list[str] = []
    per: dict[str, Throughput] = {}
    for c in cands:
        n = c.batch_responses
        gen_s = generation_time_s(n, m.fit, c_max)
        train_s = float(np.asarray(profile.train_fit.predict(n)).reshape(-1)[0])
        per[c.label] = Throughput(
            n / (gen_s + train_s + other_s), gen_s, train_s, other_s, int(min(n, c_max))
        )
    if max(c.batch_responses for c in cands) > c_max:
        notes.append(
            f"batches above {int(c_max)} responses are generated in waves of {int(c_max)} "
            "(the largest measured concurrency)"
        )
    return ThroughputModel("profile", True, per, m.knee, mode, tuple(notes))


def throughput_from_probe(cands: Sequence[CandidateEfficiency], other_s: float) -> ThroughputModel:
    """Θ(N) = N / (median gen_s + median train_s + other_s) per step, as the probe measured them.

    Evaluation time on the held-out set is not part of training, so the probe's own other_s is left
    out; ``other_s`` (reward, reference log-probs, weight sync) comes from the recipe.
    """
    per: dict[str, Throughput] = {}
    for c in cands:
        step = c.gen_s_per_step + c.train_s_per_step + other_s
        if step <= 0:
            continue
        per[c.label] = Throughput(c.batch_responses / step, c.gen_s_per_step, c.train_s_per_step, other_s)
    if not per:
        raise AnalysisError("no timings to predict throughput from: run `batchtune profile-gen` first")
    return ThroughputModel("probe timings", True, per)


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


def recommend(efficiency: SampleEfficiency, throughput: ThroughputModel) -> Recommendation:
    """Rank every candidate with an estimate and a throughput by predicted time-to-target."""
    have = throughput.per_candidate
    ranked = [c for c in efficiency.candidates if c.estimate is not None and c.label in have]
    if efficiency.reference not in {c.label for c in ranked}:
        raise AnalysisError(f"the reference {efficiency.reference} has no throughput; cannot normalise")
    ref_est = efficiency.get(efficiency.reference).estimate
    if ref_est is None or not math.isfinite(ref_est.samples_to_target):
        cmp = ">=" if efficiency.higher_is_better else "<="
        raise AnalysisError(
            f"the reference {efficiency.reference} never reached {efficiency.metric} {cmp} "
            f"{efficiency.target:g}, so no time-to-target can be compared: lower the target, run longer "
            "(budget.max_samples), or check that target.metric names the right metric"
        )
    if len(ranked) < 2:
        raise AnalysisError("fewer than two candidates have both samples-to-target and throughput")
    ranking = rank_time_to_target(
        [c.label for c in ranked],
        [c.batch_responses for c in ranked],
        [c.estimate.samples_to_target for c in ranked],
        [_lower_bound(c.estimate) for c in ranked],
        [c.estimate.ci_high for c in ranked],
        [throughput.per_candidate[c.label].responses_per_s for c in ranked],
        reference=efficiency.reference,
    )
    winner = efficiency.get(ranking.winner)
    wt = throughput.per_candidate[winner.label]
    notes = list(efficiency.notes) + list(throughput.notes)
    cs = efficiency.critic_grad_slope
    if cs is not None and not cs.noise_dominated:
        notes.append(
            "the PPO critic's gradient norm does not fall like B^-1/2 over this range: its critical batch "
            "is smaller than the actor's; give it smaller mini-batches (verl critic.ppo_mini_batch_size) "
            "and its own LR rule (METHOD §3.5)"
        )
    if winner.family == "fixed_lr":
        notes.append("the winner is a fixed-LR control: check the LR scaling rule")
    if not math.isfinite(winner.estimate.samples_to_target):
        notes.append("no candidate reached the target: the ranking is by censoring bounds only")
    return Recommendation(
        efficiency=efficiency,
        throughput=throughput,
        ranking=ranking,
        winner=winner,
        winner_throughput=wt,
        confirm=_confirm_text(efficiency, winner, wt, throughput.absolute),
        notes=tuple(notes),
    )


def _lower_bound(est: Any) -> float:
    """The CI's low end, or, when most seeds never reached the target, the samples they ran for:
    R is at least that much (censoring), which is what ranks such a candidate among the slow ones."""
    if math.isfinite(est.ci_low):
        return est.ci_low
    bounds = [b for b in est.censored_at if b is not None and math.isfinite(b)]
    return max(bounds) if bounds else math.inf


def _confirm_text(eff: SampleEfficiency, w: CandidateEfficiency, wt: Throughput, absolute: bool) -> str:
    est = w.estimate
    cmp = ">=" if eff.higher_is_better else "<="
    lr = f", lr {w.lr:.3g}" if math.isfinite(w.lr) else ""
    text = f"Confirm with one full run at {w.prompts} prompts x {w.group_size} responses{lr}: "
    text += "it should reach "
    goal = f"{eff.metric} {cmp} {eff.target:g}" if math.isfinite(eff.target) else "the target"
    text += f"{goal} after about {est.samples_to_target:,.0f} responses"
    text += f" ({est.samples_to_target / w.batch_responses:,.0f} steps"
    if est.ci_high > est.ci_low:
        text += f"; {est.confidence:.0%} CI {est.ci_low:,.0f}-{est.ci_high:,.0f}"
    text += ")"
    if absolute and math.isfinite(est.samples_to_target):
        seconds = est.samples_to_target / wt.responses_per_s
        when = (
            f"{seconds / 3600:.2f} h"
            if seconds >= 3600
            else (f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s")
        )
        text += f", about {when} at the predicted throughput"
    text += ". If it needs clearly more, the probe was too short or too noisy: add seeds and probe again."
    return text


def recommendation_to_dict(rec: Recommendation) -> dict[str, Any]:
    eff, thr, w, wt = rec.efficiency, rec.throughput, rec.winner, rec.winner_throughput
    by_rank = {c.name: c for c in rec.ranking.candidates}
    wr = by_rank[w.label]
    data = efficiency_to_dict(eff)
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
                "time_ratio_ci": [num(r.time_ratio_ci[0]), num(r.time_ratio_ci[1])] if r else None,
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
                "time_ratio_ci": [num(wr.time_ratio_ci[0]), num(wr.time_ratio_ci[1])],
                "samples_to_target": num(w.estimate.samples_to_target),
                "responses_per_s": num(wt.responses_per_s),
                "reason": rec.ranking.reason,
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
