"""The candidates a probe runs: P x G at LRs from the recipe's scaling rule (docs/method.md §3.1, §3.2).

Three families: the main sweep of prompts P at fixed group size G; an optional sweep of G at fixed
total responses P*G (does the task follow N, the total responses?); optional fixed-LR controls.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchtune.analysis.decide.async_sweep import sweep_grid
from batchtune.analysis.sample.lr import scaled_lr
from batchtune.backends.spec import Candidate, RunSpec
from batchtune.errors import RecipeError
from batchtune.recipe.schema import Recipe
from batchtune.records.types import RunRecord, candidate_label, offpolicy_suffix


@dataclass(frozen=True)
class Plan:
    candidates: tuple[Candidate, ...]
    reference: str  # label of the reference candidate (the smallest batch of the main sweep)
    reference_batch: int  # total responses the base LR belongs to
    main: tuple[str, ...]  # labels of the main sweep, ascending in batch
    group_sweep: tuple[str, ...]
    fixed_lr: tuple[str, ...]
    offpolicy: tuple[str, ...] = ()  # main candidates at other staleness / updates per batch

    def by_label(self) -> dict[str, Candidate]:
        return {c.label: c for c in self.candidates}


def lr_table(recipe: Recipe) -> dict[int, float]:
    table: dict[int, float] = {}
    for key, value in recipe.lr_scaling.table.items():
        try:
            table[int(key)] = float(value)
        except ValueError:
            raise RecipeError(f"lr_scaling.table: key {key!r} is not a batch in responses") from None
    return table


def plan_candidates(recipe: Recipe) -> Plan:
    """The candidates of ``recipe``: P x G for RL recipes; for a pre-training recipe
    (backend.training = "pretrain") its token batches (plan_pretrain)."""
    if recipe.study.pretrain:
        return plan_pretrain(recipe)
    c = recipe.candidates
    g = c.group_size
    prompts = sorted(set(c.prompts))
    n_ref = recipe.lr_scaling.reference_batch or prompts[0] * g
    rule = recipe.lr_scaling.rule
    table = lr_table(recipe)
    base = recipe.optimizer.lr
    critic_base = recipe.algorithm.critic_lr or base
    critic_rule = recipe.algorithm.critic_lr_rule or rule
    is_ppo = recipe.algorithm.name == "ppo"

    def make(p: int, gs: int, fixed: bool = False) -> Candidate:
        n = p * gs
        lr = base if fixed else scaled_lr(base, n, n_ref, rule, table)
        critic = None
        if is_ppo:
            critic = critic_base if fixed else scaled_lr(critic_base, n, n_ref, critic_rule, table)
        return Candidate(
            label=candidate_label(p, gs, fixed_lr=fixed),
            prompts=p,
            group_size=gs,
            lr=lr,
            lr_rule="none" if fixed else rule,
            critic_lr=critic,
            fixed_lr=fixed,
            updates_per_batch=recipe.algorithm.mini_batches,
        )

    main = [make(p, g) for p in prompts]
    offpolicy = offpolicy_candidates(recipe, main)
    sweep: list[Candidate] = []
    if c.group_sweep_total:
        for gs in sorted(set(c.group_sweep_sizes)):
            sweep.append(make(c.group_sweep_total // gs, gs))
    fixed = [make(p, g, fixed=True) for p in sorted(set(c.fixed_lr_prompts))]

    seen: dict[str, Candidate] = {}
    for cand in [*main, *sweep, *fixed, *offpolicy]:
        seen.setdefault(cand.label, cand)
    return Plan(
        candidates=tuple(seen.values()),
        reference=main[0].label,
        reference_batch=n_ref,
        main=tuple(x.label for x in main),
        group_sweep=tuple(x.label for x in sweep),
        fixed_lr=tuple(x.label for x in fixed),
        offpolicy=tuple(x.label for x in offpolicy),
    )


def offpolicy_candidates(recipe: Recipe, main: list[Candidate]) -> list[Candidate]:
    """Each main candidate at every (staleness k, updates per batch u) of ``probe``, bar the on-policy
    (0, mini_batches) one that is the candidate itself; same LR, label suffixed ``-k{k}u{u}``."""
    m = recipe.algorithm.mini_batches
    grid = [
        (k, u)
        for k in sorted(set(recipe.probe.staleness))
        for u in sorted(set(recipe.probe.updates_per_batch or [m]))
    ]
    if recipe.probe.async_sweep == "auto":  # the default sweep; the probe prunes it (measure/async_sweep.py)
        grid = sweep_grid(m)
    return [
        dataclasses.replace(c, label=c.label + offpolicy_suffix(k, u), staleness=k, updates_per_batch=u)
        for c in main
        for k, u in grid
        if (k, u) != (0, m)
    ]


def check_targets_reachable(recipe: Recipe) -> None:
    """Refuse, before any run, target losses at or below the synthetic data's loss floor (its exact
    Bayes loss, pretrain.data = "markov"): no batch reaches them however long it trains."""
    p = recipe.pretrain
    if not recipe.study.pretrain or p.data != "markov" or not p.targets:
        return
    from batchtune.backends.pretrain_data import make_data

    floor = make_data(p)[2]
    low = [t for t in p.targets if floor is not None and t <= floor]
    if low:
        raise RecipeError(
            f"pretrain.targets: {', '.join(f'{t:g}' for t in low)} at or below the data's loss floor "
            f"{floor:.4f} nats/token (its exact Bayes loss): no run reaches it; give targets above it"
        )


def plan_pretrain(recipe: Recipe) -> Plan:
    """A pre-training recipe's candidates: every batch of ``pretrain.batches_tokens`` as ``prompts``
    sequences of ``group_size = seq_len`` tokens (so a batch in responses is a batch in tokens), at
    the LR of the recipe's rule from ``lr_scaling.reference_batch`` (default: the smallest batch)."""
    p = recipe.pretrain
    batches = sorted(set(p.batches_tokens))
    ref = recipe.lr_scaling.reference_batch or batches[0]
    rule, table = recipe.lr_scaling.rule, lr_table(recipe)
    main = [
        Candidate(
            label=f"B{b}",
            prompts=b // p.seq_len,
            group_size=p.seq_len,
            lr=scaled_lr(recipe.optimizer.lr, b, ref, rule, table),
            lr_rule=rule,
        )
        for b in batches
    ]
    return Plan(
        candidates=tuple(main),
        reference=main[0].label,
        reference_batch=ref,
        main=tuple(c.label for c in main),
        group_sweep=(),
        fixed_lr=(),
    )


def run_id(candidate: Candidate, seed: int) -> str:
    return f"{candidate.label}-s{seed}"


def timing_spec(recipe: Recipe, candidate: Candidate, scratch: Path, reference_batch: int) -> RunSpec:
    """A run of ``candidate`` alone at seed 0 under ``scratch`` (its folder made), whose first steps
    are timed before a probe: the plan's cost preview, the off-policy sweep."""
    spec = RunSpec(
        run_id=run_id(candidate, 0),
        candidate=candidate,
        seed=0,
        recipe=recipe,
        run_dir=scratch / run_id(candidate, 0),
        base_lr=recipe.optimizer.lr,
        reference_batch=reference_batch,
    )
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    return spec


def run_record(
    candidate: Candidate,
    seed: int,
    base_lr: float,
    reference_batch: int,
    status: str,
    reason: str = "",
    *,
    rid: str | None = None,
    **reported: Any,
) -> RunRecord:
    """The record of one run of ``candidate`` at ``seed``: who it is (label, P, G, its LRs and the
    rule behind them, carried from the plan) and what the run reported (``reported``: steps,
    samples, timings, ...). One place builds it, for the local pool and for Ray alike."""
    return RunRecord(
        run_id=rid or run_id(candidate, seed),
        candidate=candidate.label,
        prompts=candidate.prompts,
        group_size=candidate.group_size,
        seed=seed,
        lr=candidate.lr,
        lr_rule=candidate.lr_rule,
        base_lr=base_lr,
        reference_batch=reference_batch,
        status=status,
        reason=reason,
        critic_lr=candidate.critic_lr,
        staleness=candidate.staleness,
        updates_per_batch=candidate.updates_per_batch or 1,
        **reported,
    )
