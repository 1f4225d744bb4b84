"""The pre-training workflow: `probe` of a pre-training recipe's grid, `pretrain` on loss logs you
already have, and what `tune` and `recommend` do differently for a pre-training recipe
(backend.training = "pretrain"): it is ranked by time-to-target only from a branched probe (its
grid is read by `batchtune probe`: B_opt and B_min per target loss), with the probe's own step
times as the throughput (nothing is generated), and its pick is emitted for pre-training
frameworks (integrations/emit_pretrain.py), not for RL trainers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from batchtune.analysis.decide.recommend import Recommendation
from batchtune.analysis.pretrain.logs import PretrainAnalysis
from batchtune.errors import InputError
from batchtune.recipe.load import apply_overrides, recipe_from_dict
from batchtune.recipe.schema import Recipe
from batchtune.workflow.study import study_for

SET_COMMANDS = ("recommend", "tune")  # the commands that take a recipe's --set
PRETRAIN_RULES = ("sqrt", "linear", "none")  # `pretrain --rule` (a table needs a recipe)
PRETRAIN_BASE_LR = 3e-4  # `pretrain --base-lr` when neither it nor optimizer.lr is given
# `pretrain` takes logs, not a recipe: the recipe keys it reads, with the option each stands for
PRETRAIN_SET_KEYS = {
    "pretrain.targets": "--targets",
    "lr_scaling.rule": "--rule",
    "optimizer.lr": "--base-lr",
}


@dataclass(frozen=True)
class ScheduleEmit:
    """`pretrain --emit`: the trainer and the sizes its config needs."""

    trainer: str
    seq_len: int = 2048  # tokens per sequence
    total_tokens: int = 0  # where the last stage ends; required
    gpus: int = 1  # data-parallel size
    micro_batch: int = 1  # sequences per GPU per micro-batch


@dataclass(frozen=True)
class PretrainOutcome:
    """`pretrain`: the analysis of the logs, the schedule emitted (None: not asked for, or nothing
    reached a target) and why nothing was estimated (None when something was; exit 3)."""

    analysis: PretrainAnalysis
    emitted: str | None
    unreached: str | None


def pretrain(
    paths: list[Path],
    targets: str | None,
    base_lr: float | None,
    rule: str | None,
    mapping: list[str],
    overrides: list[str] | None = None,
    emit: ScheduleEmit | None = None,
) -> PretrainOutcome:
    """Fit the pre-training curves of loss logs and, with ``emit``, write the schedule for a trainer.
    ``overrides`` (``--set``) may give PRETRAIN_SET_KEYS, checked by the recipe's own types and
    ranges; anything else, or a key also given by its option, is refused."""
    from batchtune.analysis.pretrain.logs import analyse
    from batchtune.integrations.importing import parse_mapping
    from batchtune.integrations.pretrain_logs import read_runs

    levels, lr, rule = _settings(targets, base_lr, rule, overrides or [])
    if emit is not None:
        _check_emit(emit)  # before the logs are read: a typo costs no analysis
    analysis = analyse(read_runs(paths, parse_mapping(mapping)), levels, base_lr=lr, rule=rule)
    unreached = analysis.grid.unreached()
    emitted = emit_schedule(analysis, emit) if emit is not None and unreached is None else None
    return PretrainOutcome(analysis, emitted, unreached)


def _settings(
    targets: str | None, base_lr: float | None, rule: str | None, overrides: list[str]
) -> tuple[list[float], float, str]:
    """The target losses, base LR and LR rule, from the options or --set (never both)."""
    from batchtune.errors import RecipeError

    data = apply_overrides({}, list(overrides or []))
    given = {
        f"{sec}.{k}": v for sec, table in data.items() if isinstance(table, dict) for k, v in table.items()
    }
    unknown = [k for k in data if not isinstance(data[k], dict)] + sorted(set(given) - set(PRETRAIN_SET_KEYS))
    if unknown:
        raise RecipeError(
            f"--set {', '.join(unknown)}: pretrain reads logs, not a recipe; it takes only "
            + ", ".join(f"{k} (or {opt})" for k, opt in PRETRAIN_SET_KEYS.items())
        )
    cfg = recipe_from_dict(data, "--set")  # the recipe's own type and range checks
    flags = {"pretrain.targets": targets, "lr_scaling.rule": rule, "optimizer.lr": base_lr}
    both = [f"{k} and {PRETRAIN_SET_KEYS[k]}" for k in given if flags[k] is not None]
    if both:
        raise RecipeError(f"give each value once: {', '.join(both)}")
    try:
        levels = [float(t) for t in (targets or "").split(",") if t.strip()]
    except ValueError:
        raise InputError(f"--targets {targets!r}: expected numbers separated by commas") from None
    if any(not (math.isfinite(t) and t > 0) for t in levels):
        raise InputError(f"--targets {targets!r}: losses in nats/token, each > 0")
    if base_lr is not None and not (math.isfinite(base_lr) and base_lr > 0):
        raise InputError(f"--base-lr {base_lr:g}: must be a positive LR (the first stage's)")
    if rule is not None and rule not in PRETRAIN_RULES:
        raise InputError(f"--rule {rule!r}: one of {' | '.join(PRETRAIN_RULES)}")
    if "pretrain.targets" in given:
        levels = list(cfg.pretrain.targets)
    lr = cfg.optimizer.lr if "optimizer.lr" in given else (PRETRAIN_BASE_LR if base_lr is None else base_lr)
    rule = cfg.lr_scaling.rule if "lr_scaling.rule" in given else (rule or "sqrt")
    return levels, lr, rule


def _check_emit(emit: ScheduleEmit) -> None:
    """Refuse an `--emit` that could not be written, whatever the logs say."""
    from batchtune.integrations.emit_pretrain import PRETRAIN_TRAINERS

    if emit.trainer not in PRETRAIN_TRAINERS:
        raise InputError(f"--emit {emit.trainer!r}: one of {' | '.join(PRETRAIN_TRAINERS)}")
    if emit.total_tokens <= 0:
        raise InputError(
            f"--emit needs --total-tokens > 0 (got {emit.total_tokens}): "
            "the tokens at which the last stage ends"
        )


def emit_schedule(analysis: PretrainAnalysis, emit: ScheduleEmit) -> str:
    """`pretrain --emit`: the schedule of ``analysis`` as the trainer's config."""
    from batchtune.integrations.emit_pretrain import emit_pretrain

    if emit.total_tokens <= 0:
        raise InputError("--emit needs --total-tokens: the tokens at which the last stage ends")
    return emit_pretrain(
        emit.trainer,
        analysis.grid.schedule,
        seq_len=emit.seq_len,
        total_tokens=emit.total_tokens,
        gpus=emit.gpus,
        micro_batch_seqs=emit.micro_batch,
    )


def check_pretrain_ranking(cfg: Recipe, command: str, emit: str | None) -> None:
    """Refuse, in one line, what ``command`` cannot do with ``cfg`` (module docstring): a
    pre-training grid, an RL emitter on pre-training, a pre-training emitter on RL."""
    from batchtune.integrations.emit_pretrain import PRETRAIN_TRAINERS

    if not cfg.study.pretrain:
        if emit in PRETRAIN_TRAINERS:
            raise InputError(
                f"--emit {emit} is a pre-training framework; an RL recipe's pick emits for verl|trl|openrlhf"
            )
        return
    if not study_for(cfg).ranked:
        head = (
            f"{command} of a pre-training recipe needs probe.mode = 'branched' "
            "(time-to-target from its branches"
        )
        if command in SET_COMMANDS:
            raise InputError(
                f"{head}; add --set probe.mode=branched where a branched probe ran); its grid is read by "
                "`batchtune probe` (B_opt and B_min per target loss)"
            )
        from batchtune.records.store import ResultsStore

        manifest = ResultsStore.of(cfg).read_manifest() or {}
        source = manifest.get("source") or "RECIPE"  # the recipe the probe was given, not the manifest
        raise InputError(  # report and check take no --set: the grid's answer is the probe's output
            f"{head}); {cfg.run.results_dir} holds a grid: rerun `batchtune probe {source} --results "
            f"{cfg.run.results_dir}` with the --set values it ran with to print its B_opt and B_min per "
            "target loss (finished runs are read, not rerun)"
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
    from batchtune.analysis.pretrain.schedule import ScheduleStage
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
