"""Exhaustive tiny-grpo truth over a small (B, k, u) grid against rank_async's pick from a 3-seed probe
(issue 30, item 7).

Grid: B in {16, 32} (P2/P4 x G8, LR sqrt-scaled from 2e-4 at 16), staleness k in {0, 2}, updates
per batch u in {1, 2}: 8 candidates. Every candidate runs off-policy in the built-in trainer
(backends/torch_rl/trainer.py: a batch trained at lag k, importance-corrected) to the target
(held-out eval_reward >= 0.9 on tiny-grpo's eval set, read every 256 samples; 8192 samples at most,
censored = inf) at the probe's seeds 0-2 and at disjoint truth seeds 3-5. R per candidate = the
median of its seeds' samples-to-target.

Time: the same pipeline model for the probe and the truth (analysis/decide/async_rank.rank_async on
one device: k = 0 sync colocated, k >= 1 the two-process async pipeline with the times as measured),
from the stage times the probe's runs measured (mean generation per batch at k = 2, with behaviour
log-probs as the async worker computes them; train per update) and one weight sync measured
in-process (serialise + load the state_dict; measured once and kept in the cache). So the regret measures
the error that comes from R alone, as benchmarks/regret_tiny.py does for the sync probe.
Truth: argmin over the grid of R_truth / Theta; the tool: rank_async's first row from the probe's R
(interval = the seeds' min..max). regret = T_truth(pick) / T_truth(best).
Note: the trainer trains every batch at lag k; an async pipeline may reach a smaller lag (the
pipeline model's lag reached is printed).

    python benchmarks/async_tiny_truth.py  (writes benchmarks/out/async_tiny_truth.txt; ~8 min CPU)
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchtune.analysis.decide.async_rank import REstimate, StageTimes, rank_async  # noqa: E402

OUT = ROOT / "benchmarks" / "out" / "async_tiny_truth.txt"
CACHE = Path(tempfile.gettempdir()) / "batchtune-async-tiny-truth.json"  # resumable across a crash
PROMPTS, KS, US = (2, 4), (0, 2), (1, 2)
PROBE, TRUTH = (0, 1, 2), (3, 4, 5)
TARGET, MAX_SAMPLES = 0.9, 8192


def one_run(p: int, k: int, u: int, seed: int) -> dict[str, float]:
    """One run to the target; samples at the first eval at or above it (inf if never)."""
    from batchtune.backends.spec import Candidate, RunSpec
    from batchtune.backends.torch_rl import TorchRLBackend
    from batchtune.recipe.load import load_recipe

    recipe = load_recipe(str(ROOT / "recipes" / "tiny-grpo.toml"), [f"budget.max_samples={MAX_SAMPLES}"])
    lr = recipe.optimizer.lr * (p * 8 / 16) ** 0.5
    cand = Candidate(f"P{p}xG8-k{k}u{u}", p, 8, lr, "sqrt", staleness=k, updates_per_batch=u)
    root = Path(tempfile.mkdtemp())
    spec = RunSpec("truth", cand, seed, recipe, root / "run", recipe.optimizer.lr, 16)
    hit, gen, train, n = math.inf, 0.0, 0.0, 0
    for rec in TorchRLBackend().train(spec):
        if rec.step > 0:  # gen_s: generation (+ behaviour log-probs at k > 0); other_s holds evals
            gen, train, n = gen + rec.gen_s, train + rec.train_s, n + 1
        if rec.metrics.get("eval_reward", -1.0) >= TARGET:
            hit = rec.samples
            break
    batches = n + (k if math.isinf(hit) else min(k, n))  # generated ahead: up to k more than trained
    return {
        "r": hit,
        "gen_batch_s": gen / max(batches, 1),
        "train_update_s": train / max(n, 1) / u,
        "steps": n,
    }


def sync_time() -> float:
    """One weight sync, measured in-process: serialise the state_dict, read it back, load it
    (the trainer's send and the worker's load of backends/torch_rl/async_run.py); median of 9."""
    import torch

    from batchtune.backends.models import load_model
    from batchtune.backends.torch_rl.async_run import from_bytes, to_bytes
    from batchtune.recipe.load import load_recipe

    recipe = load_recipe(str(ROOT / "recipes" / "tiny-grpo.toml"), [])
    torch.set_num_threads(1)
    lm = load_model(dataclasses.replace(recipe.model, dtype="float32"), "cpu", 0)
    times = []
    for _ in range(9):
        t0 = time.perf_counter()
        lm.model.load_state_dict(from_bytes(to_bytes(lm.model.state_dict())))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_r(rs: list[float]) -> float:
    return statistics.median(rs)


def main() -> int:
    t0 = time.perf_counter()
    cache: dict[str, dict[str, float]] = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    jobs = [
        (p, k, u, s)
        for p, k, u in itertools.product(PROMPTS, KS, US)
        for s in (*PROBE, *TRUTH)
        if f"{p}-{k}-{u}-{s}" not in cache
    ]
    with ProcessPoolExecutor(2) as pool:
        futs = {pool.submit(one_run, *j): j for j in jobs}
        for f, j in futs.items():
            cache["-".join(map(str, j))] = f.result()
            CACHE.write_text(json.dumps(cache))
            print(j, cache["-".join(map(str, j))], file=sys.stderr, flush=True)
    if "sync" not in cache:  # measured once and kept, so the output is a function of the cache
        cache["sync"] = {"s": sync_time()}
        CACHE.write_text(json.dumps(cache))
    times, sync = {}, cache["sync"]["s"]
    for p in PROMPTS:  # the probe's runs' own means: generation at k = 2 (with behaviour log-probs,
        # as the async worker does), train per update over every (k, u)
        gen = statistics.fmean(cache[f"{p}-{max(KS)}-{u}-{s}"]["gen_batch_s"] for u in US for s in PROBE)
        train = statistics.fmean(cache[f"{p}-{k}-{u}-{s}"]["train_update_s"]
                                 for k, u, s in itertools.product(KS, US, PROBE))  # fmt: skip
        times[8 * p] = StageTimes(gen, train, sync)
    est_probe, r_truth, lines = [], {}, []
    for p, k, u in itertools.product(PROMPTS, KS, US):
        probe = [cache[f"{p}-{k}-{u}-{s}"]["r"] for s in PROBE]
        truth = [cache[f"{p}-{k}-{u}-{s}"]["r"] for s in TRUTH]
        r = median_r(probe)
        est_probe.append(REstimate(8 * p, k, u, r, min(probe), max(probe)))
        r_truth[(8 * p, k, u)] = (median_r(truth), truth, probe)
    est_truth = [REstimate(b, k, u, v[0], v[0], v[0]) for (b, k, u), v in r_truth.items()]
    ranked_truth = rank_async(est_truth, times)
    t_true = {(c.batch, c.staleness, c.updates_per_batch): c.t for c in ranked_truth}
    theta = {(c.batch, c.staleness, c.updates_per_batch): (c.responses_per_s, c.lag_reached, c.mode)
             for c in ranked_truth}  # fmt: skip
    best = min(t_true, key=lambda c: t_true[c])
    ranked_probe = rank_async(est_probe, times)
    pick_row, runner_up = ranked_probe[0], ranked_probe[1]
    second = (runner_up.batch, runner_up.staleness, runner_up.updates_per_batch)
    pick = (pick_row.batch, pick_row.staleness, pick_row.updates_per_batch)
    regret = t_true[pick] / t_true[best]
    pooled = [REstimate(b, k, u, *([median_r(v[1] + v[2])] * 3)) for (b, k, u), v in r_truth.items()]
    t_pooled = {(c.batch, c.staleness, c.updates_per_batch): c.t for c in rank_async(pooled, times)}
    best6 = min(t_pooled, key=lambda c: t_pooled[c])
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    lines += [
        f"tiny-grpo exhaustive truth over B {{16, 32}} x k {{0, 2}} x u {{1, 2}}: target eval_reward >= "
        f"{TARGET}, at most {MAX_SAMPLES} samples; probe seeds {list(PROBE)}, truth seeds {list(TRUTH)}",
        f"machine: {os.cpu_count()} cores, shared; load at the end {load}; runs 2 at a time",
        "stage times (s): "
        + ", ".join(
            f"B={b}: gen {t.gen_time_s:.4f} train/update {t.train_update_s:.4f} sync {t.sync_time_s:.4f}"
            for b, t in times.items()
        ),
        "",
        f"{'(B, k, u)':>12} {'mode':>5} {'resp/s':>7} {'lag':>5}  {'R probe (3 seeds)':>20}  "
        f"{'R truth (3 seeds)':>20}  {'T truth':>8} {'T 6 seeds':>9}",
    ]

    def show(rs: list[float]) -> str:
        return " ".join(str(int(x)) if math.isfinite(x) else "inf" for x in rs)

    for c, (_, truth, probe) in r_truth.items():
        th, lag, mode = theta[c]
        lines.append(
            f"{str(c):>12} {mode:>5} {th:7.1f} {lag:5.2f}  {show(probe):>20}  {show(truth):>20}  "
            f"{t_true[c]:8.1f} {t_pooled[c]:9.1f}"
        )
    lines += [
        "",
        f"truth best {best} T {t_true[best]:.1f} s; rank_async's pick from the 3-seed probe {pick} "
        f"({pick_row.mode}) T_truth {t_true[pick]:.1f} s; regret {regret:.3f} (goal <= 1.05)",
        f"the probe's estimated T: pick {pick_row.t:.2f} s, next {second} {runner_up.t:.2f} s "
        f"(ratio {runner_up.t / pick_row.t:.3f})",
        f"with the truth pooled over all 6 seeds (not independent of the probe): best {best6}, "
        f"regret of the pick {t_pooled[pick] / t_pooled[best6]:.3f}",
        f"wall of this invocation {time.perf_counter() - t0:.0f} s ({len(jobs)} runs made now, the rest "
        f"read from {CACHE.name}, where a crashed or earlier invocation left them)",
    ]
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
