"""Benchmark: training tokens/s of the built-in pre-training trainer against a plain HF Trainer loop,
same model, same batch, same data, side by side.

    python benchmarks/pretrain_throughput.py > benchmarks/out/pretrain_throughput.txt

Model: the tiny-pretrain Llama (recipes/tiny-pretrain.toml: xs, 2 x 64, vocab 64, 16-token
sequences), AdamW at a constant LR, grad clip 1.0, one torch thread. For each batch, trials
alternate between the two (so a change of the machine's load hits both): the built-in
``LMRun.step`` and ``transformers.Trainer.train`` (``optim="adamw_torch_fused"``, no logging,
saving or eval, ``dataloader_num_workers=0``) on the same pre-sampled sequences. Per trial, the
median time of an optimiser step after 5 warm-up steps (Trainer: between ``on_step_end``
callbacks); tokens/s = batch tokens / median step time, then the median over trials. Prints a
table and one JSON line.
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import time
from pathlib import Path

import torch

from batchtune.backends.pretrain_lm import LMRun
from batchtune.recipe.load import load_recipe

ROOT = Path(__file__).resolve().parents[1]
BATCH_SEQS = (2, 8, 32)  # 32, 128, 512 tokens: the probe's grid
STEPS, WARMUP, TRIALS = 80, 5, 5


def builtin_step_s(recipe, seqs: int) -> float:
    run = LMRun(recipe, 0)
    times = []
    for i in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        run.step(seqs, recipe.optimizer.lr)
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def hf_step_s(recipe, seqs: int, tmp: str) -> float:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    run = LMRun(recipe, 0)  # the same model (seed 0), data source and stream
    ids = torch.as_tensor(run.source.sample(run.rng, seqs * (WARMUP + STEPS), recipe.pretrain.seq_len))
    data = [{"input_ids": x, "labels": x} for x in ids]

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            if not self.marks:
                self.marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            self.marks.append(time.perf_counter())

    clock = Clock()
    args = TrainingArguments(
        output_dir=tmp,
        per_device_train_batch_size=seqs,
        max_steps=WARMUP + STEPS,
        learning_rate=recipe.optimizer.lr,
        lr_scheduler_type="constant",
        weight_decay=recipe.optimizer.weight_decay,
        max_grad_norm=recipe.optimizer.grad_clip,
        optim="adamw_torch_fused",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints its run summary
        Trainer(model=run.model, args=args, train_dataset=data, callbacks=[clock]).train()
    steps = [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]
    return statistics.median(steps[WARMUP:])


def main() -> None:
    import tempfile

    recipe = load_recipe(ROOT / "recipes" / "tiny-pretrain.toml")
    torch.set_num_threads(1)
    seq = recipe.pretrain.seq_len
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"tokens/s, median of {TRIALS} alternating trials x {STEPS} steps; load average before: {load}")
    print(f"{'batch_tokens':>12} {'builtin_tok_s':>14} {'hf_trainer_tok_s':>17} {'ratio':>6}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seqs in BATCH_SEQS:
            ours, hf = [], []
            for _ in range(TRIALS):
                ours.append(seqs * seq / builtin_step_s(recipe, seqs))
                hf.append(seqs * seq / hf_step_s(recipe, seqs, tmp))
            a, b = statistics.median(ours), statistics.median(hf)
            rows.append({"batch_tokens": seqs * seq, "builtin_tok_s": round(a), "hf_trainer_tok_s": round(b)})
            print(f"{seqs * seq:>12} {a:>14.0f} {b:>17.0f} {a / b:>6.2f}")
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print(json.dumps({"rows": rows, "threads": 1, "steps_per_trial": STEPS, "trials": TRIALS}))


if __name__ == "__main__":
    main()
