"""Benchmark (P6): the built-in GRPO trainer against TRL's GRPOTrainer, same tiny model, same batch,
side by side in one run.

    python benchmarks/trl_vs_builtin.py > benchmarks/out/trl_vs_builtin.txt

Both are the real training backends a probe runs: ``torch`` (backends/torch_rl) and ``trl``
(backends/trl_backend.py, ``trl.GRPOTrainer`` in process). One recipe for both: the tiny Llama built
in code (hidden 64, 2 layers) from the shared cached warm start, the arithmetic task, P prompts x G
responses per optimiser step, ``max_new_tokens`` sampled tokens (real EOS stopping), GRPO without a
KL term (no reference model, TRL's default beta = 0), one optimiser step per generation, AdamW at a
constant LR, one torch thread, no held-out evaluation (``task.eval_size = 0``), CPU.

Runs alternate between the two (A B, then B A, ...: a change of the machine's load hits both).
Per run, the median wall time of an optimiser step after the first one (the first pays for
start-up): built-in, the time of one ``next()`` of its record generator (generate, score, update);
TRL, ``on_step_begin`` to ``on_step_end`` of a callback (TRL's generation, scoring, forward,
backward and optimiser step all happen in between). samples/s = P*G / that median; the table gives
the median over runs and the ratio built-in / TRL (> 1: the built-in one is faster). Responses stop
at EOS in both, so the mean response length is printed too, and tokens/s (response tokens per
second) corrects for any difference in it. Prints a table and one JSON line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchtune.backends.spec import Candidate, RunSpec  # noqa: E402
from batchtune.recipe.load import load_recipe  # noqa: E402

GROUP = 8
PROMPTS_GRID = (4, 16)  # 32 and 128 responses per optimiser step
STEPS, RUNS = 16, 6  # per run (the first step of each is dropped), runs per trainer and batch
LR = 3e-4
OVERRIDES = [
    "model.pretrain_steps=100",
    "task.difficulty=1",
    "task.train_size=80",
    "task.eval_size=0",
    "target.metric=reward",
    "algorithm.kl_coef=0.0",
    "algorithm.mini_batches=1",
    "generation.max_new_tokens=4",
    f"candidates.group_size={GROUP}",
    "hardware.device=cpu",
    "hardware.threads=1",
]


def spec_for(root: Path, name: str, backend: str, prompts: int, seed: int) -> RunSpec:
    budget = f"budget.max_samples={STEPS * prompts * GROUP}"
    recipe = load_recipe(None, [*OVERRIDES, budget, f"backend.training={backend}"])
    cand = Candidate(f"P{prompts}xG{GROUP}", prompts, GROUP, LR, "sqrt")
    return RunSpec(f"{name}-s{seed}", cand, seed, recipe, root / "runs" / name, LR, 4 * GROUP)


def builtin_run(root: Path, name: str, prompts: int, seed: int) -> dict[str, Any]:
    from batchtune.backends.torch_rl import TorchRLBackend

    times, lengths = [], []
    records = TorchRLBackend().train(spec_for(root, name, "torch", prompts, seed))
    while True:
        t0 = time.perf_counter()
        rec = next(records, None)
        if rec is None:
            break
        times.append(time.perf_counter() - t0)
        lengths.append(rec.metrics["response_len"])
    return {"step_s": times[1:], "response_len": lengths}


def trl_run(root: Path, name: str, prompts: int, seed: int) -> dict[str, Any]:
    from transformers import TrainerCallback

    from batchtune.backends.trl_backend import TRLBackend

    marks: list[float] = []
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            marks.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - marks[-1])

    backend = TRLBackend()
    hook = backend._hook

    def timed_hook(trainer: Any, *args: Any) -> None:
        hook(trainer, *args)
        trainer.add_callback(Clock())

    backend._hook = timed_hook  # type: ignore[method-assign]
    records = list(backend.train(spec_for(root, name, "trl", prompts, seed)))
    lengths = [
        r.metrics["completions/mean_length"] for r in records if "completions/mean_length" in r.metrics
    ]
    return {"step_s": times[1:], "response_len": lengths}


def summary(runs: list[dict[str, Any]], batch: int) -> dict[str, float]:
    per_run = [statistics.median(r["step_s"]) for r in runs]
    step = statistics.median(per_run)
    length = statistics.mean(x for r in runs for x in r["response_len"])
    return {
        "step_s": step,
        "step_s_min": min(per_run),
        "step_s_max": max(per_run),
        "samples_per_s": batch / step,
        "response_len": length,
        "tokens_per_s": batch * length / step,
    }


def measure(root: Path) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Alternating runs of the two trainers at each batch; stdout and stderr of the trainers muted."""
    results: dict[int, dict[str, list[dict[str, Any]]]] = {
        p: {"builtin": [], "trl": []} for p in PROMPTS_GRID
    }
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        builtin_run(root, "warmup", PROMPTS_GRID[0], 0)  # builds the cached warm start both share
        for i in range(RUNS):
            for prompts in PROMPTS_GRID:
                order = ["builtin", "trl"] if i % 2 == 0 else ["trl", "builtin"]
                for which in order:
                    fn = builtin_run if which == "builtin" else trl_run
                    results[prompts][which].append(fn(root, f"{which}-P{prompts}-{i}", prompts, i))
    return results


def main() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(Path(tmp))
    print(
        f"GRPO optimiser step on CPU, tiny Llama (hidden 64, 2 layers), G = {GROUP}, <= 4 new tokens, "
        f"1 thread;\nmedian over {RUNS} alternating runs x {STEPS - 1} timed steps; "
        f"load average before: {load_before}"
    )
    print("batch  trainer   step_s (run range)     samples_per_s  response_len  tokens_per_s")
    rows = []
    for prompts in PROMPTS_GRID:
        batch = prompts * GROUP
        b, t = (summary(results[prompts][k], batch) for k in ("builtin", "trl"))
        for name, s in (("built-in", b), ("TRL", t)):
            print(
                f"{batch:5d}  {name:<9} {s['step_s']:.3f} ({s['step_s_min']:.3f}-{s['step_s_max']:.3f})"
                f"  {s['samples_per_s']:13.1f}  {s['response_len']:12.2f}  {s['tokens_per_s']:12.1f}"
            )
        ratio, tok_ratio = t["step_s"] / b["step_s"], b["tokens_per_s"] / t["tokens_per_s"]
        pairs = sorted(  # run i of each trainer: same seed, back to back
            statistics.median(rt["step_s"]) / statistics.median(rb["step_s"])
            for rb, rt in zip(results[prompts]["builtin"], results[prompts]["trl"], strict=True)
        )
        print(
            f"{batch:5d}  ratio built-in / TRL: samples/s {ratio:.2f}"
            f" (paired runs {pairs[0]:.2f}-{pairs[-1]:.2f})"
            f", tokens/s {tok_ratio:.2f}"
        )
        ratios = {"ratio_samples_per_s": ratio, "ratio_tokens_per_s": tok_ratio, "paired_ratios": pairs}
        rows.append({"batch": batch, "prompts": prompts, "builtin": b, "trl": t, **ratios})
    print("ratio > 1: the built-in trainer is faster")
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    import torch
    import transformers
    import trl

    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    out = {"rows": rows, "group_size": GROUP, "steps_per_run": STEPS, "runs": RUNS, "versions": versions}
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
