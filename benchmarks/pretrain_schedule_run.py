"""Benchmark: the probe's dynamic batch schedule against the best fixed batch, run to the final target.

    python benchmarks/pretrain_schedule_run.py > benchmarks/out/pretrain_schedule_run.txt

Both arms train the tiny-pretrain model (recipes/tiny-pretrain.toml: xs Llama, Markov data, WSD
stable phase with the recipe's warmup) from scratch with the same seed, so they read the same data
stream. The schedule is the one the probe printed before its refinement rounds (then 16
tokens at lr 1.41e-3, then 64 tokens at 2.83e-3 from 14.6k tokens); the fixed arm is B_opt of the
final target (64 tokens, lr 2.83e-3). A run stops once two evals in a row are at or below the
target (or at the budget); tokens to target are read off the eval curve exactly as the probe reads
them (isotonic crossing), and the steps and wall time at that many tokens from the step log.
One thread. Prints a table per seed, medians, and one JSON line.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from batchtune.analysis.sample.curves import samples_to_target
from batchtune.backends.pretrain_lm import LMRun, lr_factor
from batchtune.recipe.load import load_recipe

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.8
SCHEDULE = ((0, 16, 1.414e-3), (14_600, 64, 2.828e-3))  # (from tokens, batch tokens, lr)
FIXED = ((0, 64, 2.828e-3),)
SEEDS = (0, 1, 2)


def run(stages: tuple, seed: int) -> dict[str, float]:
    r = load_recipe(ROOT / "recipes" / "tiny-pretrain.toml")
    p = r.pretrain
    torch.set_num_threads(1)
    lm = LMRun(r, seed)
    tok, loss, log = [0.0], [lm.eval_loss()], []  # log: (tokens, steps, wall_s) after each step
    t0, below, next_eval = time.perf_counter(), 0, p.eval_every_tokens
    while lm.tokens < p.max_tokens and below < 2:
        start, batch, lr = [s for s in stages if s[0] <= lm.tokens][-1]
        f = lr_factor(lm.tokens, p.schedule, p.warmup_tokens, p.max_tokens, p.decay_fraction)
        lm.step(batch // p.seq_len, lr * f)
        if lm.tokens >= next_eval:
            next_eval += p.eval_every_tokens
            tok.append(float(lm.tokens))
            loss.append(lm.eval_loss())
            below = below + 1 if loss[-1] <= TARGET else 0
        log.append((lm.tokens, lm.steps, time.perf_counter() - t0))
    cross = samples_to_target(tok, loss, TARGET, higher_is_better=False)
    if cross.censored:
        return {"tokens": float("inf"), "steps": float("inf"), "wall_s": float("inf")}
    e = float(cross.samples_to_target)
    arr = np.array(log, dtype=float)
    i = min(int(np.searchsorted(arr[:, 0], e)), len(arr) - 1)  # the first step at or past e tokens
    return {"tokens": e, "steps": arr[i, 1], "wall_s": arr[i, 2]}


def main() -> None:
    arms = {"schedule 16->64": SCHEDULE, "fixed 64": FIXED}
    out: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"target eval loss {TARGET}; load average before: {load}")
    print(f"{'seed':>4} {'arm':>16} {'tokens':>8} {'steps':>6} {'wall_s':>7}")
    for seed in SEEDS:
        for name, stages in arms.items():
            res = run(stages, seed)
            out[name].append(res)
            print(f"{seed:>4} {name:>16} {res['tokens']:>8.0f} {res['steps']:>6.0f} {res['wall_s']:>7.1f}")
    med = {
        a: {k: statistics.median(r[k] for r in rs) for k in ("tokens", "steps", "wall_s")}
        for a, rs in out.items()
    }
    for a, m in med.items():
        print(f"{'med':>4} {a:>16} {m['tokens']:>8.0f} {m['steps']:>6.0f} {m['wall_s']:>7.1f}")
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print(json.dumps({"target_loss": TARGET, "median": med, "seeds": list(SEEDS)}))


if __name__ == "__main__":
    main() if len(sys.argv) == 1 else sys.exit("no arguments")
