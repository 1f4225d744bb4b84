"""Regenerate the sample logs under examples/logs/ that the docs' import-logs and pretrain examples read.

    python examples/logs/make_logs.py

Nothing here is a real trainer's run: every curve comes from the project's own synthetic models.
- RL logs: real SGD on the noisy quadratic model (recipes/nqm.toml, backends/nqm.py; the LR scaled
  linearly from 0.03 at 8 samples per step), logged in each trainer's format. The "score" is
  1 - L / L0 (L the simulated NQM loss, L0 its start, 3.74): 0 at the start, rising to ~0.98.
  Step times are the NQM's *simulated* seconds (its time model; nothing was timed).
  - sweep.csv: generic per-step table, 3 batches (16, 64, 256 samples per step) x 3 seeds, plus
    one run at 1024 whose SGD diverges (lr 3.84 > 2/h_max): its score turns nan, and import-logs
    stores it as diverged;
  - verl.jsonl: verl's file logger, one run of 8 prompts x 8 (seed 0), validation at step 0;
  - trl/checkpoint-500/trainer_state.json: transformers' trainer state of a TRL GRPO run, 64
    completions per optimiser step, logged every 10 steps, evaluated every 50;
  - wandb-history.csv: a W&B run-history export (``_step``, ``_runtime``) of one run of 2 x 8.
- pretrain-losses.csv: batchtune.analysis.pretrain.synth's law (defaults: L0 6, L_inf 2, B_noise
  8192 tokens) at 1024 ... 32768 tokens per step, 2 seeds, 1% multiplicative noise.
Deterministic: the same files on every run (tests/test_doc_examples.py checks it).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
EVERY_SAMPLES = 256  # a logged row every this many samples (the curves are smooth between)
# tokens per step: B_opt(3.0) = 5294 and B_min(3.2) = 711 lie inside
BATCHES = [1024, 2048, 4096, 8192, 16384, 32768]


def nqm_run(prompts: int, seed: int, max_samples: int) -> Iterator[tuple[int, int, float, dict[str, float]]]:
    """(step, samples, lr, values) of one NQM run of ``prompts`` x 8 samples per step; values hold
    score, loss, grad_norm, gen_s, train_s (simulated). Ends with a nan score where SGD diverges."""
    from batchtune.backends.nqm import NQMBackend
    from batchtune.backends.spec import RunFailed, RunSpec
    from batchtune.measure.plan import plan_candidates
    from batchtune.recipe.load import load_recipe, shipped_recipes

    sets = [f"candidates.prompts=[{prompts}]", f"budget.max_samples={max_samples}"]
    sets.append("lr_scaling.reference_batch=8")  # the recipe's LR at 8 samples, scaled linearly
    recipe = load_recipe(str(shipped_recipes()["nqm"]), sets)
    cand = plan_candidates(recipe).candidates[0]
    spec = RunSpec(f"P{prompts}s{seed}", cand, seed, recipe, HERE / ".scratch", recipe.optimizer.lr, 8)
    loss0 = _initial_loss(recipe)
    step = samples = 0
    try:
        for rec in NQMBackend().train(spec):
            step, samples = rec.step, rec.samples
            loss = rec.metrics["loss"]
            values = {
                "score": 1 - loss / loss0,
                "loss": loss,
                "grad_norm": rec.grad_norm or 0.0,
                "gen_s": rec.gen_s,
                "train_s": rec.train_s,
            }
            yield rec.step, rec.samples, rec.lr, values
    except RunFailed:
        n = cand.batch_responses
        yield (
            step + 1,
            samples + n,
            cand.lr,
            {"score": math.nan, "loss": math.nan, "grad_norm": math.inf, "gen_s": 0.0, "train_s": 0.0},
        )


def _initial_loss(recipe: object) -> float:
    from batchtune.backends.nqm import initial_theta, nqm_loss

    cfg = recipe.nqm  # type: ignore[attr-defined]
    return nqm_loss(cfg, initial_theta(cfg))


def _logged(rows: Iterator[tuple[int, int, float, dict[str, float]]], every: int) -> list:
    """The rows at multiples of ``every`` samples, and the last (where the run ended or diverged)."""
    rows_l = list(rows)
    kept = [r for r in rows_l[:-1] if r[1] % every == 0]
    return kept + rows_l[-1:]


def _fmt(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.6g}")


def sweep_csv() -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["run", "step", "prompts", "group_size", "seed", "lr", "score", "loss", "grad_norm", "step_s"])
    runs = [(p, s) for p in (2, 8, 32) for s in (0, 1, 2)] + [(128, 0)]
    for p, seed in runs:
        for step, _samples, lr, v in _logged(nqm_run(p, seed, 16384), max(EVERY_SAMPLES, 8 * p)):
            w.writerow(
                [
                    f"P{p}xG8-s{seed}",
                    step,
                    p,
                    8,
                    seed,
                    _fmt(lr),
                    _fmt(v["score"]),
                    _fmt(v["loss"]),
                    _fmt(v["grad_norm"]),
                    _fmt(v["gen_s"] + v["train_s"]),
                ]
            )
    return out.getvalue()


def verl_jsonl() -> str:
    lines = [json.dumps({"step": 0, "data": {"val-core/nqm/reward/mean@1": 0.0}})]
    for step, _samples, lr, v in _logged(nqm_run(8, 0, 16384), EVERY_SAMPLES):
        data = {
            "critic/score/mean": round(v["score"], 6),
            "actor/lr": lr,
            "actor/grad_norm": round(v["grad_norm"], 6),
            "timing_s/gen": round(v["gen_s"], 6),
            "timing_s/update_actor": round(v["train_s"], 6),
            "timing_s/step": round(v["gen_s"] + v["train_s"], 6),
            "response_length/mean": 8.0,
        }
        lines.append(json.dumps({"step": step, "data": data}))
    return "\n".join(lines) + "\n"


def trl_state() -> str:
    history: list[dict[str, float]] = []
    for step, _samples, lr, v in nqm_run(8, 0, 500 * 64):
        if step % 10 == 0:
            history.append(
                {
                    "step": step,
                    "epoch": 0.0,
                    "learning_rate": lr,
                    "grad_norm": round(v["grad_norm"], 6),
                    "reward": round(v["score"], 6),
                    "loss": round(v["loss"], 6),
                    "step_time": round(v["gen_s"] + v["train_s"], 6),
                    "completions/mean_length": 8.0,
                }
            )
        if step % 50 == 0:
            history.append({"step": step, "epoch": 0.0, "eval_reward": round(v["score"], 6)})
    state = {
        "global_step": 500,
        "max_steps": 500,
        "logging_steps": 10,
        "eval_steps": 50,
        "train_batch_size": 8,
        "log_history": history,
    }
    return json.dumps(state, indent=2) + "\n"


def wandb_csv() -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["_step", "_runtime", "critic/score/mean", "actor/lr"])
    runtime = 0.0
    prev = 0
    for step, _samples, lr, v in _logged(nqm_run(2, 0, 8192), EVERY_SAMPLES):
        runtime += (step - prev) * (v["gen_s"] + v["train_s"])
        prev = step
        w.writerow([step, _fmt(runtime), _fmt(v["score"]), _fmt(lr)])
    return out.getvalue()


def pretrain_csv() -> str:
    from batchtune.analysis.pretrain.synth import SynthLaw, synth_curves

    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["run", "batch_tokens", "step", "loss", "seed"])
    curves = synth_curves(SynthLaw(), BATCHES, [0, 1], max_tokens=1e8, points=60, noise_rel=0.01)
    for b, seed, tokens, loss in curves:
        for t, x in zip(tokens, loss, strict=True):
            w.writerow([f"B{int(b)}-s{seed}", int(b), int(round(t / b)), f"{x:.5f}", seed])
    return out.getvalue()


FILES = {
    "sweep.csv": sweep_csv,
    "verl.jsonl": verl_jsonl,
    "trl/checkpoint-500/trainer_state.json": trl_state,
    "wandb-history.csv": wandb_csv,
    "pretrain-losses.csv": pretrain_csv,
}


def main(out: Path = HERE) -> None:
    for name, make in FILES.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(make())


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
