"""A token-keyed pre-training batch schedule (analysis/pretrain/schedule.ScheduleStage) in the units of
the trainer that runs it: Megatron-LM flags, nanoGPT config files, HF ``TrainingArguments``.

Batches become whole sequences, rounded to a positive multiple of ``micro_batch_seqs x gpus``
(the data-parallel size), with a note when that changes a stage's batch. Every flag below was read
in the project's own source (cited where it is used):

- Megatron-LM (NVIDIA/Megatron-LM): from core_v0.18.0 (commit 532ad926b4, PR #4411)
  ``--step-batch-size-schedule "THRESHOLD:BS ..."`` (megatron/core/num_microbatches_calculator.py,
  ``StepBatchsizeNumMicroBatchesCalculator``): thresholds in tokens when ``--seq-length`` is set (the
  training passes it), batch sizes in samples (sequences), first threshold 0; it may not be given
  with ``--global-batch-size``, and ``--rampup-batch-size`` is deprecated and ignored. Up to
  core_v0.17.1 (266f1c97) only ``--rampup-batch-size <start> <increment> <ramp-samples>`` with
  ``--global-batch-size``: a linear staircase of equal-sample increments
  (``RampupBatchsizeNumMicroBatchesCalculator``), sample-based training only (``--train-samples``;
  megatron/training/arguments.py: "expected no batch-size rampup for iteration-based training").
  Neither rescales ``--lr`` when the batch steps (docs/method.md §6): a stage's own LR needs a
  relaunch from its checkpoint with ``--lr`` and ``--override-opt_param-scheduler``
  (megatron/training/config/training_config.py at d98e8a64).
- nanoGPT (karpathy/nanoGPT train.py at 3adf61e1): tokens per iteration =
  ``gradient_accumulation_steps * batch_size * block_size``, where ``gradient_accumulation_steps``
  is the total over GPUs (train.py divides it by the world size and asserts it divides);
  ``init_from = 'resume'`` restores ``iter_num``, so ``max_iters`` is cumulative; ``decay_lr = False``
  holds ``learning_rate`` (and skips warmup).
- HF transformers ``TrainingArguments`` (5.24): sequences per step =
  ``per_device_train_batch_size x gradient_accumulation_steps x world size``; resuming restores the
  LR scheduler from ``scheduler.pt`` (``Trainer._load_optimizer_and_scheduler``), which would keep
  the previous stage's LR, and skips ``global_step x batch`` of data (``ignore_data_skip=True``).
- torchtitan (pytorch/torchtitan): TOML job configs up to v0.2.2, keys from
  torchtitan/config/job_config.py at 238fa995 (the parent of 9810191b, "Config System Refactor: TOML
  to Python Dataclass Registry", which removed them): ``[training] local_batch_size`` (per
  data-parallel rank per micro-batch) / ``global_batch_size`` (sequences per step; train.py derives
  gradient accumulation from the two) / ``seq_len`` / ``steps``, ``[optimizer] lr``,
  ``[lr_scheduler] warmup_steps`` / ``decay_ratio`` (0.0: no decay steps, the LR stays at ``lr``),
  ``[checkpoint] enable`` / ``load_step`` / ``exclude_from_loading``. The checkpoint restores the
  step (so ``steps`` is cumulative) and the scheduler's state, its base LR included
  (components/lr_scheduler.py), so a later stage's LR needs ``exclude_from_loading =
  ["lr_scheduler"]``. Since 9810191b runs are Python configs; at b5bcd76c (torchtitan/config/
  configs.py ``TrainingConfig``) the batch is ``--training.num_tokens_per_train_step``,
  ``--training.num_tokens_per_microbatch_per_dp_rank`` and ``--training.max_context_length``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from batchtune.analysis.pretrain.schedule import ScheduleStage
from batchtune.errors import InputError

PRETRAIN_TRAINERS = ("megatron", "nanogpt", "hf", "torchtitan")


@dataclass(frozen=True)
class StageUnits:
    """One stage in sequences: ``batch_seqs`` per optimiser step from ``start_tokens`` to
    ``end_tokens``, ``steps`` optimiser steps (rounded up), ``lr``; ``batch_tokens_asked`` is the
    schedule's batch before rounding to whole micro-batches."""

    start_tokens: int
    end_tokens: int
    batch_seqs: int
    batch_tokens_asked: float
    steps: int
    lr: float
    weight_decay: float | None


def stage_units(
    stages: Sequence[ScheduleStage], seq_len: int, total_tokens: int, unit_seqs: int
) -> list[StageUnits]:
    """Stages in whole sequences, each a positive multiple of ``unit_seqs`` (micro batch x GPUs);
    a stage that rounds to the previous stage's batch is merged into it (it keeps its LR)."""
    if not stages:
        raise InputError("no schedule to emit: no target loss gave a batch")
    if total_tokens <= stages[-1].start_tokens:
        raise InputError(
            f"--total-tokens {total_tokens:,} must lie beyond the last stage's start "
            f"({stages[-1].start_tokens:,.0f} tokens): it is where the last stage ends"
        )
    rounded = [max(unit_seqs, round(st.batch_tokens / seq_len / unit_seqs) * unit_seqs) for st in stages]
    keep = [i for i in range(len(stages)) if i == 0 or rounded[i] != rounded[i - 1]]  # merge equal
    out = []
    for k, i in enumerate(keep):
        st, seqs = stages[i], rounded[i]
        end = stages[keep[k + 1]].start_tokens if k + 1 < len(keep) else total_tokens
        steps = max(1, math.ceil((end - st.start_tokens) / (seqs * seq_len)))
        out.append(
            StageUnits(
                round(st.start_tokens), round(end), seqs, st.batch_tokens, steps, st.lr, st.weight_decay
            )
        )
    return out


def _header(units: list[StageUnits], seq_len: int, unit_seqs: int) -> list[str]:
    lines = ["# stage | from tokens | to tokens | batch (sequences x seq_len) | lr | steps"]
    for i, u in enumerate(units, 1):
        lines.append(
            f"# {i} | {u.start_tokens:,} | {u.end_tokens:,} | {u.batch_seqs} x {seq_len} "
            f"| {u.lr:.3g} | {u.steps:,}"
        )
        if not math.isclose(u.batch_seqs * seq_len, u.batch_tokens_asked, rel_tol=1e-6):
            lines.append(
                f"#   stage {i}: batch {u.batch_tokens_asked:,.0f} tokens rounded to "
                f"{u.batch_seqs * seq_len:,} ({u.batch_seqs} sequences, a multiple of micro batch x GPUs"
                f" = {unit_seqs})"
            )
    return lines


def _megatron(units: list[StageUnits], seq_len: int, micro: int, gpus: int, total: int) -> list[str]:
    sched = " ".join(f"{u.start_tokens}:{u.batch_seqs}" for u in units)
    lines = [
        "# Megatron-LM >= core_v0.18.0 (NVIDIA/Megatron-LM 532ad926b4, num_microbatches_calculator.py):",
        "# thresholds in tokens (--seq-length given), batch sizes in sequences; no --global-batch-size",
        f"--seq-length {seq_len} --micro-batch-size {micro} --train-samples {math.ceil(total / seq_len)} \\",
        f'--step-batch-size-schedule "{sched}" \\',
        f"--lr {units[0].lr:.4g} --lr-decay-style constant",
    ]
    if units[0].weight_decay is not None:
        lines[-1] += f" --weight-decay {units[0].weight_decay:g}"
    if len(units) > 1:
        lines.append(
            "# Megatron keeps --lr when the batch steps. For each stage's own LR, stop at its threshold"
        )
        lines.append(
            "# (--train-samples = its end in sequences) and relaunch from the checkpoint (--load DIR):"
        )
        for i, u in enumerate(units[1:], 2):
            lines.append(
                f"#   stage {i} (from {u.start_tokens:,} tokens): --train-samples "
                f"{math.ceil(u.end_tokens / seq_len)} --lr {u.lr:.4g} --override-opt_param-scheduler"
            )
        first, last = units[0].batch_seqs, units[-1].batch_seqs
        step = micro * gpus
        if last > first:
            ramp = math.ceil(units[-1].start_tokens / seq_len)
            lines += [
                "# Megatron-LM <= core_v0.17.1 (no step schedule): a linear ramp from stage 1's batch to",
                "# the last stage's, reached at its threshold (sample-based training only):",
                f"#   --rampup-batch-size {first} {step} {ramp} --global-batch-size {last}",
            ]
    return lines


def _stage_ends(units: list[StageUnits]) -> Iterator[tuple[int, StageUnits, int]]:
    """Each stage, numbered from 1, with the optimiser steps at its end counted from the first
    stage's start (the trainers' step counters run on across a resume)."""
    total_steps = 0
    for i, u in enumerate(units, 1):
        total_steps += u.steps
        yield i, u, total_steps


def _nanogpt(units: list[StageUnits], seq_len: int, micro: int, gpus: int) -> list[str]:
    lines: list[str] = []
    for i, u, total_steps in _stage_ends(units):
        lines += [
            f"# ---- config/stage{i}.py (karpathy/nanoGPT train.py; "
            f"from {u.start_tokens:,} to {u.end_tokens:,} tokens)",
            f"init_from = {'scratch' if i == 1 else 'resume'!r}",
            f"block_size = {seq_len}",
            f"batch_size = {micro}  # micro batch per GPU, sequences",
            f"gradient_accumulation_steps = {u.batch_seqs // micro}  # total over {gpus} GPU(s)",
            f"learning_rate = {u.lr:.4g}",
            f"max_iters = {total_steps}  # cumulative: iter_num is restored on resume",
            # train.py saves ckpt.pt only where iter_num % eval_interval == 0 (and the val loss
            # improved, unless always_save_checkpoint), then trains one more step before it stops
            f"eval_interval = {total_steps}  # it saves only when it evaluates: at this stage's end",
            "always_save_checkpoint = True  # save there even if the val loss did not improve",
            "decay_lr = False  # hold learning_rate (nanoGPT then skips warmup: add it to stage 1)",
        ]
        if u.weight_decay is not None:
            lines.append(f"weight_decay = {u.weight_decay:g}")
    return lines


def _hf(units: list[StageUnits], seq_len: int, micro: int, gpus: int) -> list[str]:
    lines, consumed = [], 0  # consumed: sequences trained, whole steps
    for i, u, total_steps in _stage_ends(units):
        wd = f", weight_decay={u.weight_decay:g}" if u.weight_decay is not None else ""
        lines.append(
            f"# stage {i}: from {u.start_tokens:,} tokens; sequences of {seq_len} tokens, world size {gpus}"
        )
        lines.append(
            f"TrainingArguments(per_device_train_batch_size={micro}, "
            f"gradient_accumulation_steps={u.batch_seqs // (micro * gpus)}, max_steps={total_steps}, "
            f'learning_rate={u.lr:.4g}, lr_scheduler_type="constant"{wd}'
            + (", ignore_data_skip=True)" if i > 1 else ")")
        )
        if i > 1:
            lines.append(
                f"# trainer.train(resume_from_checkpoint=<stage {i - 1}: checkpoint-{total_steps - u.steps}>)"
                " after deleting its scheduler.pt (else the previous stage's LR is restored; without it"
                " the Trainer skips optimizer.pt too, so Adam's moments start afresh, and a DeepSpeed"
                f" run fails), with the dataset started {consumed:,} sequences in"
            )
        consumed += u.steps * u.batch_seqs
    return lines


def _toml_float(x: float) -> str:
    return repr(float(f"{x:.4g}"))  # a TOML float: 0.0003, 1e-05, 1.0


def _torchtitan(units: list[StageUnits], seq_len: int, micro: int) -> list[str]:
    lines: list[str] = []
    for i, u, total_steps in _stage_ends(units):
        lines += [
            f"# ---- stage{i}.toml (torchtitan <= v0.2.2 job config, torchtitan/config/job_config.py at "
            f"238fa995; from {u.start_tokens:,} to {u.end_tokens:,} tokens)",
            "# torchtitan after 9810191b (Python configs; configs.py at b5bcd76c): "
            f"--training.num_tokens_per_train_step {u.batch_seqs * seq_len} "
            f"--training.num_tokens_per_microbatch_per_dp_rank {micro * seq_len} "
            f"--training.max_context_length {seq_len}",
            "[training]",
            f"seq_len = {seq_len}",
            f"local_batch_size = {micro}  # sequences per data-parallel rank per micro-batch",
            f"global_batch_size = {u.batch_seqs}  # sequences per optimiser step",
            f"steps = {total_steps}  # cumulative: the checkpoint restores the step",
            "",
            "[optimizer]",
            f"lr = {_toml_float(u.lr)}",
        ]
        if u.weight_decay is not None:
            lines.append(f"weight_decay = {_toml_float(u.weight_decay)}")
        lines += [
            "",
            "[lr_scheduler]",
            "warmup_steps = 0" + ("  # add your warmup to stage 1" if i == 1 else ""),
            "decay_ratio = 0.0  # no decay steps: hold lr",
            "",
            "[checkpoint]",
            "enable = true",
            "last_save_model_only = false  # its default saves the model alone at the last step",
        ]
        if i > 1:
            lines += [
                f"load_step = {total_steps - u.steps}  # the end of stage {i - 1}",
                "# the checkpoint's scheduler holds the previous base LR: take this stage's lr instead",
                'exclude_from_loading = ["lr_scheduler"]',
            ]
        lines.append("")
    return lines


def emit_pretrain(
    trainer: str,
    stages: Sequence[ScheduleStage],
    *,
    seq_len: int,
    total_tokens: int,
    gpus: int = 1,
    micro_batch_seqs: int = 1,
) -> str:
    """The schedule as ``trainer`` (megatron | nanogpt | hf | torchtitan) takes it, with its stage table."""
    if trainer not in PRETRAIN_TRAINERS:
        raise InputError(f"--emit {trainer!r}: choose {', '.join(PRETRAIN_TRAINERS)}")
    if seq_len < 1 or gpus < 1 or micro_batch_seqs < 1:
        raise InputError("--seq-len, --gpus and --micro-batch must be positive")
    unit = micro_batch_seqs * gpus
    units = stage_units(stages, seq_len, total_tokens, unit)
    lines = [f"# pre-training batch schedule for {trainer} (batchtune; docs/pretraining.md)"]
    if len(units) < len(stages):
        lines.append(f"# {len(stages) - len(units)} stage(s) rounded to the previous batch: merged")
    lines += _header(units, seq_len, unit)
    if trainer == "megatron":
        lines += _megatron(units, seq_len, micro_batch_seqs, gpus, total_tokens)
    elif trainer == "nanogpt":
        lines += _nanogpt(units, seq_len, micro_batch_seqs, gpus)
    elif trainer == "torchtitan":
        lines += _torchtitan(units, seq_len, micro_batch_seqs)
    else:
        lines += _hf(units, seq_len, micro_batch_seqs, gpus)
    return "\n".join(lines) + "\n"
