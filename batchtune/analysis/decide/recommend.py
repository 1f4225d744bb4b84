"""`batchtune recommend`: time-to-target T(B) = R(B) / Θ(B) for every candidate (docs/method.md §1, §5).

R(B) comes from probe runs, imported logs or a measurements file; Θ(B) from a generation/training
profile of this hardware, from the timings the probe recorded, or from the measurements file.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchtune.analysis.branched.schedule import ScheduleComparison
from batchtune.analysis.decide.async_rank import AsyncPick, JointDecision
from batchtune.analysis.decide.ranking import Ranking, rank_time_to_target
from batchtune.analysis.decide.throughput_noise import NoiseCheck, pick_under_noise, point_spread, step_spread
from batchtune.analysis.sample.efficiency import CandidateEfficiency, SampleEfficiency
from batchtune.analysis.sample.evals import evals_to
from batchtune.analysis.sample.intervals import interval_kind
from batchtune.analysis.sample.ratio import INVARIANT, REFERENCE
from batchtune.analysis.sample.seeds import TargetEstimate
from batchtune.analysis.system.knee import Knee
from batchtune.analysis.system.profile import ProfileResult
from batchtune.analysis.system.throughput import end_to_end_throughput, predict_end_to_end
from batchtune.errors import AnalysisError


@dataclass(frozen=True)
class Throughput:
    """Predicted end-to-end throughput of one candidate: N / (t_gen + t_train + t_other)."""

    responses_per_s: float
    gen_s: float | None = None
    train_s: float | None = None
    other_s: float | None = None
    generation_concurrency: int | None = None
    spread: float = math.nan  # its step time's relative repeat half-range (throughput_noise.py); NaN: unknown


@dataclass(frozen=True)
class ThroughputModel:
    source: str  # profile | probe timings | measurements file
    absolute: bool  # False when only ratios to the reference are known
    per_candidate: dict[str, Throughput]
    knee: Knee | None = None  # the critical generation batch, when a profile exists
    mode: str = ""  # generation mode the prediction used (eos or fixed)
    notes: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()  # why its times may not be the machine's (a contended profile)


@dataclass(frozen=True)
class Recommendation:
    efficiency: SampleEfficiency
    throughput: ThroughputModel
    ranking: Ranking
    winner: CandidateEfficiency
    winner_throughput: Throughput
    confirm: str
    notes: tuple[str, ...] = field(default_factory=tuple)
    schedule: ScheduleComparison | None = None  # a batch schedule vs the best fixed batch (branched probes)
    # why the pick rests on thin evidence (weak_evidence); empty when none of its checks fired
    evidence: tuple[str, ...] = ()
    # how often the pick survives each throughput drawn within its repeat spread; None: no spread
    throughput_noise: NoiseCheck | None = None
    # the ranking over sync and async runs (decide/async_joint.py); None: the recipe has no
    # staleness, reuse or async knob, and nothing of it was computed
    async_decision: JointDecision | None = None
    # the winner's updates per rollout batch u where all its runs were imported from logs (their
    # import-logs --updates-per-batch: a log gives the product mini-batches x epochs, not its split);
    # 0: probe runs, at the recipe's mini-batches or their label's -k{k}u{u}
    logged_updates: int = 0

    @property
    def async_pick(self) -> AsyncPick | None:
        """How to run the winner (mode, k, u, sync, in-flight cap, split); None without knobs."""
        return None if self.async_decision is None else self.async_decision.pick

    @property
    def async_choice(self) -> AsyncPick | None:
        """The same pick, by the name the emitters read (integrations/emit.py)."""
        return self.async_pick


def throughput_from_profile(
    profile: ProfileResult | None, cands: Sequence[CandidateEfficiency], other_s: float
) -> ThroughputModel | None:
    """Predict Θ(N) from the measured generation and training curves of a profile (docs/method.md §5.2).

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
        e2e = predict_end_to_end(n, m.fit, profile.train_fit, c_max, other_s)
        rel_g, rel_t = point_spread(m.points, min(n, c_max)), point_spread(profile.train_points, n)
        spread = step_spread(e2e.gen_s, rel_g, e2e.train_s, rel_t, other_s)
        conc = int(min(n, c_max))
        per[c.label] = Throughput(e2e.responses_per_s, e2e.gen_s, e2e.train_s, other_s, conc, spread)
    if max(c.batch_responses for c in cands) > c_max:
        notes.append(
            f"batches above {int(c_max)} responses are generated in waves of {int(c_max)} "
            "(the largest measured concurrency)"
        )
    contended = profile.contention_note
    caveats = () if contended is None else (contended,)
    return ThroughputModel("profile", True, per, m.knee, mode, tuple(notes), caveats)


def contention_note(parallel_runs: Mapping[str, int], *, profile: bool = True) -> str:
    """Say which candidates were timed sharing the machine with other runs, or "" when none was.

    ``parallel_runs``: label -> the most runs that executed at once while that candidate's runs ran
    (1 = alone, 0 = unknown, e.g. imported without timing provenance); ``profile``: whether
    `batchtune profile-gen` can time this kind of run alone (not a pre-training run's step)."""
    shared = sorted((k for k, v in parallel_runs.items() if v > 1), key=lambda k: -parallel_runs[k])
    if not shared:
        return ""
    alone = sorted(k for k, v in parallel_runs.items() if v == 1)
    most = max(parallel_runs[k] for k in shared)
    text = f"{', '.join(shared)} were timed sharing the machine ({most} runs at a time)"
    if alone:
        text += f", {', '.join(alone)} alone"
    remedy = "run `batchtune profile-gen` (timed alone) or probe" if profile else "probe"
    return (
        text + ": contended step times make some batches look slower than they are, so this ranking "
        f"is biased; {remedy} with run.workers = 1"
    )


def throughput_from_probe(
    cands: Sequence[CandidateEfficiency],
    other_s: float,
    parallel_runs: Mapping[str, int] | None = None,
    *,
    profile: bool = True,
    logged_other: Collection[str] = (),
) -> ThroughputModel:
    """Θ(N) = N / (median gen_s + median train_s + other_s) per step, as the probe measured them.

    Evaluation time on the held-out set is not part of training, so the probe's own other_s is left
    out; ``other_s`` (reward, reference log-probs, weight sync) comes from the recipe. Runs that
    shared cores (``parallel_runs``, see ``contention_note``; ``profile`` as there) are flagged in
    the source and a note. ``logged_other``: candidates whose runs were imported from a trainer's
    logs, whose own time per step beyond generation and update (verl's timing_s/step less both, a
    wall clock) is what the run paid, and replaces ``other_s``.
    """
    per: dict[str, Throughput] = {}
    for c in cands:
        other = c.other_s_per_step if c.label in logged_other else other_s
        if c.gen_s_per_step + c.train_s_per_step + other <= 0:
            continue
        e2e = end_to_end_throughput(c.batch_responses, c.gen_s_per_step, c.train_s_per_step, other)
        per[c.label] = Throughput(e2e.responses_per_s, c.gen_s_per_step, c.train_s_per_step, other)
    if not per:
        raise AnalysisError("no timings to predict throughput from: run `batchtune profile-gen` first")
    note = contention_note(parallel_runs or {}, profile=profile)
    if note:
        return ThroughputModel("probe timings, contended", True, per, notes=(note,))
    if set(per) <= set(logged_other):
        return ThroughputModel("timings from the imported logs", True, per)
    alone = parallel_runs and all(v == 1 for v in parallel_runs.values())
    return ThroughputModel("probe timings, each run alone" if alone else "probe timings", True, per)


# candidates whose expected time-to-target is within this fraction of the fastest rank by batch, the
# smallest first: two profiles of one machine differ by a few % with its load (the default tune picked
# P4xG8 on a loaded box and P8xG8 on a quiet one, 0.68 vs 0.67 of the reference's time)
TIE_MARGIN = 0.03


def recommend(
    efficiency: SampleEfficiency,
    throughput: ThroughputModel,
    *,
    unmeasured: Sequence[tuple[str, float]] = (),
    caveats: Sequence[str] = (),
) -> Recommendation:
    """Rank every candidate with an estimate and a throughput by predicted time-to-target.

    ``unmeasured``: (label, batch) of planned candidates the probe did not measure (a branched
    search that bracketed the critical batch without them); ``caveats``: the probe's own reasons its
    evidence is thin (a checkpoint it could not read). Both feed ``Recommendation.evidence``."""
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
            f"({'pretrain.max_tokens' if efficiency.unit == 'tokens' else 'budget.max_samples'}), or check "
            "that target.metric names the right metric"
        )
    if len(ranked) < 2:
        raise AnalysisError("fewer than two candidates have both samples-to-target and throughput")
    ests = [_estimate(c) for c in ranked]
    failed = [  # measured, every run failed: the reason names them, the ranking cannot
        (c.label, c.batch_responses) for c in efficiency.candidates if c.estimate is None and c.failures
    ]
    ranking = rank_time_to_target(
        [c.label for c in ranked],
        [c.batch_responses for c in ranked],
        [e.samples_to_target for e in ests],
        [_lower_bound(e) for e in ests],
        [e.ci_high for e in ests],
        [throughput.per_candidate[c.label].responses_per_s for c in ranked],
        reference=efficiency.reference,
        confidence=ref_est.confidence,
        open_margin=efficiency.tolerance,
        noun=efficiency.batch_noun,
        tie_margin=TIE_MARGIN,
        failed=failed,
    )
    winner = efficiency.get(ranking.winner)
    wt = throughput.per_candidate[winner.label]
    notes = list(efficiency.notes) + list(throughput.notes)
    cs = efficiency.critic_grad_slope
    if cs is not None and not cs.noise_dominated:
        notes.append(
            "the PPO critic's gradient norm does not fall like B^-1/2 over this range: its critical batch "
            "is smaller than the actor's; give it smaller mini-batches (verl critic.ppo_mini_batch_size) "
            "and its own LR rule (docs/method.md §3.5)"
        )
    if winner.family == "fixed_lr":
        notes.append("the winner is a fixed-LR control: check the LR scaling rule")
    if not math.isfinite(_estimate(winner).samples_to_target):
        notes.append("no candidate reached the target: the ranking is by censoring bounds only")
    return Recommendation(
        efficiency=efficiency,
        throughput=throughput,
        ranking=ranking,
        winner=winner,
        winner_throughput=wt,
        confirm=_confirm_text(efficiency, winner, wt, throughput.absolute),
        notes=tuple(notes),
        evidence=(*weak_evidence(winner, ranked, unmeasured), *caveats, *throughput.caveats),
        throughput_noise=pick_under_noise(
            ranking, {k: t.spread for k, t in throughput.per_candidate.items()}, TIE_MARGIN
        ),
    )


def weak_evidence(
    winner: CandidateEfficiency,
    ranked: Sequence[CandidateEfficiency],
    unmeasured: Sequence[tuple[str, float]],
) -> tuple[str, ...]:
    """Why the pick rests on thin evidence, each reason one sentence (empty: none found).

    - The pick is the largest batch measured while larger ones were planned but not measured: no
      measurement shows a larger batch is slower. On the NQM's one-checkpoint branched sweep this
      held for all 16 picks at regret > 1.05 and for none of the 80 others, where the search had
      measured (and rejected) the batch above the pick (benchmarks/out/regret_bound.txt).
    - The pick's R rests on one seed: there is no interval to read.
    - The pick's interval is open above: a seed never reached the target, so its time is a bound.
    """
    out: list[str] = []
    est = _estimate(winner)
    b = winner.batch_responses
    above = [lab for nb, lab in sorted((nb, lab) for lab, nb in unmeasured) if nb > b]
    if above and not any(c.batch_responses > b for c in ranked):
        why = ""
        if winner.verdict is not None and winner.verdict.status not in (INVARIANT, REFERENCE):
            why = f"; its own verdict: {winner.verdict.status}, on {_seeds(est.n_seeds)}"
        out.append(
            f"{winner.label} is the largest batch the probe measured: {', '.join(above)} "
            f"{'was' if len(above) == 1 else 'were'} not measured, so nothing shows a larger batch is "
            f"slower{why}"
        )
    if est.no_interval:
        out.append(f"{winner.label}'s R rests on one seed, so it has no interval")
    if math.isinf(est.ci_high) and math.isfinite(est.samples_to_target):
        out.append(
            f"{winner.label}'s interval is open above: a seed never reached the target, so its time is "
            "a bound"
        )
    return tuple(out)


def _seeds(n: int) -> str:
    return f"{n} seed{'' if n == 1 else 's'}"


def weak_advice(unit: str, imported: bool = False, from_measurements: bool = False) -> str:
    """What to do about thin evidence (``unit``: the efficiency's; a pre-training recipe's grid
    gives no time ranking, so it is not offered there). The branched remedies are said to be for a
    branched probe: a grid probe (the async default) already measures every batch. ``imported``:
    the runs came from logs (SampleEfficiency.imported), so more of them is the remedy; likewise
    ``from_measurements`` (no recipe, no probe): more seeds in the file, or a probe of its own."""
    if from_measurements:
        return (
            "Before a long run: give the candidates more seeds in the measurements file (a "
            "[[candidate.curve]] per seed, or samples_ci), or measure them with batchtune probe"
        )
    if imported:
        return "Before a long run: import more seeds (runs of the same configuration, each with its --seed)"
    if unit == "tokens":
        return (
            "Before a long run: add seeds (budget.seeds); a branched probe: measure every batch "
            "(branch.search = 'all')"
        )
    return (
        "Before a long run: add seeds (budget.seeds); a branched probe: measure every batch "
        "(branch.search = 'all') or run the grid (probe.mode = 'grid')"
    )


def how_sure(rec: Recommendation) -> str | None:
    """One line from ranking.regret_bound: how much faster than the pick another batch could be;
    None when the pick's R has no interval (one seed: weak_evidence says so)."""
    r = rec.ranking
    est = rec.winner.estimate
    if est is None or est.no_interval:
        return None
    conf = f"{est.confidence:.0%}"
    if r.regret_against is None:
        return f"How sure: no other measured batch is faster at the far end of its {conf} interval."
    if not math.isfinite(r.regret_high):
        return (
            f"How sure: the pick's interval is open above, so {r.regret_against} (or another) could be "
            "faster by any amount."
        )
    return (
        f"How sure: {r.regret_against} could be up to {r.regret_high:.2f}x faster than the pick (the far "
        f"end of its {conf} interval against it)."
    )


def _estimate(c: CandidateEfficiency) -> TargetEstimate:
    """The estimate of a ranked candidate (ranking keeps only candidates that have one)."""
    if c.estimate is None:  # an internal invariant, not an input problem
        raise AssertionError(f"{c.label} was ranked without an estimate")
    return c.estimate


def _lower_bound(est: Any) -> float:
    """The CI's low end, or, when most seeds never reached the target, the samples they ran for:
    R is at least that much (censoring), which is what ranks such a candidate among the slow ones."""
    if math.isfinite(est.ci_low):
        return est.ci_low
    bounds = [b for b in est.censored_at if b is not None and math.isfinite(b)]
    return max(bounds) if bounds else math.inf


def _confirm_text(eff: SampleEfficiency, w: CandidateEfficiency, wt: Throughput, absolute: bool) -> str:
    est = _estimate(w)
    cmp = ">=" if eff.higher_is_better else "<="
    lr = f", lr {w.lr:.3g}" if math.isfinite(w.lr) else ""
    text = f"Confirm with one full run at {eff.shape_words(w.prompts, w.group_size)}{lr}: "
    text += "it should reach "
    goal = f"{eff.metric} {cmp} {eff.target:g}" if math.isfinite(eff.target) else "the target"
    text += f"{goal} after about {est.samples_to_target:,.0f} {eff.batch_noun}"
    steps = est.samples_to_target / w.batch_responses
    text += f" ({steps:,.0f} step{'' if round(steps) == 1 else 's'}"
    lo, hi = eff.absolute_ci(est)
    if hi > lo:
        text += f"; {interval_kind(est, eff.scale_ci)} {lo:,.0f}-{hi:,.0f}"
    text += ")"
    if absolute and math.isfinite(est.samples_to_target):
        seconds = est.samples_to_target / wt.responses_per_s
        n_evals = evals_to(est.samples_to_target, w.evals)
        eval_s = n_evals * w.evals.eval_s if n_evals and w.evals.eval_s > 0 else 0.0
        text += f", about {_duration(seconds + eval_s)}"
        if eval_s > 0:  # the run evaluates as the probe's runs of this batch did
            text += (
                f": {_duration(seconds)} at the predicted throughput and {_duration(eval_s)} for "
                f"{n_evals} held-out evaluations ({w.evals.eval_s:.2g} s each, as the probe's runs of "
                f"it took, one every {w.evals.samples_per_eval:,.0f} {eff.batch_noun})"
            )
        else:
            text += " at the predicted throughput"
    if eff.imported:  # no probe ran: the evidence is the logs' runs
        text += ". If it needs clearly more, the imported runs were too few or too noisy: import more seeds."
    elif eff.from_measurements:  # nor here: the evidence is a measurements file's numbers
        text += ". If it needs clearly more, the file's seeds were too few or too noisy: add seeds to it."
    else:
        text += ". If it needs clearly more, the probe was too short or too noisy: add seeds and probe again."
    return text


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"
