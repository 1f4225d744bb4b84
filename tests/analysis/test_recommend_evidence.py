"""The recommendation says when its pick rests on thin evidence (analysis/decide/recommend.weak_evidence)."""

from __future__ import annotations

import dataclasses
import math

from batchtune.analysis.decide.recommend import (
    Recommendation,
    Throughput,
    ThroughputModel,
    how_sure,
    recommend,
)
from batchtune.analysis.sample.curves import TargetCrossing
from batchtune.analysis.sample.efficiency import CandidateEfficiency, SampleEfficiency
from batchtune.analysis.sample.ratio import RatioEstimate, Verdict
from batchtune.analysis.sample.seeds import estimate_over_seeds


def _cand(prompts: int, per_seed: list[float], status: str = "invariant") -> CandidateEfficiency:
    crossings = [
        TargetCrossing(None, True, 1e5) if math.isinf(r) else TargetCrossing(r, False, r) for r in per_seed
    ]
    est = estimate_over_seeds(crossings, seed_ids=list(range(len(per_seed))))
    return CandidateEfficiency(
        label=f"P{prompts}xG8",
        prompts=prompts,
        group_size=8,
        lr=0.01,
        lr_rule="sqrt",
        family="main",
        estimate=est,
        verdict=Verdict(prompts * 8.0, status, None, status),
        n_runs=len(per_seed),
        failures=(),
        gen_s_per_step=1.0,
        train_s_per_step=0.1,
        other_s_per_step=0.0,
        samples_consumed=int(sum(r for r in per_seed if math.isfinite(r))),
        wall_s=1.0,
    )


def _recommend(cands: list[CandidateEfficiency], **kw) -> Recommendation:
    eff = SampleEfficiency(
        metric="loss",
        target=1.0,
        higher_is_better=False,
        tolerance=0.1,
        reference=cands[0].label,
        candidates=tuple(cands),
        critical=None,
        grad_slope=None,
        noise_scale=None,
        notes=(),
    )
    # throughput grows with the batch, so the largest batch that keeps up wins
    thr = {c.label: Throughput(c.batch_responses / (1.0 + 0.002 * c.batch_responses)) for c in cands}
    return recommend(eff, ThroughputModel("test", True, thr), **kw)


SEEDS = [1000.0, 1040.0, 980.0]


def test_a_pick_at_the_edge_of_what_was_measured_is_flagged():
    # the search measured 8, 16 and 32 prompts and never 64: 32 wins on throughput, and nothing
    # shows that 64 would not
    cands = [_cand(1, SEEDS, "reference"), _cand(2, SEEDS), _cand(4, [1120.0, 1180.0, 1150.0], "deviates")]
    rec = _recommend(cands, unmeasured=[("P8xG8", 64.0), ("P16xG8", 128.0)])
    assert rec.winner.label == "P4xG8"
    (why,) = rec.evidence
    assert why.startswith("P4xG8 is the largest batch the probe measured: P8xG8, P16xG8 were not measured")
    assert "its own verdict: deviates, on 3 seeds" in why
    # a measured batch above the pick (rejected or slower) closes the edge: no warning
    above = _cand(8, [2500.0, 2600.0, 2400.0], "deviates")
    rec = _recommend([*cands, above], unmeasured=[("P16xG8", 128.0)])
    assert rec.winner.label == "P4xG8" and rec.evidence == ()
    # the planned batches below the pick do not count
    assert _recommend(cands, unmeasured=[("P0xG8", 4.0)]).evidence == ()


def test_a_one_seed_pick_and_an_open_interval_are_flagged_and_the_probes_caveats_kept():
    one = _recommend([_cand(1, SEEDS, "reference"), _cand(4, [1010.0])])
    assert one.winner.label == "P4xG8"
    assert one.evidence == ("P4xG8's R rests on one seed, so it has no interval",)
    assert how_sure(one) is None  # no interval to say how sure from
    # a seed of the pick that never reached the target: its time is a lower bound
    cands = [_cand(1, SEEDS, "reference"), _cand(4, [1000.0, 1010.0, math.inf], "inconclusive")]
    opened = _recommend(cands, caveats=["the answer rests on 1 of 2 checkpoints"])
    assert opened.winner.label == "P4xG8"
    assert "interval is open above" in opened.evidence[0]
    assert opened.evidence[-1] == "the answer rests on 1 of 2 checkpoints"
    sure = how_sure(opened)
    assert sure is not None and "open above" in sure and math.isinf(opened.ranking.regret_high)


def test_a_well_measured_pick_says_how_sure_it_is():
    cands = [_cand(1, SEEDS, "reference"), _cand(2, SEEDS), _cand(4, [1300.0, 1500.0, 1400.0], "deviates")]
    rec = _recommend(cands)
    assert rec.evidence == ()
    sure = how_sure(rec)
    assert sure is not None and sure.startswith("How sure:")
    if rec.ranking.regret_against is None:
        assert "no other measured batch is faster" in sure
    else:
        assert f"{rec.ranking.regret_high:.2f}x faster" in sure


def test_the_json_gives_no_interval_where_there_is_none():
    from batchtune.report.json import recommendation_to_dict

    rec = _recommend([_cand(1, SEEDS, "reference"), _cand(2, [1010.0, 990.0, 1060.0]), _cand(4, [1010.0])])
    assert rec.winner.label == "P4xG8"
    d = recommendation_to_dict(rec)
    r = d["recommended"]
    assert r["regret_high"] is None  # the pick's own R has no interval to bound the regret with
    assert r["evidence"] == ["P4xG8's R rests on one seed, so it has no interval"]
    by_name = {c["name"]: c for c in d["candidates"]}
    assert by_name["P1xG8"]["time_ratio_ci"] is None  # the reference against itself
    lo, hi = by_name["P4xG8"]["time_ratio_ci"]
    assert lo < hi  # one seed against a reference of three: the reference's spread is real
    # one seed on both sides: no interval at all, not a pair of equal numbers
    one = _cand(4, [1010.0])
    one = dataclasses.replace(
        one, verdict=Verdict(32.0, "invariant", RatioEstimate(1.01, 1.01, 1.01), "point")
    )
    bare = recommendation_to_dict(_recommend([_cand(1, [1000.0], "reference"), one]))
    assert bare["recommended"]["time_ratio_ci"] is None
    assert {c["name"]: c["sample_ratio_ci"] for c in bare["candidates"]} == {"P1xG8": None, "P4xG8": None}
    spread = dataclasses.replace(
        one, verdict=Verdict(32.0, "invariant", RatioEstimate(1.01, 0.95, 1.07), "t")
    )
    assert recommendation_to_dict(_recommend([_cand(1, [1000.0], "reference"), spread]))["candidates"][1][
        "sample_ratio_ci"
    ] == [0.95, 1.07]


def test_the_branched_remedies_are_said_to_be_for_a_branched_probe():
    """A grid probe (the async default) already measures every batch: the advice told it to set
    branch.search = 'all' or probe.mode = 'grid' (the shipped async tune's contended profile)."""
    from batchtune.analysis.decide.recommend import weak_advice

    for unit in ("samples", "tokens"):
        advice = weak_advice(unit)
        assert advice.startswith("Before a long run: add seeds (budget.seeds); a branched probe: ")
        assert "branch.search = 'all'" in advice and ("probe.mode = 'grid'" in advice) == (unit == "samples")
