"""The recipe schema: frozen dataclasses holding the only defaults, and the choices of each field.

A recipe is a TOML file whose tables mirror these dataclasses; `load.py` reads and checks it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from batchtune.recipe.study import StudyKind, study_of


@dataclass(frozen=True)
class RunConfig:
    name: str = "batchtune"
    results_dir: str = "bt-results"  # relative paths resolve against the working directory
    workers: int = 1  # runs in flight at once: local processes, or Ray tasks/jobs
    executor: str = "local"  # local | ray
    # Ray (docs/distributed.md): in-process trainers run as Ray tasks, the command backend as Ray Jobs
    # an existing cluster ("auto", "host:6379", "ray://host:10001"); "" = RAY_ADDRESS, else a new local Ray
    ray_address: str = ""
    ray_num_cpus: float = 1.0  # CPUs per run: a task's, or a job entrypoint's
    ray_num_gpus: float = -1.0  # GPUs per run; -1 = hardware.num_gpus for a task on CUDA, else 0
    ray_max_retries: int = 2  # a run whose worker or node is lost is rerun this often, then sealed "failed"
    ray_env: dict[str, str] = field(default_factory=dict)  # environment of Ray tasks and jobs (runtime_env)
    ray_python: str = ""  # interpreter of a job's entrypoint; "" = this driver's (set "python" on a cluster)


@dataclass(frozen=True)
class ModelConfig:
    # "tiny-llama" builds a small Llama from the fields below (no download); anything else is a
    # local model directory or a hub name loaded with transformers' from_pretrained.
    name: str = "tiny-llama"
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on CUDA) | float32 | bfloat16 | float16
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    max_position_embeddings: int = 256
    pretrain_steps: int = 200  # supervised warm start of the tiny model so RL has signal
    pretrain_lr: float = 3e-3  # AdamW LR of that warm start (fixed seed, cached, shared by all runs)
    pretrain_batch: int = 64  # examples per warm-start step


@dataclass(frozen=True)
class TaskConfig:
    # built-in verifiable tasks: arithmetic | copy | sort | reverse; or "jsonl" with prompts_file
    name: str = "arithmetic"
    difficulty: int = 2  # task-specific size (digits, list length)
    prompts_file: str = ""  # JSONL with {"prompt": ..., optional "answer": ...} per line
    reward: str = ""  # "module:function" called as f(prompt, response, answer) -> float
    train_size: int = 4096
    eval_size: int = 128
    eval_every_samples: int = 0  # held-out evaluation interval in responses; 0 = every step


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str = "grpo"  # grpo | ppo
    clip_eps: float = 0.2
    kl_coef: float = 0.0  # KL to the frozen reference model; 0 disables it
    mini_batches: int = 1  # optimiser steps per rollout batch; 1 keeps policy age batch-independent
    gamma: float = 1.0  # PPO discount
    lam: float = 0.95  # PPO GAE lambda
    critic_lr: float = 0.0  # PPO critic base LR; 0 = same as the actor's base LR
    critic_lr_rule: str = ""  # PPO critic scaling rule: sqrt|linear|none; "" = the actor's (not table)
    value_clip: float = 0.2
    # responses per forward/backward pass (gradient accumulation; changes memory, not the maths);
    # 0 = a whole mini-batch at once
    micro_batch_responses: int = 0
    # sync: generate and train in turn in one process (staleness k by generating k batches ahead);
    # async: a rollout worker process and the trainer overlap (backends/torch_rl/async_run.py), rollouts
    # at most `staleness` trainer steps old, weights sent every sync_every steps (<= staleness + 1; k = 0:
    # every step), at most in_flight_cap finished batches queued (0 = max(staleness, 1))
    mode: str = "sync"
    sync_every: int = 1
    in_flight_cap: int = 0

    @property
    def runs_sync_every(self) -> int:  # trainer steps per weight sync in its runs (sync: every step)
        return self.sync_every if self.mode == "async" else 1


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"  # adamw | adam | sgd
    lr: float = 1e-3  # base LR at the reference batch
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # on the global norm (0: no clipping); the pre-clip norm is logged
    warmup_samples: int = 0  # linear warmup measured in samples, the same at every batch


@dataclass(frozen=True)
class LRScalingConfig:
    rule: str = "sqrt"  # sqrt | linear | none | table
    reference_batch: int = 0  # total responses the base LR belongs to; 0 = smallest candidate
    table: dict[str, float] = field(default_factory=dict)  # {"N": lr} for rule = "table"
    adam_sde: bool = False  # also move betas and eps (Malladi et al. 2022)


@dataclass(frozen=True)
class CandidatesConfig:
    prompts: list[int] = field(default_factory=lambda: [4, 8, 16, 32])  # P per step
    group_size: int = 8  # G responses per prompt
    # a sweep of G at fixed total responses P*G, testing whether N is the right unit
    group_sweep_total: int = 0  # 0 disables it
    group_sweep_sizes: list[int] = field(default_factory=list)
    fixed_lr_prompts: list[int] = field(default_factory=list)  # extra fixed-LR controls


@dataclass(frozen=True)
class TargetConfig:
    metric: str = "eval_reward"  # a key of the step records' metrics
    value: float = 0.5
    higher_is_better: bool = True
    tolerance: float = 0.1  # R(B)/R(B0) <= 1 + tolerance counts as invariant
    ema_alpha: float = 0.5  # smoothing before the monotone envelope
    confidence: float = 0.9


@dataclass(frozen=True)
class BudgetConfig:
    max_samples: int = 8192  # per run, in responses
    stop_at_target: bool = True
    stop_outside_band: bool = True  # stop a candidate clearly outside the reference's band
    band_factor: float = 1.5  # "clearly": past band_factor * (1 + tol) * reference R (upper CI)
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    diverge_factor: float = 10.0  # loss above this multiple of its first value counts as diverged
    # sequential seeding: rounds of one more seed (paired with the reference) for inconclusive batches
    max_extra_seeds: int = 3
    # async/off-policy probes: candidates within (1 + margin) x the best T get async_top_up_seeds
    # seeds, then close calls double theirs up to max_seeds (analysis/decide/async_topup.py); 0: none
    # (margin and cap chosen on held-out NQM instances: docs/async.md; the rule reads them from here)
    async_top_up_seeds: int = 8
    async_top_up_margin: float = 0.3
    async_top_up_max_seeds: int = 64
    # the full run this probe is for (the run you will launch at the pick): its samples, or its steps
    # at full_run_batch samples a step (0 = the geometric middle of the main candidates); 0 = not
    # stated. probe.mode = "auto" weighs the probe's cost against it (measure/probe_size.py)
    full_run_samples: int = 0
    full_run_steps: int = 0
    full_run_batch: int = 0


@dataclass(frozen=True)
class GenerationConfig:
    backend: str = "transformers"  # transformers | vllm | simulated
    max_new_tokens: int = 32
    prompt_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    repeats: int = 3
    warmup: int = 1
    modes: list[str] = field(default_factory=lambda: ["fixed", "eos"])
    # gain per doubling below which throughput stops paying (we choose 10%; DeepSpeed's autotuner uses 5%)
    knee_threshold: float = 0.1
    gpu_memory_utilization: float = 0.5  # vLLM's share of GPU memory (colocated trainers differ)
    # vLLM on CPU: KV-cache bytes (kv_cache_memory_bytes; gpu_memory_utilization would be a share of
    # host RAM there); 0 = what max_num_seqs sequences of prompt + max_new_tokens need in vLLM's
    # 128-token CPU blocks (gen_vllm.cpu_kv_cache_bytes)
    kv_cache_bytes: int = 0
    max_num_seqs: int = 0  # vLLM cap; 0 = the largest concurrency in the sweep
    train_batches: list[int] = field(default_factory=lambda: [8, 16, 32, 64])  # responses
    other_s_per_step: float = 0.0  # reward, reference log-probs, weight sync not measured
    # a contended profile is timed again up to this many times (0 = once, only warn), the least
    # contended kept, after waits from retime_wait_s doubling (measure/profile_retime.py)
    retime_contended: int = 2
    retime_wait_s: float = 10.0
    # eos mode: each response's length is drawn as min(Geometric(eos_stop_prob), max_new_tokens) and
    # the engine stops it there (a long tail, as RL responses have); 0 = the model's own EOS, which a
    # random-weights model almost never emits. fixed mode ignores EOS whatever this says.
    eos_stop_prob: float = 0.02
    random_weights: bool = False  # build the model from its config.json alone (vLLM load_format="dummy")
    enforce_eager: bool = False  # vLLM: no CUDA graphs (faster start, slower decode)
    seed: int = 0  # prompts, lengths and sampling of the profile


@dataclass(frozen=True)
class HardwareConfig:
    device: str = "auto"  # auto | cpu | cuda
    name: str = "auto"  # a known GPU (H200, H100-SXM, ...) for the roofline; auto = detect
    peak_flops: float = 0.0  # overrides; 0 = from the known table
    hbm_bytes_per_s: float = 0.0
    num_gpus: int = 1
    threads: int = 0  # torch CPU threads per worker; 0 = torch's default
    memory_bytes: float = 0.0  # device memory override for the roofline; 0 = from the known table


@dataclass(frozen=True)
class BackendConfig:
    training: str = "torch"  # torch | nqm | command | trl
    # command backend: argv template with {prompts} {group_size} {batch_responses} {lr} {seed}
    # {output_dir} {max_samples} {max_steps} placeholders; never a shell string
    command: list[str] = field(default_factory=list)
    command_log: str = ""  # the log the command writes, relative to {output_dir}
    command_log_format: str = "jsonl"  # jsonl | csv | verl | trl | tensorboard | wandb
    timeout_s: float = 0.0  # per run; 0 = none
    # extra environment for the command, values with the same placeholders (e.g. verl's
    # VERL_FILE_LOGGER_PATH = "{output_dir}/metrics.jsonl")
    command_env: dict[str, str] = field(default_factory=dict)
    # batchtune name -> the log's key or column (e.g. reward = "train/acc"); empty = the format's defaults
    command_log_keys: dict[str, str] = field(default_factory=dict)
    # checkpoints, for branched probes and schedules (docs/branched.md "Your own trainer"): where the
    # trainer writes the checkpoint of its step {step} (placeholders as the command's, plus {step}
    # and {samples}), the args appended to a run that must save ({save_every_steps},
    # {save_at_steps}) and to one that starts from a checkpoint ({resume_from}, {resume_step});
    # resume_steps: "continue" (the trainer's step count goes on from the checkpoint's: verl, TRL,
    # OpenRLHF) or "restart" (it counts from 1 again)
    checkpoint_path: str = ""
    command_save_args: list[str] = field(default_factory=list)
    command_resume_args: list[str] = field(default_factory=list)
    resume_steps: str = "continue"


@dataclass(frozen=True)
class ProbeConfig:
    # grid: every candidate a run from scratch towards the target (docs/method.md §3.2);
    # branched: one trunk at the reference batch, checkpointed, and short branches at k x the batch
    # from each checkpoint (Merrill et al. 2025, arXiv 2505.23971); the [branch] section sets it up;
    # auto: branched where the recipe states a full run (budget.full_run_*) long enough for it and
    # it costs less than the grid, else grid (measure/probe_size.py; `batchtune plan` says why)
    mode: str = "auto"
    # off-policy sweep (docs/trainer.md): each main candidate also runs at every staleness k (rollouts
    # from the weights of k trainer steps ago) x updates per rollout batch u listed here (u a multiple
    # of algorithm.mini_batches: mini-batches x epochs), labelled P{p}xG{g}-k{k}u{u}; [] = on-policy only
    staleness: list[int] = field(default_factory=lambda: [0])
    updates_per_batch: list[int] = field(default_factory=list)  # [] = algorithm.mini_batches
    # "auto": instead of the two lists, k in {0, 1, 2, 4} x u in {1, 2, 4} (multiples of mini_batches),
    # run only where the pipeline model says a (k, u) could beat the simpler ones (measure/async_sweep.py)
    async_sweep: str = ""
    # refinement: batches between grid points where B_opt (pretrain_refine.py) / RL crossing sits
    refine: bool = True  # false = only name them (pre-training)
    refine_max_batches: int = 8  # pre-training: also seeds at up to 2x this many batches beside B_opt
    refine_seeds: int = 0  # ... this many seeds in all there (<= len(budget.seeds) = off)
    refine_rl: bool = False  # RL: off by default (docs/analysis-sample-efficiency.md, refinement)
    refine_rl_max_candidates: int = 4


@dataclass(frozen=True)
class BranchConfig:
    """Branched probes: a trunk at the reference batch (first seed of budget.seeds) saves checkpoints;
    from each, every main candidate runs a window at its scaled LR, once per seed (the reference's
    own branch is the control the others are compared with)."""

    # samples the trunk trains before the last checkpoint: set it for your run (a few % of it); the
    # defaults are the setting measured on tiny-grpo, tiny-ppo and the NQM (docs/branched.md)
    trunk_samples: int = 2048
    checkpoints: list[float] = field(default_factory=lambda: [0.5, 1.0])  # fractions of trunk_samples
    window_samples: int = 1024  # each branch is compared with the control over this many samples
    max_window_factor: float = 2.0  # a branch still behind the control after this x window is censored
    # a branch's window is at least this many of its own optimiser steps (W_B = max(W, min_steps * B)):
    # one or two steps cannot show a large batch's instability or noise floor
    min_steps: int = 4
    # a batch is adopted (the search climbs past it) only once it keeps up on this many seeds: one
    # with fewer budget.seeds is branched at the next seed too (and that seed's control), until it
    # falls behind or has this many. Wrongly adopting a batch past the critical one costs far more
    # time than wrongly stopping below it, so only adoptions are confirmed. 3, not 2: on the NQM two
    # seeds adopted 512 (past the critical batch) on 2 of 8 trunks, three on none
    # (benchmarks/out/branched_run_length.txt)
    confirm_seeds: int = 3
    # ... and only once the one-sided upper confidence bound (target.confidence, t over seeds) of its
    # mean log ratio is within 1+tol too: a batch whose seeds disagree (at the edge of stability one
    # seed keeps up, the next never reaches the level) gets another seed, up to this many, and is not
    # adopted if still undecided then
    max_seeds: int = 4
    # opt-in, not the default: a batch whose mean ratio is past 1+tol (but within (1+tol)^2, and
    # no seed censored) is rejected only on confirm_seeds seeds, not on the first (the ranking can
    # still pick a rejected batch on throughput). Measured on the NQM: 84 of 96 one-checkpoint
    # probes at regret <= 1.05 (80 without), but 7 of 8 on the one-seed run-length study (8 without)
    # and a higher cost (docs/branched.md, "Confirming rejections")
    confirm_rejections: bool = False
    # which candidates branch at a checkpoint: bisect = a binary search over the main candidates for the
    # last within 1+tol (from the previous checkpoint's answer, one step up if it holds, else down); all
    search: str = "bisect"
    # true: auto sizes trunk/windows to the run, these the least; off: measured no better (branched.md)
    size_to_run: bool = False
    offpolicy_read: str = "window"  # k >= 1 branches: over the window, or "target" (docs/async.md)


@dataclass(frozen=True)
class NQMConfig:
    """Noisy quadratic model (Zhang et al. 2019): a simulation, used for tests and demos."""

    dim: int = 1000
    curvature_power: float = 1.0  # h_i = 1 / i**p
    noise_scale: float = 1.0  # per-sample gradient covariance = noise_scale * diag(h)
    init_scale: float = 1.0
    gen_t0_s: float = 0.02  # simulated decode step time at concurrency 0
    gen_t1_s: float = 0.0005  # simulated extra time per concurrent sequence
    train_t0_s: float = 0.05
    train_t1_s: float = 0.001
    gen_max_concurrency: int = 0  # simulated KV-cache cap: generate() raises OutOfMemory above it; 0 = none


@dataclass(frozen=True)
class PretrainConfig:
    """Pre-training probe (backend.training = "pretrain"): a tiny Llama trained from scratch on a
    grid of token batches, then B_opt and B_min per target loss (docs/pretraining.md)."""

    size: str = "xs"  # xs | s | m: tiny Llamas built in code (backends/pretrain_lm.py lists them)
    seq_len: int = 32  # tokens per sequence; batches are whole sequences
    batches_tokens: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    max_tokens: int = 1_000_000  # budget per run (samples = tokens for pre-training)
    targets: list[float] = field(default_factory=list)  # target eval losses, nats/token
    eval_every_tokens: int = 16384  # eval loss logged every this many trained tokens
    eval_sequences: int = 64  # held-out sequences (fixed per data seed)
    data: str = "markov"  # markov (synthetic, exact entropy rate) | files (local text/JSONL)
    files: list[str] = field(default_factory=list)  # .txt / .jsonl paths for data = "files"
    text_key: str = "text"  # JSONL field holding the text
    markov_vocab: int = 64  # V tokens
    markov_order: int = 1  # k: the next token depends on the k previous ones
    markov_branching: int = 8  # nonzero next tokens per context (sparsity)
    markov_concentration: float = 0.5  # Dirichlet concentration of each context's row
    data_seed: int = 0  # the language (Markov tables); runs' seeds draw the stream from it
    schedule: str = "wsd"  # wsd | cosine | constant
    warmup_tokens: int = 16384  # linear warmup in tokens, the same at every batch
    decay_fraction: float = 0.0  # WSD: last fraction of max_tokens decays to 0; 0 = stable only
    micro_batch_tokens: int = 0  # gradient accumulation: tokens per forward/backward; 0 = whole batch


@dataclass(frozen=True)
class Recipe:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lr_scaling: LRScalingConfig = field(default_factory=LRScalingConfig)
    candidates: CandidatesConfig = field(default_factory=CandidatesConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    nqm: NQMConfig = field(default_factory=NQMConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    branch: BranchConfig = field(default_factory=BranchConfig)
    source: str = ""  # the file it came from; set by the loader
    probe_choice: str = ""  # why probe.mode = "auto" resolved as it did (measure/probe_size.resolved)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in LOADER_FIELDS:
            data.pop(name)
        return data

    @property
    def study(self) -> StudyKind:
        """The study kind this recipe names (batchtune.recipe.study)."""
        return study_of(self)

    @property
    def sample_unit(self) -> str:
        """What a sample (and a batch) counts: "tokens" for pre-training, else "samples" (responses)."""
        return self.study.sample_unit

    def with_results_dir(self, results_dir: str | os.PathLike[str] | None) -> Recipe:
        """This recipe writing to ``results_dir`` (``run.results_dir``, the results directory's one
        home); None or "" keeps the recipe's own."""
        if not results_dir:
            return self
        return dataclasses.replace(self, run=dataclasses.replace(self.run, results_dir=str(results_dir)))


LOADER_FIELDS = ("source", "probe_choice")  # set by the loader, never read from a recipe file

# LR scaling rules (Malladi et al. 2022 sqrt for Adam; Goyal et al. 2017 linear for SGD; none = a control)
LR_RULES = ("sqrt", "linear", "none", "table")

CHOICES: dict[str, tuple[str, ...]] = {
    "run.executor": ("local", "ray"),
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "algorithm.name": ("grpo", "ppo"),
    "algorithm.mode": ("sync", "async"),
    "algorithm.critic_lr_rule": ("", *LR_RULES[:3]),
    "optimizer.name": ("adamw", "adam", "sgd"),
    "lr_scaling.rule": LR_RULES,
    "generation.backend": ("transformers", "vllm", "simulated"),
    "hardware.device": ("auto", "cpu", "cuda"),
    "backend.training": ("torch", "nqm", "command", "trl", "pretrain"),
    "pretrain.size": ("xs", "s", "m"),
    "pretrain.data": ("markov", "files"),
    "pretrain.schedule": ("wsd", "cosine", "constant"),
    "probe.mode": ("auto", "grid", "branched"),
    "probe.async_sweep": ("", "auto"),
    "branch.search": ("bisect", "all"), "branch.offpolicy_read": ("window", "target"),
    "backend.command_log_format": ("jsonl", "csv", "verl", "trl", "tensorboard", "wandb"),
    "backend.resume_steps": ("continue", "restart"),
}
