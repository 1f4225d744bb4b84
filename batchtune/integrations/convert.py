"""One run's logged steps into StepRecords: which log key means what (``LogKeys``, with the user's
names first), samples on the responses axis, cumulative generated tokens, and each step's times.

An entry with no samples of its own counts ``step x samples_per_step`` (``prompts x group_size``
unless the reader says otherwise; docs/method.md §2).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from batchtune.errors import InputError
from batchtune.integrations.common import ImportedRun, LogKeys, RunInfo, StepEntry, safe_run_id
from batchtune.records.types import (
    RunRecord,
    StepRecord,
    candidate_label,
    offpolicy_suffix,
    on_policy_updates,
)


def _resolve(name: str, alternatives: tuple[str, ...], present: set[str], strict: bool, where: str) -> str:
    """The key of ``present`` that ``alternatives`` select, or "" (an error when ``strict``)."""
    for alt in alternatives:
        if alt in present:
            return alt
        if any(c in alt for c in "*?["):
            hits = sorted(k for k in present if fnmatch.fnmatchcase(k, alt))
            if len(hits) == 1:
                return hits[0]
            if len(hits) > 1:
                if strict:
                    raise InputError(
                        f"{where}: {name}={alt!r} matches {len(hits)} keys ({', '.join(hits[:6])}); "
                        f"name one, e.g. {name}={hits[0]}"
                    )
                continue  # ambiguous default: try the next alternative
    if strict and alternatives:
        close = sorted(present)[:8]
        raise InputError(
            f"{where}: no log key {' or '.join(map(repr, alternatives))} for {name}; "
            f"keys include {', '.join(close)}"
        )
    return ""


@dataclass(frozen=True)
class _Columns:
    """The log keys one run's entries use for each quantity ("" or empty: not logged)."""

    metrics: dict[str, str]
    grad_norm: str
    critic_grad_norm: str
    lr: str
    step_s: str
    response_length: str
    gen_s: list[str]
    train_s: list[str]


def _columns(entries: Sequence[StepEntry], keys: LogKeys, source: str) -> _Columns:
    """Resolve each quantity's key among those the entries log; a required one that is missing or
    ambiguous is an error."""
    present: set[str] = set()
    for e in entries:
        present.update(e.values)

    def pick(name: str, alts: tuple[str, ...]) -> str:
        return _resolve(name, alts, present, name in keys.required, source)

    metric_keys = {name: pick(name, alts) for name, alts in keys.metrics.items()}
    cols = _Columns(
        metrics={n: k for n, k in metric_keys.items() if k},
        grad_norm=pick("grad_norm", keys.grad_norm),
        critic_grad_norm=pick("critic_grad_norm", keys.critic_grad_norm),
        lr=pick("lr", keys.lr),
        step_s=pick("step_s", keys.step_s),
        response_length=pick("response_length", keys.response_length),
        gen_s=[k for k in keys.gen_s if k in present],
        train_s=[k for k in keys.train_s if k in present],
    )
    if "gen_s" in keys.required and not cols.gen_s:
        pick("gen_s", keys.gen_s)
    if "train_s" in keys.required and not cols.train_s:
        pick("train_s", keys.train_s)
    return cols


def _times(v: dict[str, float], cols: _Columns) -> tuple[float, float, float]:
    """An entry's (gen_s, train_s, other_s): the finite parts summed; other = the step's time less them."""
    gen_s = sum((v[k] for k in cols.gen_s if k in v and math.isfinite(v[k])), 0.0)
    train_s = sum((v[k] for k in cols.train_s if k in v and math.isfinite(v[k])), 0.0)
    other_s = 0.0
    if cols.step_s in v and math.isfinite(v[cols.step_s]):
        other_s = max(0.0, v[cols.step_s] - gen_s - train_s)
    return gen_s, train_s, other_s


class _Tokens:
    """Cumulative generated tokens: a logged total, else the mean response length times the samples
    it stands for."""

    def __init__(self, info: RunInfo, len_key: str):
        self.info, self.len_key = info, len_key
        self.total = 0.0
        self.counted = 0  # samples whose tokens are counted: up to the last entry with a mean length

    def add(self, v: dict[str, float], samples: int) -> None:
        batch = self.info.prompts * self.info.group_size
        if "tokens" in v and self.len_key == "":
            self.total = v["tokens"]
        elif self.len_key in v:
            if self.info.samples_per_step and self.info.samples_per_step < batch:
                # TRL: one generation of P*G responses feeds several logged optimiser steps, and an
                # entry's mean length averages the generations since the last entry: those that
                # began (at a multiple of P*G samples) in between
                gens = math.ceil(samples / batch - 1e-9) - math.ceil(self.counted / batch - 1e-9)
                self.total += v[self.len_key] * batch * max(gens, 0)
            else:
                self.total += v[self.len_key] * (samples - self.counted)
            self.counted = samples


def imported_label(prompts: int, group_size: int, staleness: int, updates_per_batch: int) -> str:
    """The probe's label for a run launched as given: ``P{p}xG{g}``, and for a stale one (k > 0)
    ``P{p}xG{g}-k{k}u{u}``, as the plan names its off-policy candidates (measure/plan.py), so an
    async run is its own candidate and not one more seed of the on-policy run at its batch."""
    base = candidate_label(prompts, group_size)
    return base + offpolicy_suffix(staleness, updates_per_batch) if staleness > 0 else base


def label_apart(runs: Sequence[ImportedRun], stored: Sequence[RunRecord]) -> list[ImportedRun]:
    """``runs``, each on-policy one (k = 0, its default label ``P{p}xG{g}``) at another updates per
    batch u than the on-policy runs of its batch shape (P, G) relabelled ``P{p}xG{g}-k0u{u}``: more
    epochs or mini-batches per rollout batch is another training procedure, not one more seed of the
    candidate. A shape's on-policy u is that of its runs ``stored`` under a plain label (a probe's:
    its mini-batches; a stored run keeps its label), else the smallest u among its ``runs`` at k = 0,
    so a PPO import (u > 1) keeps its own runs as the reference, and a batch sweep at verl's fixed
    ppo_mini_batch_size (u grows with P) keeps every batch on the on-policy curve
    (records/types.on_policy_updates). A probe labels its k = 0 candidates at other u the same way
    (measure/plan.offpolicy_candidates). `recommend`'s joint decision ranks the async runs of a shape
    against that u's runs."""
    ref = on_policy_updates(runs) | on_policy_updates(stored)  # the stored runs' u where they have one

    def apart(r: ImportedRun) -> bool:  # a label the user gave (RunInfo.candidate) is kept
        return (
            r.staleness == 0
            and r.candidate == candidate_label(r.prompts, r.group_size)
            and r.updates_per_batch != ref.get((r.prompts, r.group_size), r.updates_per_batch)
        )

    return [
        replace(r, candidate=r.candidate + offpolicy_suffix(0, r.updates_per_batch)) if apart(r) else r
        for r in runs
    ]


def build_run(
    entries: Sequence[StepEntry], info: RunInfo, keys: LogKeys, source: str, default_run_id: str
) -> ImportedRun:
    """Convert one run's logged steps into StepRecords (samples in responses, cumulative counters)."""
    if not entries:
        raise InputError(f"{source}: no logged steps to import")
    P, G = info.prompts, info.group_size
    if P <= 0 or G <= 0:
        raise InputError(
            f"{source}: the log does not say the batch; give prompts and group_size "
            "(verl: data.train_batch_size and rollout.n; TRL: see docs/import-logs.md)"
        )
    run_id = safe_run_id(info.run_id or default_run_id)
    cols = _columns(entries, keys, source)
    lr_key = cols.lr
    if lr_key == "" and info.lr <= 0:
        raise InputError(f"{source}: the log has no learning rate; give the run's lr")

    # LR at steps that do not log it (verl's step-0 validation line): the last one known, else the first
    logged_lrs = [e.values[lr_key] for e in entries if lr_key and lr_key in e.values]
    lr = info.lr if info.lr > 0 or not logged_lrs else logged_lrs[0]
    steps: list[StepRecord] = []
    prev_samples = 0
    tokens = _Tokens(info, cols.response_length)
    for e in entries:
        v = e.values
        samples = e.samples if e.samples is not None else e.step * (info.samples_per_step or P * G)
        if samples < prev_samples:
            raise InputError(f"{e.where}: samples go backwards ({samples} after {prev_samples})")
        tokens.add(v, samples)
        lr = v.get(lr_key, lr) if lr_key else lr
        gen_s, train_s, other_s = _times(v, cols)
        metrics = {name: v[k] for name, k in cols.metrics.items() if k in v}
        if keys.keep_all:
            for k, x in v.items():
                metrics.setdefault(k, x)
        steps.append(
            StepRecord(
                run_id=run_id,
                step=e.step,
                samples=int(samples),
                tokens=int(round(tokens.total)),
                lr=float(lr),
                prompts=P,
                group_size=G,
                seed=info.seed,
                metrics=metrics,
                grad_norm=v.get(cols.grad_norm) if cols.grad_norm else None,
                critic_grad_norm=v.get(cols.critic_grad_norm) if cols.critic_grad_norm else None,
                gen_s=gen_s,
                train_s=train_s,
                other_s=other_s,
            )
        )
        prev_samples = samples
    run_lr = info.lr if info.lr > 0 else max(s.lr for s in steps)
    if not run_lr > 0:
        raise InputError(f"{source}: run {run_id!r} logs an lr of 0 at every step; give the run's --lr")
    return ImportedRun(
        run_id=run_id,
        candidate=info.candidate or imported_label(P, G, info.staleness, info.updates_per_batch),
        prompts=P,
        group_size=G,
        seed=info.seed,
        lr=run_lr,
        steps=tuple(steps),
        source=source,
        critic_lr=info.critic_lr or None,
        staleness=info.staleness,
        updates_per_batch=info.updates_per_batch,
    )
