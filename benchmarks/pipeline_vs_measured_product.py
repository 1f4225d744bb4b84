"""The pipeline model as the product feeds it, against the same measured two-process async runs
(issue 30; benchmarks/pipeline_vs_measured.py, whose committed per-step data this reads: no new runs).

pipeline_vs_measured.py predicts with syncs that cost the trainer only (``sync_pauses_rollout=False``)
and the worker's own weight load counted in its generation time, once per sync. What `recommend`
ranks with does neither: its probe's gen_s leaves the worker's load out, and the pipeline model's
default, ``sync_pauses_rollout=True``, lets each sync pause the rollout as well as the trainer, a
stand-in for that load. This computes, per setting and for each committed invocation:

- ``T``: the benchmark's own prediction, as its table has it (pipeline_vs_measured.py);
- ``Tp``: T with only the convention swapped: the serial calibrations' worker time without its
  weight load (generation + serialising), each sync pausing the rollout, c refitted likewise. The
  stand-in alone, everything else T's;
- ``P``: the product's whole convention. The stage times are built as analysis/decide/async_joint.py
  ``_stage_times`` builds them from a probe (its ``_median`` and ``_ratio``): per batch, generation
  = the median gen_s of the on-policy k = 0 runs + the recipe's generation.other_s_per_step, one update
  = their median train_s / mini_batches, a sync = the median sync_s of their steps that synced (as
  measure/async_topup.py ``run_knobs``); the async rows take generation x fg and update x ft, fg and
  ft = the median over the k >= 1 runs over the median over the k = 0 runs (at least 1), and the
  k >= 1 runs' median sync_s. Here the k = 0 runs are the setting's serial calibrations (the base of
  the ratios: all serial calibrations) and the k >= 1 runs the overlapped calibrations at (1, 1, 1):
  like T, P never reads the runs it predicts. Those times go through the product's own ranking,
  analysis/decide/async_rank.py ``rank_async`` (k in trainer steps, the setting's sync_every, on one
  shared device) and ``binding_caps`` (a queue cap of k + 1 batches or more is the "k alone" row):
  k = 0 is its sync row (gen + update + sync), k >= 1 the async simulation at its defaults
  (``sync_pauses_rollout=True``, no message latency, no trace);
- ``Pa``: P with every setting's k = 0 times from all serial calibrations pooled, as a probe's one
  on-policy candidate at the batch would give them (P pairs each setting with its own calibrations,
  as T does, so that P and T differ by the convention alone).

Not mirrored (the JSON does not keep it, or the setting does not have it): other_s (tiny-grpo has
kl_coef 0 and the runs no evaluation, so the runs' other_s is 0, and the recipe sets no
other_s_per_step: 0 either way); the probe's medians take every timed step, the JSON keeps each
run's steps after the first 15; a profile-gen throughput model (``recommend --throughput auto`` with
a profile) would replace the medians of gen_s and train_s by its fits; the auto sweep's traces
(``step_times = "trace"``) are not played.

Ratios are predicted / measured wall time per 100 steps; intervals are 90%, from the same
delete-one-round jackknife as T's (pipeline_vs_measured.py ``jackknife``).

    python benchmarks/pipeline_vs_measured_product.py
        # writes benchmarks/out/pipeline_vs_measured_product.txt
    python benchmarks/pipeline_vs_measured_product.py --check
        # exits 1 if that file is stale
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pipeline_vs_measured as pvm  # noqa: E402

from batchtune.analysis.decide.async_joint import _median, _ratio  # noqa: E402
from batchtune.analysis.decide.async_rank import AsyncChoice, REstimate, StageTimes, rank_async  # noqa: E402
from batchtune.analysis.decide.async_split import binding_caps  # noqa: E402
from batchtune.analysis.system.pipeline import PipelineEstimate  # noqa: E402
from batchtune.analysis.system.shared_device import fit_contention, shared_device  # noqa: E402

OUT = pvm.ROOT / "benchmarks" / "out" / "pipeline_vs_measured_product.txt"
RAWS = [pvm.RAW, pvm.RAW.with_name("pipeline_vs_measured_run2.json")]
B = pvm.P * pvm.G  # responses per batch
OTHER_S = 0.0  # tiny-grpo's generation.other_s_per_step (the recipe sets none)
MINI_BATCHES = 1  # tiny-grpo's algorithm.mini_batches: u = 1
Rounds = list[dict[str, Any]]
Setting = pvm.Setting


def _steps(rounds: Rounds, part: str, setting: Setting | None = None) -> pvm.Steps:
    """The pooled steps of every ``part`` ("cal" or "run") at ``setting`` (None: every setting)."""
    return [
        x
        for g in rounds
        for one in g["runs"]
        if setting is None or tuple(one["setting"]) == setting
        for x in one[part]
    ]


def _pair(rounds: Rounds) -> pvm.Steps:
    return [x for g in rounds for x in g["pair"]]


def fed(rounds: Rounds, setting: Setting, own: bool = True) -> tuple[StageTimes, StageTimes]:
    """(sync-row times, async-row times) at ``setting``, as async_joint ``_stage_times`` builds them
    (module docstring): the k = 0 runs are its serial calibrations (``own`` False: all of them, Pa),
    the k >= 1 runs the overlapped ones."""
    cal, fresh, stale = _steps(rounds, "cal", setting if own else None), _steps(rounds, "cal"), _pair(rounds)
    gen = _median([x["gen_s"] for x in cal]) + OTHER_S
    upd = _median([x["train_s"] for x in cal]) / MINI_BATCHES
    sync = _median([x["sync_s"] for x in cal])  # _median keeps the steps that synced (> 0)
    fg = _ratio([_median([x["gen_s"] for x in stale])], _median([x["gen_s"] for x in fresh]))
    ft = _ratio([_median([x["train_s"] for x in stale])], _median([x["train_s"] for x in fresh]))
    sync_a = _median([x["sync_s"] for x in stale]) or sync
    return StageTimes(gen, upd, sync), StageTimes(gen * fg, upd * ft, sync_a)


def product(rounds: Rounds, setting: Setting, own: bool = True) -> AsyncChoice:
    """P (``own`` False: Pa) at ``setting``: the product's ranking row for it (module docstring)."""
    k, cap, se = setting
    sync_t, async_t = fed(rounds, setting, own)
    est = REstimate(B, k, MINI_BATCHES, 1.0, 1.0, 1.0)
    rows = binding_caps(rank_async(
        [est], {B: sync_t}, in_flight_caps=(cap + 1, None), staleness_unit="steps", sync_every=se,
        async_times={B: async_t},
    ))  # fmt: skip
    want = cap + 1 if any(r.in_flight_cap == cap + 1 for r in rows) else None
    return next(r for r in rows if r.in_flight_cap == want)


def stand_in(k: int, cap: int, se: int, hand: float) -> dict[str, Any]:
    return {**pvm.bounds(k, cap, se, hand), "sync_pauses_rollout": True}


def stand_in_t(rounds: Rounds) -> dict[Setting, PipelineEstimate]:
    """Tp per setting: T with the worker's load left out and each sync pausing the rollout."""
    pair, all_cal = pvm.stages(_pair(rounds)), pvm.stages(_steps(rounds, "cal"))
    c = fit_contention(
        alone=(all_cal.worker - all_cal.load, all_cal.trainer),
        overlapped=(pair.worker - pair.load, pair.trainer),
        batch_responses=B, sync_time_s=pair.sync, **stand_in(*pvm.PAIR, all_cal.hand),
    )  # fmt: skip
    out = {}
    for s in pvm.SETTINGS:
        cal = pvm.stages(_steps(rounds, "cal", s))
        out[s] = shared_device(
            contention=c if s[0] >= 1 else (1.0, 1.0), batch_responses=B, gen_time_s=cal.worker - cal.load,
            train_time_s=cal.trainer, sync_time_s=cal.sync, **stand_in(*s, cal.hand),
        )  # fmt: skip
    return out


def _wall(rounds: Rounds, s: Setting) -> float:
    return pvm.wall100(_steps(rounds, "run", s)) / 100


def log_tp(rounds: Rounds) -> dict[Setting, float]:
    return {s: math.log(e.step_time_s / _wall(rounds, s)) for s, e in stand_in_t(rounds).items()}


def log_p(rounds: Rounds, own: bool = True) -> dict[Setting, float]:
    return {s: math.log(B / product(rounds, s, own).responses_per_s / _wall(rounds, s)) for s in pvm.SETTINGS}


def log_pa(rounds: Rounds) -> dict[Setting, float]:
    return log_p(rounds, own=False)


def invocation(name: str, raw: dict[str, Any]) -> list[str]:
    rounds = raw["rounds"]
    named = {"T": pvm.log_t_ratios, "Tp": log_tp, "P": log_p, "Pa": log_pa}
    full = {n: f(rounds) for n, f in named.items()}
    ci = {n: pvm.jackknife(rounds, f) for n, f in named.items()}
    sync_t, async_t = fed(rounds, pvm.SETTINGS[0])
    lines = [
        f"{name}: {len(rounds)} rounds; P's async rows: gen x{async_t.gen_time_s / sync_t.gen_time_s:.3f}, "
        f"update x{async_t.train_update_s / sync_t.train_update_s:.3f} (overlapped over serial "
        f"calibrations' medians), sync {async_t.sync_time_s * 1e3:.2f} ms (the overlapped ones' median)",
    ]
    within = dict.fromkeys(named, 0)
    for s in pvm.SETTINGS:
        st, at = fed(rounds, s)
        row = at if s[0] >= 1 else st
        w = _wall(rounds, s)
        cells = []
        for n in named:
            r = math.exp(full[n][s])
            within[n] += abs(r - 1) <= 0.10
            cells.append(f"{n} {r:.3f} [{ci[n][s][0]:.3f}, {ci[n][s][1]:.3f}]")
        lines += [
            "  k={} cap={} sync_every={}: ".format(*s)
            + f"P fed gen {row.gen_time_s * 1e3:.2f} ms, update {row.train_update_s * 1e3:.2f} ms, sync "
            f"{row.sync_time_s * 1e3:.2f} ms ({'async' if s[0] >= 1 else 'sync'} row)",
            f"    s per 100 steps: measured {100 * w:5.2f} | " + "  ".join(cells),
        ]
    lines.append("  within 10%: " + ", ".join(f"{n} {v}/{len(pvm.SETTINGS)}" for n, v in within.items()))
    return lines


def tabulate(raws: list[tuple[str, dict[str, Any]]]) -> str:
    lines = [
        f"pipeline model, the product's convention against the benchmark's: tiny-grpo P{pvm.P}xG{pvm.G}, the "
        "committed two-process runs of benchmarks/pipeline_vs_measured.py (no new runs)",
        "T = the benchmark's prediction (syncs cost the trainer only, the worker's weight load in its "
        "generation once per sync); Tp = T with only that swapped for the product's stand-in (generation "
        "without the load, each sync pausing the rollout too, c refitted); P = the product's whole "
        "convention (probe medians of gen_s, train_s, sync_s, the k >= 1 runs' ratios, rank_async at its "
        "defaults); Pa = P fed one set of times for every setting, all serial calibrations pooled (as a "
        "probe's one on-policy candidate at the batch gives); ratio = predicted / measured, [90% interval, "
        "delete-one-round jackknife]",
        "",
    ]
    for name, raw in raws:
        lines += [*invocation(name, raw), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    if argv and argv != ["--check"]:
        print("usage: pipeline_vs_measured_product.py [--check]", file=sys.stderr)
        return 2
    text = tabulate([(p.name, json.loads(p.read_text())) for p in RAWS])
    if argv == ["--check"]:
        same = OUT.exists() and OUT.read_text() == text
        print("up to date" if same else f"{OUT} differs from what its data give", file=sys.stderr)
        return 0 if same else 1
    OUT.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
