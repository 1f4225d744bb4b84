"""The confirming run's predicted time includes its held-out evaluations (issue 33, item 11), from
the eval times the probe's own runs recorded. Before, "about 1.7 s" was training alone while the
probe's runs of that batch took 2-19 s, most of it evaluating."""

from __future__ import annotations

import math
import re

import pytest

from batchtune.analysis.decide.recommend import recommend, throughput_from_probe
from batchtune.analysis.sample.assess import analyse_runs
from batchtune.analysis.sample.efficiency import RunData
from batchtune.analysis.sample.evals import EvalCost, eval_cost, evals_to
from batchtune.records.types import RunRecord, StepRecord

EVAL_S, EVERY = 2.0, 64  # one evaluation: 2 s of held-out generation, every 64 responses


def _run(prompts: int, seed: int, rate: float, steps: int) -> RunData:
    """A GRPO-like run as the torch trainer records it: a step-0 evaluation alone, then steps whose
    other_s is reward time (0.1 s) plus, every EVERY responses, an evaluation's EVAL_S."""
    n, rid = prompts * 8, f"P{prompts}xG8-s{seed}"
    out = [StepRecord(rid, 0, 0, 0, 0.0, prompts, 8, seed, {"eval_reward": 0.0}, other_s=EVAL_S)]
    for step in range(1, steps + 1):
        samples = step * n
        metrics = {"reward": 0.5}
        other = 0.1
        if samples % EVERY == 0:
            metrics["eval_reward"] = 1 - math.exp(-samples / (rate * (1 + 0.01 * seed)))
            other += EVAL_S
        out.append(
            StepRecord(
                rid, step, samples, 0, 1e-4, prompts, 8, seed, metrics, 1.0, None, 0.2, 0.05 * prompts, other
            )
        )
    rec = RunRecord(rid, f"P{prompts}xG8", prompts, 8, seed, 1e-4, "sqrt", 1e-4, 16, "completed", steps=steps,
                    samples=steps * n)  # fmt: skip
    return RunData(rec, tuple(out))


def test_eval_cost_reads_one_evaluation_and_its_cadence_from_the_steps():
    run = _run(2, 0, 300.0, 40)
    cost = eval_cost([run.steps], "eval_reward")
    assert cost.eval_s == pytest.approx(EVAL_S) and cost.samples_per_eval == EVERY
    assert evals_to(640, cost) == 11  # at 0, 64, ..., 640
    assert math.isnan(eval_cost([run.steps], "reward").eval_s)  # logged at every step: nothing to tell it by
    assert evals_to(640, EvalCost(math.nan, math.nan, 0)) == 0


def test_the_confirming_runs_time_counts_its_evaluations():
    runs = [_run(p, s, rate, 2048 // (p * 8)) for p, rate in ((2, 300.0), (8, 320.0)) for s in (0, 1, 2)]
    eff = analyse_runs(runs, metric="eval_reward", target=0.9, tolerance=0.1)
    thr = throughput_from_probe(eff.candidates, other_s=0.1)
    rec = recommend(eff, thr)
    w = rec.winner
    assert w.evals.eval_s == pytest.approx(EVAL_S) and w.evals.samples_per_eval == EVERY
    r = w.estimate.samples_to_target
    train_s = r / rec.winner_throughput.responses_per_s
    n_evals = 1 + math.floor(r / EVERY)
    text = " ".join(rec.confirm.split())
    assert f"for {n_evals} held-out evaluations (2 s each" in text
    about = re.search(r"about ([\d.]+) s: ", text)
    assert about is not None, text
    assert float(about.group(1)) == pytest.approx(train_s + n_evals * EVAL_S, abs=0.06)
    assert n_evals * EVAL_S > train_s  # here evaluation dominates: leaving it out was the bug


def test_imported_runs_add_no_evaluation_time_the_probe_never_measured():
    """Runs imported from logs: recommend said "... for 6 held-out evaluations (2 s each, as the
    probe's runs of it took ...)", though no probe ran them, and added that time on top of a step time
    that is the log's own, all of it (verl times its validation inside the step in some versions).
    The confirming run's time is now the predicted throughput's alone."""
    import dataclasses

    runs = [_run(p, s, rate, 2048 // (p * 8)) for p, rate in ((2, 300.0), (8, 320.0)) for s in (0, 1, 2)]
    runs = [
        dataclasses.replace(r, record=dataclasses.replace(r.record, source=f"{r.record.run_id}.jsonl"))
        for r in runs
    ]
    eff = analyse_runs(runs, metric="eval_reward", target=0.9, tolerance=0.1)
    labels = {c.label for c in eff.candidates}
    rec = recommend(eff, throughput_from_probe(eff.candidates, other_s=0.0, logged_other=labels))
    w = rec.winner
    assert math.isnan(w.evals.eval_s) and evals_to(w.estimate.samples_to_target, w.evals) == 0
    text = " ".join(rec.confirm.split())
    assert "held-out" not in text and "probe's runs" not in text
    about = re.search(r"about ([\d.]+) s at the predicted throughput", text)
    assert about is not None, text
    train_s = w.estimate.samples_to_target / rec.winner_throughput.responses_per_s
    assert float(about.group(1)) == pytest.approx(train_s, abs=0.06)


def test_a_target_met_before_training_is_one_clear_error_not_a_division_by_zero():
    """Found here: eval_reward 0.5 on tiny-grpo, whose warm start already scores 0.76."""
    from batchtune.errors import AnalysisError

    runs = [_run(p, s, 300.0, 8) for p in (2, 8) for s in (0, 1)]
    with pytest.raises(AnalysisError, match="before it trains .* set a target the untrained model"):
        analyse_runs(runs, metric="eval_reward", target=-0.5, tolerance=0.1)
