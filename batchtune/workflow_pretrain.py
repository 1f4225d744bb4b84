"""What `tune` and `recommend` do differently for a pre-training recipe (backend.training =
"pretrain"): it is ranked by time-to-target only from a branched probe (its grid is read by
`batchtune probe`: B_opt and B_min per target loss), with the probe's own step times as the
throughput (nothing is generated), and its pick is emitted for pre-training frameworks
(integrations/emit_pretrain.py), not for RL trainers.
"""

from __future__ import annotations

import math

from batchtune.analysis.recommend import Recommendation
from batchtune.errors import InputError
from batchtune.recipe.schema import Recipe


def check_pretrain_ranking(cfg: Recipe, command: str, emit: str | None) -> None:
    """Refuse, in one line, what ``command`` cannot do with ``cfg`` (module docstring): a
    pre-training grid, an RL emitter on pre-training, a pre-training emitter on RL."""
    from batchtune.integrations.emit_pretrain import PRETRAIN_TRAINERS

    if cfg.backend.training != "pretrain":
        if emit in PRETRAIN_TRAINERS:
            raise InputError(
                f"--emit {emit} is a pre-training framework; an RL recipe's pick emits for verl|trl|openrlhf"
            )
        return
    if cfg.probe.mode != "branched":
        raise InputError(
            f"{command} of a pre-training recipe needs probe.mode = 'branched' (time-to-target from its "
            "branches; add --set probe.mode=branched where a branched probe ran); its grid is read by "
            "`batchtune probe` (B_opt and B_min per target loss)"
        )
    if emit is not None and emit not in PRETRAIN_TRAINERS:
        raise InputError(
            f"--emit {emit} writes an RL trainer's config; a pre-training pick emits for "
            f"{'|'.join(PRETRAIN_TRAINERS)}"
        )


def emit_pretrain_pick(rec: Recommendation, trainer: str, gpus: int, cfg: Recipe) -> str:
    """The pick of a branched pre-training probe for ``trainer`` (megatron | nanogpt | hf |
    torchtitan): its batch schedule where the prediction says it beats the best fixed batch, else
    one stage at the pick, to the pick's predicted tokens-to-target."""
    from batchtune.analysis.pretrain_schedule import ScheduleStage
    from batchtune.integrations.emit_pretrain import emit_pretrain

    wd = cfg.optimizer.weight_decay
    w, cmp = rec.winner, rec.schedule
    if cmp is not None and len(cmp.stages) > 1 and cmp.winner == "schedule":
        stages = [ScheduleStage(s.start_samples, s.prompts * s.group_size, s.lr, wd) for s in cmp.stages]
        total = cmp.stages[-1].end_samples
    else:
        stages = [ScheduleStage(0.0, w.batch_responses, w.lr, wd)]
        total = w.estimate.samples_to_target if w.estimate is not None else math.nan
    if not math.isfinite(total):
        raise InputError(f"--emit {trainer}: the pick's tokens-to-target are not finite; nothing to emit")
    seq = cfg.pretrain.seq_len
    text = emit_pretrain(trainer, stages, seq_len=seq, total_tokens=math.ceil(total), gpus=gpus)
    return (
        text
        + f"# tokens to the target: {math.ceil(total):,}, the probe's estimate (its interval in the table)\n"
    )
