"""The pipeline model's predicted wall time against measured two-process async runs (issue 30, item 4).

tiny-grpo's P4xG8 candidate. For each setting (staleness bound k, in-flight cap, sync_every) and
each of REPEATS repeats, two runs back to back, under the same machine conditions:

1. ``calibration``: a short serial two-process run (async_run.py at k = 0, cap 1, sync_every 1: the
   worker waits for each update's weights and the trainer for each batch, so the two processes
   never run at once), CAL steps, the first CAL_SKIP left out. It gives each stage's work: the
   worker's generation CPU time (gen_cpu_s) and the rest of its busy time (weight load, serialising
   the batch); the trainer's update CPU time (train_cpu_s) and the rest of its busy time
   (deserialising, bookkeeping, the consumer's time); the weight send (sync_s); and the latency of a
   message between the processes, from the serial run's waits: the trainer's wait on the queue
   less the worker's busy time, over the two messages (weights out, batch back) per step.
2. ``run``: the real two-process run at the setting, STEPS steps, the first SKIP left out. Measured
   wall time per 100 steps = 100 x the mean of its steps' wall_s. Beside it the load
   (/proc/loadavg) and the contention meter (measure/contention.py: other processes' busy cores).

Predictions (batchtune/analysis/system/pipeline.py, async, staleness bound k, model cap = the
queue's cap + 1 since the worker may finish one more batch before it blocks on the full queue,
syncs that cost the trainer only):
- ``T`` (the prediction): the calibration's stage work, each side slowed by the contention read
  during the run: the stage's wall time over its CPU time (generation on the worker, the update on
  the trainer, each process's own thread). It uses the run's contention reading and never the run's
  stage times: the work comes from the calibration.
- ``C``: the calibration's stage wall times as they are (no in-run reading): what a prediction made
  before the run would say, with the load and the two processes' overlap of the calibration.
- ``R`` (replay, not a prediction): the model fed the run's own mean stage times, and ``Rt`` its
  per-batch times in order as a trace (simulate_pipeline's gen_trace / train_trace): the model's
  structural error alone.

The measured waits (trainer on the queue; worker on the staleness bound and on a full queue) are set
beside the model's idle shares. Summary: the median ratio over the repeats per setting.

    python benchmarks/pipeline_vs_measured.py  (writes benchmarks/out/pipeline_vs_measured.txt)
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchtune.analysis.system.pipeline import PipelineEstimate, simulate_pipeline  # noqa: E402
from batchtune.backends.spec import Candidate, RunSpec  # noqa: E402
from batchtune.backends.torch_rl import TorchRLBackend  # noqa: E402
from batchtune.measure import contention  # noqa: E402
from batchtune.recipe.load import load_recipe  # noqa: E402

OUT = ROOT / "benchmarks" / "out" / "pipeline_vs_measured.txt"
STEPS, SKIP, CAL, CAL_SKIP, P, G, REPEATS = 40, 5, 30, 5, 4, 8, 2
SETTINGS = [(0, 1, 1), (1, 1, 1), (2, 2, 1), (2, 2, 3)]  # (k, queue cap, sync_every)
NAMES = ("T", "C", "R", "Rt")


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def async_run(root: Path, k: int, cap: int, sync_every: int, steps: int, tag: str) -> list[dict[str, float]]:
    overrides = [
        'algorithm.mode="async"', f"algorithm.in_flight_cap={cap}", f"algorithm.sync_every={sync_every}",
        f"budget.max_samples={steps * P * G}", "task.eval_size=0", 'target.metric="reward"',
    ]  # fmt: skip
    recipe = load_recipe(str(ROOT / "recipes" / "tiny-grpo.toml"), overrides)
    cand = Candidate(f"P{P}xG{G}", P, G, recipe.optimizer.lr * 2**0.5, "sqrt", staleness=k)
    spec = RunSpec("bench", cand, 0, recipe, root / "runs" / tag, recipe.optimizer.lr, 16)
    out = []
    for r in TorchRLBackend().train(spec):
        out.append({**r.metrics, "gen_s": r.gen_s, "train_s": r.train_s, "other_s": r.other_s})
    return out


def mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


@dataclass(frozen=True)
class Stages:
    """Per-batch stage times of one run (means over its steady steps), each side's busy time split
    into the part whose CPU time is read (gen on the worker, the update on the trainer) and the rest."""

    gen: float  # generation wall
    gen_cpu: float
    gen_rest: float  # weight load + serialising the batch
    train: float  # the update's wall
    train_cpu: float
    train_rest: float  # deserialising + bookkeeping + the consumer's time
    sync: float  # per sync
    hand: float  # latency of one message (calibration only)

    @property
    def c_gen(self) -> float:
        return self.gen / self.gen_cpu if self.gen_cpu > 0 else 1.0

    @property
    def c_train(self) -> float:
        return self.train / self.train_cpu if self.train_cpu > 0 else 1.0


def busy_train(x: dict[str, float]) -> float:
    """The trainer's busy time in a step: all of its wall but the waits on the queue and the sync."""
    return x["wall_s"] - x["queue_wait_s"] - x["sync_s"]


def stages(m: list[dict[str, float]]) -> Stages:
    gen, train = mean([x["gen_s"] for x in m]), mean([x["train_s"] for x in m])
    gen_rest = mean([x["load_s"] + x["pack_s"] for x in m])
    syncs = [x["sync_s"] for x in m if x["sync_s"] > 0]
    # serial run: the trainer waits for the weights to cross, the worker's busy time, the batch to cross
    crossing = mean([x["queue_wait_s"] - x["gen_s"] - x["load_s"] - x["pack_s"] for x in m])
    return Stages(
        gen, mean([x["gen_cpu_s"] for x in m]), gen_rest, train, mean([x["train_cpu_s"] for x in m]),
        mean([busy_train(x) for x in m]) - train, mean(syncs), max(0.0, crossing / 2),
    )  # fmt: skip


def model(
    gen: float, train: float, sync: float, hand: float, k: int, cap: int, se: int, **kw
) -> PipelineEstimate:
    return simulate_pipeline(
        batch_responses=P * G, gen_time_s=gen, train_time_s=train, sync_time_s=sync, staleness_bound=k,
        in_flight_cap=cap + 1, sync_every=se, sync_pauses_rollout=False, handoff_s=hand, **kw,
    )  # fmt: skip


def predictions(cal: Stages, run: Stages, m: list[dict[str, float]], k: int, cap: int, se: int):
    """T, C, R, Rt (module docstring), each a PipelineEstimate."""
    sg, st = run.c_gen / cal.c_gen, run.c_train / cal.c_train  # the run's slowdown over the calibration's
    t_gen = cal.gen_cpu * run.c_gen + cal.gen_rest * sg
    t_train = cal.train_cpu * run.c_train + cal.train_rest * st
    gen_trace = [x["gen_s"] + x["load_s"] + x["pack_s"] for x in m]
    train_trace = [busy_train(x) for x in m]
    kw = dict(k=k, cap=cap, se=se)
    return (
        model(t_gen, t_train, cal.sync * st, cal.hand, **kw),
        model(cal.gen + cal.gen_rest, cal.train + cal.train_rest, cal.sync, cal.hand, **kw),
        model(run.gen + run.gen_rest, run.train + run.train_rest, run.sync, cal.hand, **kw),
        model(
            mean(gen_trace),
            mean(train_trace),
            run.sync,
            cal.hand,
            gen_trace=gen_trace,
            train_trace=train_trace,
            **kw,
        ),  # fmt: skip
    )


def one(root: Path, k: int, cap: int, se: int, rep: int) -> tuple[list[str], list[float]]:
    tag = f"{k}-{cap}-{se}-{rep}"
    load_cal = loadavg()
    cal = stages(async_run(root, 0, 1, 1, CAL, f"cal-{tag}")[CAL_SKIP:])
    load0, meter = loadavg(), contention.read()
    m = async_run(root, k, cap, se, STEPS, f"run-{tag}")[SKIP:]
    others, load1 = contention.other_cores(meter), loadavg()
    run = stages(m)
    wall = 100 * mean([x["wall_s"] for x in m])
    preds = predictions(cal, run, m, k, cap, se)
    ratios = [100 * e.step_time_s / wall for e in preds]
    lag = mean([x["staleness"] for x in m])
    lines = [
        f"k={k} cap={cap} sync_every={se} repeat {rep}: load {load_cal} (calibration), {load0}-{load1} "
        f"(run); other processes' cores during the run {others:.2f}",
        f"  calibration: gen {cal.gen:.4f} s (cpu {cal.gen_cpu:.4f}, x{cal.c_gen:.2f}) + {cal.gen_rest:.4f}"
        f"  train {cal.train:.4f} (cpu {cal.train_cpu:.4f}, x{cal.c_train:.2f}) + {cal.train_rest:.4f}"
        f"  sync {cal.sync:.4f}  message {cal.hand:.5f}",
        f"  run:         gen {run.gen:.4f} s (cpu {run.gen_cpu:.4f}, x{run.c_gen:.2f}) + {run.gen_rest:.4f}"
        f"  train {run.train:.4f} (cpu {run.train_cpu:.4f}, x{run.c_train:.2f}) + {run.train_rest:.4f}"
        f"  sync {run.sync:.4f}",
        f"  waits per step: trainer on the queue {mean([x['queue_wait_s'] for x in m]):.4f}; worker on the "
        f"bound {mean([x['bound_wait_s'] for x in m]):.4f}, on a full queue "
        f"{mean([x['put_wait_s'] for x in m]):.4f} | model T idle: trainer "
        f"{preds[0].trainer_idle_frac * preds[0].batch_time_s:.4f}, rollout "
        f"{preds[0].rollout_idle_frac * preds[0].batch_time_s:.4f}",
        f"  s per 100 steps: measured {wall:6.2f} | "
        + "  ".join(f"{n} {r * wall:6.2f} ({r:.3f})" for n, r in zip(NAMES, ratios, strict=True)),
        f"  mean lag: measured {lag:.2f}, T {preds[0].mean_staleness:.2f}, Rt {preds[3].mean_staleness:.2f}",
    ]
    return lines, ratios


def summary(results: dict[tuple[int, int, int], list[list[float]]]) -> list[str]:
    lines = ["", "median over the repeats of predicted / measured wall time per 100 steps:"]
    within = dict.fromkeys(NAMES, 0)
    for (k, cap, se), reps in results.items():
        meds = [statistics.median(r[i] for r in reps) for i in range(len(NAMES))]
        for n, v in zip(NAMES, meds, strict=True):
            within[n] += abs(v - 1) <= 0.10
        lines.append(
            f"  k={k} cap={cap} sync_every={se}: "
            + "  ".join(f"{n} {v:.3f}" for n, v in zip(NAMES, meds, strict=True))
        )
    n = len(results)
    lines.append("within 10%: " + ", ".join(f"{k} {v}/{n}" for k, v in within.items()) + " settings")
    return lines


def main() -> int:
    t0, c0 = time.perf_counter(), time.process_time()
    root = Path(tempfile.mkdtemp())
    async_run(root, 0, 1, 1, 2, "warm")  # the warm start into the cache, off the clock
    head = [
        f"pipeline model vs measured two-process async runs: tiny-grpo P{P}xG{G}; per setting and repeat "
        f"a serial calibration ({CAL} steps, first {CAL_SKIP} left out) then the run ({STEPS} steps, "
        f"first {SKIP} left out)",
        f"machine: {platform.machine()} {os.cpu_count()} cores, shared with other jobs; load at start "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}",
        "T = the calibration's stage work x the contention read during the run (a prediction); C = the "
        "calibration's stage times as they are; R = the run's own mean stage times, Rt = its per-batch "
        "times as a trace (replays, not predictions); (ratio = predicted / measured)",
        "",
    ]
    lines: list[str] = []
    results: dict[tuple[int, int, int], list[list[float]]] = {s: [] for s in SETTINGS}
    for rep in range(REPEATS):
        for k, cap, se in SETTINGS:
            got, ratios = one(root, k, cap, se, rep)
            lines += got
            results[(k, cap, se)].append(ratios)
            print("\n".join(got), file=sys.stderr, flush=True)
    lines += summary(results)
    lines.append(f"load at end {loadavg()}; wall {time.perf_counter() - t0:.0f} s")
    text = "\n".join(head + lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    print(f"cpu of this process {time.process_time() - c0:.0f} s (children not counted)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
