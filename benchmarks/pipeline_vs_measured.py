"""The pipeline model's predicted wall time against measured two-process async runs (issue 30, item 4).

tiny-grpo's P4xG8 candidate, STEPS trainer steps per run, the first SKIP left out (the worker's
start-up). For each setting (staleness bound k, in-flight cap, sync_every), in this order, under the
same machine conditions:

1. ``solo``: a sync run alone (trainer.py at the same k, so the rollouts carry behaviour log-probs
   as the worker's do): gen = generate + behaviour log-probs + reward per batch, train = the rest of
   the step's wall (update and bookkeeping), both means per step.
2. ``pair``: the same sync run with a second copy running beside it in another process: the
   contention factor of one device, c = a stage's time with a second process busy / alone, for gen
   and train separately. Measured, never fitted to the async run's wall time.
3. ``async``: the real two-process run (backends/torch_rl/async_run.py); measured wall time per 100
   steps = 100 x the mean of its steps' wall_s. Beside it the load (/proc/loadavg) and the contention
   meter (measure/contention.py: other processes' busy cores over the run).

Predictions (batchtune/analysis/system/pipeline.py, async, staleness bound k, model cap = the queue's
cap + 1 since the worker may finish one more batch before it blocks on the full queue, syncs that
cost the trainer only: the worker's weight load is part of its per-batch time):
- ``A``: solo timers, with the pair's contention factors applied by ``shared_device`` (a stage is
  slowed by c only for the share of its time the other side is busy). Sync cost (trainer's send,
  worker's load) from the async run's own timers: a sync run has none.
- ``A0``: the same without contention (c = 1): what the model says if two processes did not slow
  each other.
- every prediction adds what crossing between the processes costs, measured by a ping-pong just
  before the run (``handoffs``): the latency of a small message (``handoff_s``) and the time the
  serialised weights take to cross, which the rollout pays once per sync (added to its batch time).
- ``B``: the async run's own per-step timers (gen_s + load_s on the worker; wall_s - queue_wait_s -
  sync_s on the trainer; sync_s per sync): the model's structure alone, not a prediction in advance.
  ``Bt``: the same timers per batch, in order, as a trace (simulate_pipeline's gen_trace /
  train_trace): the mean-value model B cannot see that a slow batch against a binding bound makes
  the other side wait, the trace can.

    python benchmarks/pipeline_vs_measured.py  (writes benchmarks/out/pipeline_vs_measured.txt)
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
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

from batchtune.analysis.system.pipeline import shared_device, simulate_pipeline  # noqa: E402
from batchtune.backends.models import load_model  # noqa: E402
from batchtune.backends.spec import Candidate, RunSpec  # noqa: E402
from batchtune.backends.torch_rl import TorchRLBackend  # noqa: E402
from batchtune.backends.torch_rl.async_run import to_bytes  # noqa: E402
from batchtune.measure import contention  # noqa: E402
from batchtune.recipe.load import load_recipe  # noqa: E402
from batchtune.records import StepRecord  # noqa: E402

OUT = ROOT / "benchmarks" / "out" / "pipeline_vs_measured.txt"
STEPS, SKIP, P, G = 50, 5, 4, 8
SETTINGS = [(0, 1, 1), (1, 1, 1), (2, 2, 1), (2, 2, 3)]  # (k, queue cap, sync_every)
WEIGHTS_BYTES = [0]  # set in main


def spec_of(root: Path, mode: str, k: int, cap: int, sync_every: int, steps: int, tag: str) -> RunSpec:
    overrides = [
        f'algorithm.mode="{mode}"', f"algorithm.in_flight_cap={cap}", f"algorithm.sync_every={sync_every}",
        f"budget.max_samples={steps * P * G}", "task.eval_size=0", 'target.metric="reward"',
    ]  # fmt: skip
    recipe = load_recipe(str(ROOT / "recipes" / "tiny-grpo.toml"), overrides)
    cand = Candidate(f"P{P}xG{G}", P, G, recipe.optimizer.lr * 2**0.5, "sqrt", staleness=k)
    return RunSpec("bench", cand, 0, recipe, root / "runs" / tag, recipe.optimizer.lr, 16)


def timed(spec: RunSpec) -> list[tuple[StepRecord, float]]:
    """Each step's record with its wall time in this process (between the generator's yields)."""
    out, last = [], time.perf_counter()
    for rec in TorchRLBackend().train(spec):
        now = time.perf_counter()
        out.append((rec, now - last))
        last = now
    return out


def _echo(inbox, outbox) -> None:  # the ping-pong's second process: a small ack per message
    while inbox.get() is not None:
        outbox.put(b"k")


def handoffs(weights_bytes: int, rounds: int = 100) -> tuple[float, float]:
    """(latency of one small message, time for the weights to cross) between two processes through
    the spawn-context queues the async run uses, under the load now: half the median round trip
    of a small message, and the mean round trip of a ``weights_bytes`` message less that half.
    A message larger than the pipe's buffer moves only as the reader reads, so the rollout pays
    the crossing inside its wait for the weights (in worker_wait_s, not load_s)."""
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_echo, args=(inbox, outbox), daemon=True)
    proc.start()
    try:
        inbox.put(b"x")
        outbox.get(timeout=120)  # started

        def trips(n: int) -> list[float]:
            out, msg = [], b"x" * n
            for _ in range(rounds):
                t0 = time.perf_counter()
                inbox.put(msg)
                outbox.get(timeout=60)
                out.append(time.perf_counter() - t0)
            return out

        small = statistics.median(trips(64)) / 2
        big = statistics.fmean(trips(weights_bytes)) - small
        inbox.put(None)
        return small, max(0.0, big)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
            proc.join()


def weights_size(root: Path) -> int:
    """Bytes of the serialised state_dict the trainer sends (async_run.to_bytes)."""
    spec = spec_of(root, "sync", 1, 0, 1, 2, "size")
    lm = load_model(dataclasses.replace(spec.recipe.model, dtype="float32"), "cpu", 0)
    return len(to_bytes(lm.model.state_dict()))


def _companion(root: str, k: int, ready, go) -> None:  # the pair's second process
    spec = spec_of(Path(root), "sync", k, 0, 1, int(STEPS * 1.6), f"pair-companion-{time.time_ns()}")
    ready.set()
    go.wait()
    timed(spec)


@dataclass(frozen=True)
class Solo:
    gen: float
    train: float


def sync_times(steps: list[tuple[StepRecord, float]]) -> Solo:
    steady = steps[SKIP:]
    gen = statistics.fmean(r.gen_s + r.other_s for r, _ in steady)
    return Solo(gen, statistics.fmean(w - r.gen_s - r.other_s for r, w in steady))


def paired(root: Path, k: int) -> Solo:
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_companion, args=(str(root), k, ready, go), daemon=True)
    proc.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the pair's companion process did not start")
        spec = spec_of(root, "sync", k, 0, 1, STEPS, f"pair-{k}-{time.time_ns()}")
        go.set()
        return sync_times(timed(spec))
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.terminate()
            proc.join()


def mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def one(root: Path, k: int, cap: int, sync_every: int) -> tuple[list[str], list[float]]:
    ks = max(k, 1)  # the sync trainer records behaviour log-probs only at k >= 1; the worker always
    solo = sync_times(timed(spec_of(root, "sync", ks, 0, 1, STEPS, f"solo-{k}-{cap}-{sync_every}")))
    pair = paired(root, ks)
    c = (max(1.0, pair.gen / solo.gen), max(1.0, pair.train / solo.train))
    hand, cross = handoffs(WEIGHTS_BYTES[0])
    load0 = Path("/proc/loadavg").read_text().split()[0]
    meter = contention.read()
    steps = [r for r, _ in timed(spec_of(root, "async", k, cap, sync_every, STEPS, f"async-{k}-{cap}"))]
    others = contention.other_cores(meter)
    recs = steps[SKIP:]
    m = [r.metrics for r in recs]
    wall = 100 * mean([x["wall_s"] for x in m])
    syncs = [x["sync_s"] for x in m if x["sync_s"] > 0]
    sync_s = mean(syncs)  # per sync, trainer side
    load_s = mean([x["load_s"] for x in m])  # per batch, worker side
    per_batch = cross / sync_every  # the weights' crossing, paid by the rollout once per sync
    gen_trace = [r.gen_s + r.metrics["load_s"] + per_batch for r in recs]
    train_trace = [x["wall_s"] - x["queue_wait_s"] - x["sync_s"] for x in m]
    own_gen, own_train = mean(gen_trace), mean(train_trace)
    kw = dict(batch_responses=P * G, sync_time_s=sync_s, staleness_bound=k, in_flight_cap=cap + 1,
              sync_every=sync_every, sync_pauses_rollout=False, handoff_s=hand)  # fmt: skip
    solo_gen = solo.gen + load_s + per_batch
    pred_a = shared_device(contention=c, gen_time_s=solo_gen, train_time_s=solo.train, **kw)
    pred_a0 = shared_device(contention=1.0, gen_time_s=solo_gen, train_time_s=solo.train, **kw)
    pred_b = shared_device(contention=1.0, gen_time_s=own_gen, train_time_s=own_train, **kw)
    pred_bt = simulate_pipeline(
        gen_time_s=own_gen, train_time_s=own_train, gen_trace=gen_trace, train_trace=train_trace, **kw
    )  # type: ignore[arg-type]
    a, a0, b, bt = (100 * e.step_time_s for e in (pred_a, pred_a0, pred_b, pred_bt))
    lag = mean([x["staleness"] for x in m])
    lines = [
        f"k={k} cap={cap} sync_every={sync_every}   load {load0}, other processes' cores {others:.2f}",
        f"  solo sync: gen {solo.gen:.4f} s  train {solo.train:.4f} s   pair: gen {pair.gen:.4f}  "
        f"train {pair.train:.4f}  -> contention gen x{c[0]:.2f} train x{c[1]:.2f}",
        f"  async own timers: gen+load {own_gen:.4f}  trainer busy {own_train:.4f}  sync {sync_s:.4f} "
        f"per sync  load {load_s:.4f} per batch  handoff {hand:.5f}  weights crossing {cross:.4f}",
        f"  measured waits per step: trainer on the queue {mean([x['queue_wait_s'] for x in m]):.4f}  "
        f"worker on the bound or a full queue {mean([x['worker_wait_s'] for x in m]):.4f}",
        f"  s per 100 steps: measured {wall:6.2f} | A {a:6.2f} ({a / wall:.3f})  A0 {a0:6.2f} "
        f"({a0 / wall:.3f})  B {b:6.2f} ({b / wall:.3f})  Bt {bt:6.2f} ({bt / wall:.3f})",
        f"  mean lag: measured {lag:.2f}, model A {pred_a.mean_staleness:.2f}, "
        f"Bt {pred_bt.mean_staleness:.2f}",
    ]
    return lines, [a / wall, a0 / wall, b / wall, bt / wall]


def main() -> int:
    t0, c0 = time.perf_counter(), time.process_time()
    root = Path(tempfile.mkdtemp())
    timed(spec_of(root, "sync", 0, 0, 1, 2, "warm"))  # the warm start into the cache, off the clock
    WEIGHTS_BYTES[0] = weights_size(root)
    head = [
        f"pipeline model vs measured two-process async runs: tiny-grpo P{P}xG{G}, {STEPS} trainer "
        f"steps per run, first {SKIP} left out",
        f"machine: {platform.machine()} {os.cpu_count()} cores, shared with other jobs; load at start "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}",
        "A = solo sync-run stage times x the measured two-process contention (a prediction); "
        "A0 = the same with no contention; B = the async run's own mean timers, Bt = its per-batch "
        "timers as a trace (consistency checks, not predictions); (ratio = predicted / measured)",
        "",
    ]
    lines, ratios = [], []
    for k, cap, sync_every in SETTINGS:
        got, r = one(root, k, cap, sync_every)
        lines += got
        ratios.append(r)
        print("\n".join(got), file=sys.stderr, flush=True)
    n = len(ratios)
    within = [sum(abs(r[i] - 1) <= 0.10 for r in ratios) for i in range(4)]
    lines += [
        "",
        f"within 10% of measured: A {within[0]}/{n}, A0 {within[1]}/{n}, B {within[2]}/{n}, "
        f"Bt {within[3]}/{n} settings; load at end {Path('/proc/loadavg').read_text().split()[0]}; "
        f"wall {time.perf_counter() - t0:.0f} s",
    ]
    text = "\n".join(head + lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    print(f"cpu of this process {time.process_time() - c0:.0f} s (children not counted)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
