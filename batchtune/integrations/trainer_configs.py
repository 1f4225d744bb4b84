"""Reading a trainer's own config as it lives in a repository, for `batchtune check`.

Four shapes, each converted to batchtune's units (docs/method.md §2: P prompts, G responses per prompt,
N = P*G responses per step, the actor LR, responses decoded at once per engine), remembering the
file line of every value so CI annotations can point at it:

- verl: a YAML config (nested keys) or Hydra-style ``key=value`` override lines (a
  ``python3 -m verl.trainer.main_ppo \\`` script). ``data.train_batch_size`` is P,
  ``actor_rollout_ref.rollout.n`` is G, ``actor_rollout_ref.actor.optim.lr`` the LR,
  ``actor_rollout_ref.rollout.max_num_seqs`` caps each engine's concurrency (names as
  integrations/verl.py emits); a step's responses are split over GPUs / (rollout TP x PP) engines.
- trl: ``GRPOConfig`` fields as YAML, JSON or CLI arguments (``--name value``). The generation batch is
  N: ``generation_batch_size``, else ``per_device_train_batch_size * num_processes *
  steps_per_generation`` (steps_per_generation defaults to ``gradient_accumulation_steps``: trl 1.16
  ``GRPOConfig.__post_init__``); num_processes, which (Async)GRPOConfig refuses as a key, may be an
  ``accelerate launch --num_processes N`` line or comment (emitted TRL files carry one); G is
  ``num_generations``; each process generates its share at once, or with ``use_vllm`` each colocated
  engine (one per ``vllm_tensor_parallel_size`` processes) or the one ``vllm_mode = "server"``
  engine; an AsyncGRPOConfig's server ``max_inflight_tasks`` completions.
- openrlhf: ``train_ppo_ray`` flag lines, 0.10.2 hierarchical names or the older flat ones
  (``--rollout.batch_size`` / ``--rollout_batch_size`` is P, ``--rollout.n_samples_per_prompt`` G,
  ``--actor.adam.lr`` the LR, as integrations/openrlhf.py emits them).
- generic: TOML or JSON with ``prompts``, ``group_size``, ``lr`` and optionally
  ``generation_concurrency``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from batchtune.errors import InputError
from batchtune.integrations.config_files import Flat, read_flat
from batchtune.integrations.openrlhf import _LEGACY as OPENRLHF_LEGACY
from batchtune.integrations.trainer_configs_async import (
    AsyncGrpoSteps,
    AsyncReading,
    FullyAsyncInterval,
    fully_async_verl,
    number_at,
    openrlhf_async,
    trl_async,
    verl_async,
)

CONFIG_FORMATS = ("verl", "trl", "openrlhf", "generic")

VERL_NAMES = {
    "prompts": "data.train_batch_size",
    "group_size": "actor_rollout_ref.rollout.n",
    "lr": "actor_rollout_ref.actor.optim.lr",
    "generation_concurrency": "actor_rollout_ref.rollout.max_num_seqs",
    "mini_batch": "actor_rollout_ref.actor.ppo_mini_batch_size",
}
OPENRLHF_NAMES = {
    "prompts": "--rollout.batch_size",
    "group_size": "--rollout.n_samples_per_prompt",
    "lr": "--actor.adam.lr",
    "train_batch": "--train.batch_size",
}
VERL_ROLLOUT_TP = 2  # actor_rollout_ref.rollout.tensor_model_parallel_size's default (rollout.yaml)
VERL_MAX_NUM_SEQS = 256  # actor_rollout_ref.rollout.max_num_seqs's default
VERL_GPUS_PER_NODE = 8  # trainer.n_gpus_per_node's default (ppo_trainer.yaml)
GENERIC_NAMES = ("prompts", "group_size", "lr", "generation_concurrency")


@dataclass(frozen=True)
class Setting:
    """One value as the trainer names it, and the 1-based line of the file it came from (if known)."""

    name: str
    value: float
    line: int | None


@dataclass(frozen=True)
class TrainerConfig:
    """A trainer config in batchtune's units; ``settings`` maps each role (prompts, group_size, lr,
    generation_concurrency, batch) to where it came from, for messages and annotations."""

    trainer: str
    path: str
    prompts: int
    group_size: int
    lr: float | None  # actor peak LR; None when the config does not set it
    generation_concurrency: int | None  # responses decoded at once per engine; None = not set
    settings: dict[str, Setting] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    engines: int = 1  # inference engines a step's responses are split over (verl: GPUs / rollout TP)
    # off-policy (trainer_configs_async.py): trainer steps of lag, updates per rollout batch, GPUs
    staleness: float = 0.0
    updates_per_batch: float = 1.0
    mode: str = "sync"  # sync: generation shares the training GPUs | async: GPUs of its own
    own_units: AsyncGrpoSteps | FullyAsyncInterval | None = None  # check reads it in a probe's batches

    @property
    def batch_responses(self) -> int:
        return self.prompts * self.group_size

    def line_of(self, role: str) -> int | None:
        s = self.settings.get(role)
        return s.line if s else None

    def name_of(self, role: str) -> str:
        s = self.settings.get(role)
        return s.name if s else role


def detect_format(flat: Flat) -> str | None:
    keys = set(flat)
    if any(k.startswith(("actor_rollout_ref.", "data.train_batch_size")) for k in keys):
        return "verl"
    if any(k.lstrip("-") in ("num_generations", "per_device_train_batch_size") for k in keys):
        return "trl"
    legacy = set(OPENRLHF_LEGACY.values())
    if any(k in legacy or k.startswith(("--rollout.", "--actor.", "--train.")) for k in keys):
        return "openrlhf"
    if "prompts" in keys and "group_size" in keys:
        return "generic"
    return None


# ---- per trainer ----------------------------------------------------------------------------------


def _number(flat: Flat, names: tuple[str, ...], path: Path, *, integer: bool) -> Setting | None:
    """The first of ``names`` present, as a number; a non-number is bad input naming its line."""
    for name in names:
        if (got := number_at(flat, path, name)) is None:  # absent, or YAML null: the trainer's default
            continue
        value, where = got
        if not math.isfinite(value) or value <= 0 or (integer and value != int(value)):
            kind = "a positive whole number" if integer else "a positive number"
            raise InputError(f"{where}: {name} = {flat[name][0]!r} must be {kind}")
        return Setting(name, value, flat[name][1])
    return None


_TRUE = ("true", "1", "yes", "y", "t")  # HfArgumentParser's spellings of true


def _layout(flat: Flat, path: Path, names: tuple[str, ...], default: int, notes: list[str]) -> int:
    """An optional layout setting (GPUs, parallel sizes), else the trainer's default; one that is not
    a positive whole number here (a launch script's ``$NNODES``) is the default too, with a note: the
    check only reads it."""
    try:
        s = _number(flat, names, path, integer=True)
    except InputError:
        key = next(n for n in names if n in flat)
        notes.append(f"{key} = {flat[key][0]!r} is not a number here: the default {default} is assumed")
        return default
    return int(s.value) if s else default


def _require(s: Setting | None, what: str, names: tuple[str, ...], path: Path) -> Setting:
    if s is None:
        raise InputError(f"{path}: no {what} ({' or '.join(names)}); set it in the config")
    return s


def _verl(flat: Flat, path: Path) -> TrainerConfig:
    n = VERL_NAMES
    g = _require(
        _number(flat, (n["group_size"],), path, integer=True), "group size", (n["group_size"],), path
    )
    if fully_async_verl(flat):  # data.train_batch_size is 0 there: the sync interval is the batch
        reading = verl_async(flat, None, int(g.value), path)  # (check reads it in the probe's batches)
        p = Setting("async_training.trigger_parameter_sync_step", float(reading.prompts or 0), None)
    else:
        p = _require(
            _number(flat, (n["prompts"],), path, integer=True), "prompt batch", (n["prompts"],), path
        )
        reading = verl_async(flat, int(p.value), int(g.value), path)
    lr = _number(flat, (n["lr"],), path, integer=False)
    cap = _number(flat, (n["generation_concurrency"],), path, integer=True)
    mini = _number(flat, (n["mini_batch"],), path, integer=True)
    notes = []  # fully_async's updates per interval are in its own note: its interval is no rollout batch
    if mini and not reading.own_units and int(p.value) % int(mini.value) == 0 and mini.value < p.value:
        notes.append(
            f"{int(p.value // mini.value)} actor updates per rollout batch ({n['mini_batch']}="
            f"{int(mini.value)}): the rollout batch is split into mini-batches, which the probe "
            "measures only if it did the same"
        )
    # max_num_seqs caps each vLLM engine; a step's responses are split over the engines, one per
    # tensor x pipeline parallel group of the rollout's GPUs (verl b178a3cd: agent_loop.py,
    # rollout.yaml, ppo_trainer.yaml for the defaults)
    rollout = "actor_rollout_ref.rollout"
    per_node = _layout(flat, path, ("trainer.n_gpus_per_node",), VERL_GPUS_PER_NODE, notes)
    nodes = _layout(flat, path, ("trainer.nnodes",), 1, notes)
    if reading.mode == "async":  # the rollout's own GPUs generate: V1 separate_async's, or the
        # top-level rollout block, which fully_async and one-step-off copy over actor_rollout_ref's
        block = "rollout" if "rollout.nnodes" in flat or fully_async_verl(flat) else rollout
        per_node = _layout(flat, path, (f"{block}.n_gpus_per_node",), per_node, notes)
        nodes = _layout(flat, path, (f"{block}.nnodes",), 1, notes)
    tp = _layout(flat, path, (f"{rollout}.tensor_model_parallel_size",), VERL_ROLLOUT_TP, notes)
    pp = _layout(flat, path, (f"{rollout}.pipeline_model_parallel_size",), 1, notes)
    engines = per_node * nodes // (tp * pp)
    if engines < 1:
        notes.append(f"{per_node * nodes} GPU(s) cannot hold one engine of TP {tp} x PP {pp}: one assumed")
        engines = 1
    if cap is None:
        cap = Setting(n["generation_concurrency"], VERL_MAX_NUM_SEQS, None)
        notes.append(f"{n['generation_concurrency']} not in the config: verl's default {VERL_MAX_NUM_SEQS}")
    iv = reading.own_units if isinstance(reading.own_units, FullyAsyncInterval) else None
    flight = (iv.prompts_in_flight(engines) if iv else int(p.value)) * int(g.value)  # fully_async streams
    share = math.ceil(flight / engines)
    in_flight = int(min(cap.value, share))
    if engines > 1 or iv:
        notes.append(
            f"{iv.in_flight_text(engines) if iv else f'{flight} responses'} over {engines} engines (GPUs / "
            f"rollout TP x PP): at most {share} in flight per engine, {cap.name}={int(cap.value)} caps each"
        )
    return _build("verl", path, p, g, lr, cap, notes, engines=engines, in_flight=in_flight, reading=reading)


def _trl(flat: Flat, path: Path) -> TrainerConfig:
    def num(name: str, integer: bool = True) -> Setting | None:
        return _number(flat, (name, f"--{name}"), path, integer=integer)

    g = _require(num("num_generations"), "group size", ("num_generations",), path)
    procs = num("num_processes") or _launch_processes(path)
    nproc = int(procs.value) if procs else 1
    gen = num("generation_batch_size")
    notes = (
        []
        if procs
        else [
            "num_processes not in the config (nor an `accelerate launch --num_processes N` line or "
            "comment): 1 process assumed"
        ]
    )
    if gen is None:
        per = _require(
            num("per_device_train_batch_size"),
            "batch",
            ("generation_batch_size", "per_device_train_batch_size"),
            path,
        )
        spg = num("steps_per_generation") or num("gradient_accumulation_steps")
        total = per.value * nproc * (spg.value if spg else 1)
        gen = Setting(per.name, total, per.line)
    if int(gen.value) % int(g.value):
        raise InputError(
            f"{path}:{gen.line}: a generation batch of {int(gen.value)} completions is not a whole number "
            f"of groups of num_generations={int(g.value)}"
        )
    p = Setting(gen.name, gen.value / g.value, gen.line)
    lr = num("learning_rate", integer=False)
    # who generates (trl 1.16 grpo_trainer.py, generation/vllm_generation.py): without vLLM each
    # process its own share; vLLM "server" mode one server for the whole batch (prompts gathered);
    # "colocate" one engine per tensor-parallel group of processes
    # (vllm_mode defaults to "colocate" since trl 1.0)
    use_vllm = flat.get("use_vllm", flat.get("--use_vllm", (False, None)))[0]
    mode = str(flat.get("vllm_mode", flat.get("--vllm_mode", ("colocate", None)))[0])
    engines = nproc
    if str(use_vllm).strip().lower() in _TRUE:
        tp = _layout(flat, path, ("vllm_tensor_parallel_size", "--vllm_tensor_parallel_size"), 1, notes)
        engines = 1 if mode == "server" else max(1, nproc // tp)
        notes.append(f"vLLM in {mode} mode: {engines} engine(s) generate the batch")
    conc = Setting(gen.name, math.ceil(gen.value / engines), gen.line)  # each engine its share at once
    reading = trl_async(flat, nproc, int(gen.value), path)
    if reading.mode == "async":  # AsyncGRPO: one vLLM server takes max_inflight_tasks at once
        engines = 1
        conc = _inflight_tasks(flat, path, gen)
    return _build("trl", path, p, g, lr, conc, notes, batch=gen, engines=engines, reading=reading)


def _inflight_tasks(flat: Flat, path: Path, gen: Setting) -> Setting:
    """AsyncGRPOConfig.max_inflight_tasks, completions in flight at its vLLM server; its default
    (negative, or absent) is max(max_staleness, 1) x one optimiser step's completions (trl 1.16,
    AsyncGRPOTrainer: the floor keeps max_staleness = 0 from zeroing the rollout loop)."""
    names = ("max_inflight_tasks", "--max_inflight_tasks")
    if not _negative(flat, names):  # set: a positive whole number (0 would stall TRL's rollout loop)
        return _require(_number(flat, names, path, integer=True), "max_inflight_tasks", names, path)
    stale = ("max_staleness", "--max_staleness")
    if not any(n in flat for n in stale):
        k = 4.0  # AsyncGRPOConfig's default
    elif _negative(flat, stale, below=1):
        k = 1.0  # 0, a valid strict discard policy: TRL floors it at 1
    else:
        k = _require(_number(flat, stale, path, integer=True), "max_staleness", stale, path).value
    return Setting(gen.name, k * gen.value, gen.line)


def _negative(flat: Flat, names: tuple[str, ...], below: float = 0) -> bool:
    """Whether the first of ``names`` is absent or a number below ``below`` (TRL's "unset")."""
    raw = next((flat[n][0] for n in names if n in flat), None)
    try:
        return raw is None or (not isinstance(raw, bool) and float(raw) < below)
    except (TypeError, ValueError):
        return False  # not a number: _number says so, naming its line


_LAUNCH = re.compile(r"\baccelerate\s+launch\b.*?--num_processes(?:=|\s+)(\d+)")


def _launch_processes(path: Path) -> Setting | None:
    """The process count of an ``accelerate launch --num_processes N`` line, commented out or not:
    where a YAML/JSON config that ``GRPOConfig(**...)`` takes as it is can say it (batchtune's
    emitted TRL files write it in a ``#`` comment; GRPOConfig and AsyncGRPOConfig have no such key)."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = _LAUNCH.search(line)
        if m and int(m.group(1)) > 0:
            return Setting("accelerate launch --num_processes", float(m.group(1)), i)
    return None


def _openrlhf(flat: Flat, path: Path) -> TrainerConfig:
    def names(key: str) -> tuple[str, ...]:
        hier = OPENRLHF_NAMES[key]
        return (hier, OPENRLHF_LEGACY[hier])

    p = _require(_number(flat, names("prompts"), path, integer=True), "prompt batch", names("prompts"), path)
    g = _number(flat, names("group_size"), path, integer=True)
    if g is None:
        raise InputError(
            f"{path}: no {' or '.join(names('group_size'))}; OpenRLHF's default is 1, which GRPO cannot use"
        )
    lr = _number(flat, names("lr"), path, integer=False)
    notes = ["OpenRLHF has no per-engine sequence cap flag: generation concurrency is not checked"]
    tb = _number(flat, names("train_batch"), path, integer=True)
    if tb is not None and tb.value < p.value * g.value:
        notes.append(
            f"{int(p.value * g.value // tb.value)} optimiser steps per rollout ({tb.name}={int(tb.value)})"
        )
    reading = openrlhf_async(flat, int(p.value * g.value), path)
    return _build("openrlhf", path, p, g, lr, None, notes, reading=reading)


def _generic(flat: Flat, path: Path) -> TrainerConfig:
    p = _require(_number(flat, ("prompts",), path, integer=True), "prompts", ("prompts",), path)
    g = _require(_number(flat, ("group_size",), path, integer=True), "group_size", ("group_size",), path)
    lr = _number(flat, ("lr",), path, integer=False)
    conc = _number(flat, ("generation_concurrency",), path, integer=True)
    return _build("generic", path, p, g, lr, conc, [])


def _build(
    trainer: str,
    path: Path,
    p: Setting,
    g: Setting,
    lr: Setting | None,
    conc: Setting | None,
    notes: list[str],
    batch: Setting | None = None,
    engines: int = 1,
    in_flight: int | None = None,
    reading: AsyncReading | None = None,
) -> TrainerConfig:
    """``in_flight``: the responses one engine decodes at once when that is less than ``conc``, the
    configured cap (verl's max_num_seqs over a step's share per engine)."""
    settings = {"prompts": p, "group_size": g, "batch": batch or p}
    if lr is not None:
        settings["lr"] = lr
    if conc is not None:
        settings["generation_concurrency"] = conc
    return TrainerConfig(
        trainer=trainer,
        path=str(path),
        prompts=int(p.value),
        group_size=int(g.value),
        lr=lr.value if lr else None,
        generation_concurrency=in_flight if in_flight is not None else int(conc.value) if conc else None,
        settings=settings,
        notes=(*notes, *(reading.notes if reading else ())),
        engines=engines,
        staleness=reading.staleness if reading else 0.0,
        updates_per_batch=reading.updates_per_batch if reading else 1.0,
        mode=reading.mode if reading else "sync",
        own_units=reading.own_units if reading else None,
    )


_READERS = {"verl": _verl, "trl": _trl, "openrlhf": _openrlhf, "generic": _generic}


def read_trainer_config(path: str | Path, fmt: str = "auto") -> TrainerConfig:
    """Read ``path`` as ``fmt`` (verl | trl | openrlhf | generic, or auto: guessed from its keys)."""
    if fmt != "auto" and fmt not in CONFIG_FORMATS:
        raise InputError(f"--format {fmt!r}: choose auto, {', '.join(CONFIG_FORMATS)}")
    p = Path(path)
    flat, _ = read_flat(p, fmt)
    if fmt == "auto":
        guessed = detect_format(flat)
        if guessed is None:
            raise InputError(
                f"{p}: cannot tell which trainer this config is for; pass --format {'|'.join(CONFIG_FORMATS)}"
            )
        fmt = guessed
    return _READERS[fmt](flat, p)
