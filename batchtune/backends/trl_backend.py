"""The ``trl`` training backend: TRL's own ``GRPOTrainer``, in process, one run per candidate.

Needs the ``[trl]`` extra (trl, datasets), imported inside :meth:`TRLBackend.train`. The candidate
maps onto GRPOConfig in TRL's units (checked against trl 1.16): ``generation_batch_size`` = P*G
completions, ``num_generations`` = G, ``per_device_train_batch_size`` = P*G / algorithm.mini_batches
(one process, no accumulation), ``learning_rate`` = the candidate's scaled LR (constant, after a
warmup of ``optimizer.warmup_samples`` converted to steps), ``max_steps`` = the sample budget in steps.

Model, task and evaluation are the torch backend's, so the two backends measure the same thing:
the tiny Llama (``model.name = "tiny-llama"``, built in code) starts from the shared cached warm
start, the tasks and rewards come from ``torch_rl.tasks``, and ``eval_reward`` is the mean reward of
greedy answers on the held-out set (at 0 samples, then every ``task.eval_every_samples``). TRL gets a
real ``PreTrainedTokenizerFast`` built in code with the tiny tokenizer's ids; nothing is downloaded.
Any other model name is loaded with transformers.

Records: ``trainer.train()`` runs in a worker thread; a callback sends TRL's logs (and evaluations)
through a queue, and the generator yields one StepRecord per optimiser step once the next step
shows up or training ends. Closing the generator asks the trainer to stop after the current step
and waits for the thread. gen_s times TRL's ``_generate`` inside training steps, train_s is the rest
of TRL's ``step_time``, other_s the evaluation.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchtune.backends.spec import OutOfMemory, RunFailed, RunSpec
from batchtune.errors import BackendError, BatchtuneError, RecipeError
from batchtune.records.types import StepRecord

BOS_TEXT = "<bos>"  # prefixed to tiny-model prompts: TRL encodes them without special tokens


def char_tokenizer(tiny_tokenizer: Any) -> Any:
    """A ``PreTrainedTokenizerFast`` (tokenizers WordLevel, built in code) with exactly the ids of the
    tiny model's CharTokenizer, so the warm-started weights and the torch backend's evaluation apply.
    ``<bos>`` is a special token, so prompt text starting with it encodes BOS as the warm start saw it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    v = tiny_tokenizer.vocab
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(v)}))  # other characters: errors
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=v[tiny_tokenizer.pad_token_id],
        bos_token=v[tiny_tokenizer.bos_token_id],
        eos_token=v[tiny_tokenizer.eos_token_id],
    )
    tok.padding_side = "left"
    return tok


def _reward_function(task: Any) -> Callable[..., list[float]]:
    """TRL's reward-function signature over the task's ``reward(prompt, response, answer)``."""

    def task_reward(
        prompts: list[Any], completions: list[Any], task_prompt: list[str], answer: list[Any], **_: Any
    ) -> list[float]:
        rows = zip(task_prompt, completions, answer, strict=True)
        return [float(task.reward_fn(p, str(c), a)) for p, c, a in rows]

    return task_reward


@dataclass
class _Pending:
    """One optimiser step's logs, merged until the next step shows up."""

    step: int
    logs: dict[str, float] = field(default_factory=dict)
    gen_s: float = 0.0
    eval_s: float = 0.0


def _numeric(logs: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class TRLBackend:
    """GRPO with ``trl.GRPOTrainer`` in process; see the module docstring."""

    name = "trl"

    @staticmethod
    def metric_ranges(recipe: Any) -> dict[str, tuple[float, float]]:
        """The same tasks and rewards as the torch backend, so the same declared ranges."""
        from batchtune.backends.torch_rl import TorchRLBackend

        return TorchRLBackend.metric_ranges(recipe)

    def train(self, spec: RunSpec) -> Iterator[StepRecord]:
        try:
            import datasets  # noqa: F401
            import trl  # noqa: F401
        except ImportError as exc:
            raise BackendError(f"the trl backend needs {exc.name}: pip install 'batchtune[trl]'") from None
        r, c = spec.recipe, spec.candidate
        if r.algorithm.name != "grpo":
            raise RecipeError("the trl backend runs GRPO only (algorithm.name = 'grpo')")
        mb = r.algorithm.mini_batches
        if c.batch_responses % mb:
            raise RunFailed(
                "failed", f"{c.batch_responses} completions do not split into {mb} optimiser steps"
            )
        per_step = c.batch_responses // mb
        max_steps = max(1, math.ceil(r.budget.max_samples / per_step))
        trainer, evaluate = self._trainer(spec, per_step, max_steps)
        q: queue.Queue = queue.Queue()
        stop = threading.Event()
        self._hook(trainer, q, stop, evaluate, per_step, max_steps, r.task.eval_every_samples)

        def run() -> None:
            try:
                if evaluate is not None:  # the curve's starting point, at 0 samples
                    t0 = time.perf_counter()
                    first = evaluate()
                    q.put(("log", _Pending(0, {"eval_reward": first}, eval_s=time.perf_counter() - t0)))
                trainer.train()
                q.put(("done", None))
            except BaseException as exc:  # handed to the consuming thread
                q.put(("error", exc))

        thread = threading.Thread(target=run, name=f"trl-{spec.run_id}", daemon=True)
        thread.start()
        finished = False
        try:
            pending: _Pending | None = None
            tokens = 0.0
            while True:
                kind, payload = q.get()
                if kind != "log":
                    finished = True
                    if kind == "error":
                        raise _as_run_failed(payload)
                    if pending is not None:
                        yield self._record(spec, pending, per_step, tokens)[0]
                    out = Path(trainer.args.output_dir)
                    out.mkdir(parents=True, exist_ok=True)
                    trainer.state.save_to_json(str(out / "trainer_state.json"))
                    return
                if pending is not None and payload.step > pending.step:
                    record, tokens = self._record(spec, pending, per_step, tokens)
                    pending = None
                    yield record
                if pending is None:
                    pending = payload
                else:
                    pending.logs.update(payload.logs)
                    pending.gen_s += payload.gen_s
                    pending.eval_s += payload.eval_s
        finally:
            stop.set()
            while not finished:  # the trainer stops after its current step; wait for it
                finished = q.get()[0] != "log"
            thread.join()

    # -- pieces ------------------------------------------------------------------------------------
    @staticmethod
    def _trainer(spec: RunSpec, per_step: int, max_steps: int) -> tuple[Any, Callable[[], float] | None]:
        """The GRPOTrainer and a function returning the held-out eval_reward of the current weights
        (None without a held-out set)."""
        import torch
        from datasets import Dataset
        from transformers import PrinterCallback, ProgressCallback
        from trl import GRPOConfig, GRPOTrainer

        from batchtune.backends.torch_rl.trainer import evaluate as greedy_eval
        from batchtune.backends.torch_rl.trainer import setup_run

        r, c = spec.recipe, spec.candidate
        task, lm, compute_dtype = setup_run(spec)
        device = lm.device
        tok = char_tokenizer(lm.tokenizer) if lm.is_tiny else lm.tokenizer
        prefix = BOS_TEXT if lm.is_tiny else ""
        rows = [
            {"prompt": prefix + e.prompt, "task_prompt": e.prompt, "answer": e.answer} for e in task.train
        ]
        on_gpu = device.type == "cuda"
        warmup_steps = math.ceil(r.optimizer.warmup_samples / per_step)
        # the new name where transformers has it (5.x: the old one warns a FutureWarning)
        fields = {f.name for f in dataclasses.fields(GRPOConfig)}
        new = "activation_checkpointing"
        no_checkpointing: dict[str, Any] = {new if new in fields else "gradient_checkpointing": False}
        # TRL reads the model's deprecated alias at every generation (trl/models/utils.py): a warning
        # for TRL to act on, not the user. Idempotent (an identical filter is moved, not added), and
        # set here rather than at import so that a caller's own warnings context cannot drop it
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        args = GRPOConfig(
            output_dir=str(spec.run_dir / "trl"),
            per_device_train_batch_size=per_step,
            gradient_accumulation_steps=1,
            generation_batch_size=c.batch_responses,
            num_generations=c.group_size,
            num_iterations=1,
            learning_rate=c.lr,
            lr_scheduler_type="constant_with_warmup" if warmup_steps else "constant",
            warmup_steps=float(warmup_steps),
            max_steps=max_steps,
            optim="sgd" if r.optimizer.name == "sgd" else "adamw_torch",
            adam_beta1=r.optimizer.beta1,
            adam_beta2=r.optimizer.beta2,
            adam_epsilon=r.optimizer.eps,
            weight_decay=r.optimizer.weight_decay,
            max_grad_norm=r.optimizer.grad_clip if r.optimizer.grad_clip > 0 else 1e12,  # logged pre-clip
            beta=r.algorithm.kl_coef,
            epsilon=r.algorithm.clip_eps,
            max_completion_length=r.generation.max_new_tokens,
            temperature=r.generation.temperature,
            top_p=r.generation.top_p,
            seed=spec.seed,
            data_seed=spec.seed,
            use_cpu=not on_gpu,
            bf16=on_gpu and compute_dtype == torch.bfloat16,
            fp16=on_gpu and compute_dtype == torch.float16,
            **no_checkpointing,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=lm.model,
            reward_funcs=_reward_function(task),  # type: ignore[arg-type]
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
        )
        for cb in (PrinterCallback, ProgressCallback):  # no prints from the core
            trainer.remove_callback(cb)
        if not task.eval:  # no held-out set: no eval_reward
            return trainer, None
        return trainer, lambda: greedy_eval(lm, task, spec, compute_dtype)

    @staticmethod
    def _hook(
        trainer: Any,
        q: queue.Queue,
        stop: threading.Event,
        evaluate: Callable[[], float] | None,
        per_step: int,
        max_steps: int,
        eval_every_samples: int,
    ) -> None:
        """Callback: TRL logs and due evaluations -> queue; a stop request -> should_training_stop."""
        from transformers import TrainerCallback

        clock = {"in_step": False, "gen_s": 0.0, "last_eval": 0}
        generate = getattr(trainer, "_generate", None)
        if generate is not None:  # time generation inside training steps (an instance attribute only)

            def timed_generate(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return generate(*args, **kwargs)
                finally:
                    if clock["in_step"]:
                        clock["gen_s"] += time.perf_counter() - t0

            trainer._generate = timed_generate

        class Recorder(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock["in_step"] = True

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock["in_step"] = False
                if stop.is_set():
                    control.should_training_stop = True

            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
                logs = dict(logs or {})
                if "train_runtime" in logs:  # the end-of-training summary
                    return
                step = int(state.global_step)
                item = _Pending(step, _numeric(logs))
                item.gen_s, clock["gen_s"] = clock["gen_s"], 0.0
                samples = step * per_step
                every = eval_every_samples
                due = every <= 0 or samples - clock["last_eval"] >= every or step >= max_steps
                if evaluate is not None and due:
                    t0 = time.perf_counter()
                    item.logs["eval_reward"] = evaluate()
                    item.eval_s = time.perf_counter() - t0
                    clock["last_eval"] = samples
                q.put(("log", item))

        trainer.add_callback(Recorder())

    @staticmethod
    def _record(spec: RunSpec, p: _Pending, per_step: int, tokens: float) -> tuple[StepRecord, float]:
        c = spec.candidate
        samples = p.step * per_step
        # TRL logs the mean length on the steps that generate; it covers all P*G completions of that
        # generation, which feeds `mini_batches` optimiser steps
        tokens += p.logs.get("completions/mean_length", 0.0) * c.batch_responses
        step_time = p.logs.get("step_time", 0.0)
        record = spec.step_record(
            p.step,
            samples,
            int(round(tokens)),
            p.logs.get("learning_rate", 0.0 if p.step == 0 else c.lr),
            dict(p.logs),
            grad_norm=p.logs.get("grad_norm"),
            gen_s=p.gen_s,
            train_s=max(0.0, step_time - p.gen_s),
            other_s=p.eval_s,
        )
        return record, tokens


def _as_run_failed(exc: BaseException) -> BaseException:
    """A RunFailed (or the user-facing error it already is) for an exception of the training thread."""
    if isinstance(exc, (RunFailed, BatchtuneError)):
        return exc
    first = str(exc).splitlines()[0] if str(exc) else ""
    text = f"{type(exc).__name__}: {first}"
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text.lower():
        return OutOfMemory(text)
    return RunFailed("failed", text)
