"""Generation throughput with Hugging Face transformers: batched ``model.generate`` with a KV cache.

One call decodes ``concurrency`` responses at once (``prompts x group_size``) from synthetic prompts
of ``prompt_tokens`` random token ids (seeded; no tokenizer involved). This is a *synchronous*
batch: ``generate`` returns when its slowest response is done, and finished rows keep being
computed (as padding) until then, exactly the cost a long length tail imposes on a static batch.

Lengths (docs/method.md §4: profile both):

- ``fixed``: EOS is suppressed, every response is exactly ``max_new_tokens`` tokens.
- ``eos`` with ``eos_stop_prob = p > 0``: each response's length is drawn up front as
  ``L = min(Geometric(p), max_new_tokens)`` (support 1, 2, ...; mean ~ 1/p before truncation) from
  the profile seed, and a logits processor makes the model stop exactly there: EOS is masked before
  step ``L`` and forced at step ``L`` (a response truncated at ``max_new_tokens`` gets no EOS, like a
  real truncated response). A random-weights model almost never samples EOS by itself, so this is
  an honest stand-in for a real length distribution, not the model's own behaviour; the same law
  drives the vLLM backend, so the engines see the same lengths.
- ``eos`` with ``p = 0``: the model's own EOS, sampled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from batchtune.backends import timing
from batchtune.backends.models import TINY_NAMES, count_params, load_model, resolve_device, resolve_dtype
from batchtune.backends.spec import GenRequest, GenResult, ModelInfo, OutOfMemory
from batchtune.errors import BackendError
from batchtune.recipe.schema import Recipe


def draw_lengths(
    mode: str, n: int, max_new_tokens: int, eos_stop_prob: float, seed: int
) -> np.ndarray | None:
    """Response lengths for one call (see the module docstring); None = the model's own EOS."""
    if mode == "fixed":
        return np.full(n, max_new_tokens, dtype=np.int64)
    if eos_stop_prob <= 0:
        return None
    rng = np.random.default_rng([seed, n, 0xE05])
    return np.minimum(rng.geometric(eos_stop_prob, size=n), max_new_tokens).astype(np.int64)


def synthetic_prompts(
    n_prompts: int, prompt_tokens: int, vocab_size: int, avoid: set[int], seed: int, low: int = 0
) -> np.ndarray:
    """``(n_prompts, prompt_tokens)`` uniform random token ids in ``[low, vocab)``, none in ``avoid``."""
    rng = np.random.default_rng([seed, n_prompts, prompt_tokens])
    ids = rng.integers(low, vocab_size, size=(n_prompts, prompt_tokens))
    allowed = np.setdiff1d(np.arange(low, vocab_size), np.fromiter(avoid, dtype=np.int64, count=len(avoid)))
    bad = np.isin(ids, list(avoid))
    ids[bad] = rng.choice(allowed, size=int(bad.sum()))
    return ids


class _LengthProcessor:
    """Logits processor (transformers' ``__call__(input_ids, scores)`` protocol): masks EOS until a
    row's drawn length, and forces it at that length when the length is below ``max_new_tokens``."""

    def __init__(self, lengths: np.ndarray, eos_ids: list[int], prompt_len: int, max_new: int, device: Any):
        self.lengths = torch.as_tensor(lengths, device=device)
        self.eos = torch.as_tensor(eos_ids, device=device)
        self.prompt_len = prompt_len
        self.max_new = max_new

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_len  # tokens generated so far
        remaining = self.lengths > step + 1
        force = (self.lengths == step + 1) & (self.lengths < self.max_new)
        scores = scores.clone()
        neg = torch.finfo(scores.dtype).min
        scores[remaining.nonzero(as_tuple=True)[0][:, None], self.eos[None, :]] = neg
        rows = force.nonzero(as_tuple=True)[0]
        if rows.numel():
            scores[rows] = neg
            scores[rows, self.eos[0]] = 0.0
        return scores


def response_lengths(generated: torch.Tensor, eos_ids: list[int]) -> np.ndarray:
    """Tokens per row up to and including the first EOS (all of them when there is none)."""
    gen = generated.cpu().numpy()
    is_eos = np.isin(gen, eos_ids)
    has = is_eos.any(axis=1)
    first = is_eos.argmax(axis=1) + 1
    return np.where(has, first, gen.shape[1])


class TransformersGeneration:
    """GenerationBackend over transformers (CPU or CUDA); see the module docstring."""

    name = "transformers"

    def __init__(self, recipe: Recipe):
        g = recipe.generation
        if recipe.hardware.threads > 0:
            torch.set_num_threads(recipe.hardware.threads)
        self.recipe = recipe
        if g.random_weights and recipe.model.name not in TINY_NAMES:
            self.model, self.device, self.dtype = _random_model(recipe)
            self.low_token = 0
        else:
            lm = load_model(recipe.model, recipe.hardware.device, seed=g.seed)
            self.model, self.device, self.dtype = lm.model, lm.device, lm.dtype
            self.low_token = 3 if lm.is_tiny else 0  # the tiny vocabulary starts with pad, bos, eos
        self.model.eval()
        cfg = self.model.config
        gc = self.model.generation_config
        eos = gc.eos_token_id if gc.eos_token_id is not None else cfg.eos_token_id
        self.eos_ids = (
            [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])] if eos is not None else []
        )
        if not self.eos_ids:
            raise BackendError(f"model {recipe.model.name!r} has no eos_token_id; eos mode needs one")
        self.pad_id = int(gc.pad_token_id if gc.pad_token_id is not None else self.eos_ids[0])
        self.vocab_size = int(cfg.vocab_size)
        self.device_name = timing.device_name(self.device)
        self._optimizer: Any = None
        self._micro = 0

    # ---- GenerationBackend ------------------------------------------------------------------
    def model_info(self) -> ModelInfo:
        cfg = self.model.config.to_dict()
        bytes_per_param = float(torch.finfo(self.dtype).bits // 8)
        shape = timing.model_info_from_config(cfg, self.recipe.model.name, bytes_per_param)
        n = float(count_params(self.model))  # the real count wins; the config gives the active share
        return ModelInfo(
            name=shape.name,
            n_params=n,
            n_active_params=n - (shape.n_params - shape.n_active_params),
            bytes_per_param=bytes_per_param,
            n_layers=shape.n_layers,
            n_kv_heads=shape.n_kv_heads,
            head_dim=shape.head_dim,
        )

    def generate(self, request: GenRequest) -> GenResult:
        g = self.recipe.generation
        group = max(1, request.group_size)
        if request.concurrency % group:
            raise BackendError(f"concurrency {request.concurrency} is not a multiple of group size {group}")
        n_prompts = request.concurrency // group
        avoid = set(self.eos_ids) | {self.pad_id}
        prompts = synthetic_prompts(
            n_prompts, request.prompt_tokens, self.vocab_size, avoid, request.seed, self.low_token
        )
        input_ids = torch.as_tensor(np.repeat(prompts, group, axis=0), device=self.device)
        lengths = draw_lengths(
            request.mode, request.concurrency, request.max_new_tokens, g.eos_stop_prob, request.seed
        )
        processors = []
        if lengths is not None:
            processors.append(
                _LengthProcessor(
                    lengths, self.eos_ids, request.prompt_tokens, request.max_new_tokens, self.device
                )
            )
        sampling: dict[str, Any] = {"do_sample": False}
        if g.temperature > 0:
            sampling = {"do_sample": True, "temperature": g.temperature, "top_p": g.top_p, "top_k": 0}
        from transformers import LogitsProcessorList

        torch.manual_seed(request.seed)
        timing.reset_peak_memory(self.device)
        try:
            with torch.inference_mode(), timing.timed(self.device) as t:
                out = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=request.max_new_tokens,
                    min_new_tokens=0,
                    eos_token_id=self.eos_ids,
                    pad_token_id=self.pad_id,
                    logits_processor=LogitsProcessorList(processors),
                    use_cache=True,
                    **sampling,
                )
        except Exception as exc:  # noqa: BLE001 - OOM becomes data, the rest propagates
            if timing.is_oom(exc):
                timing.release_memory(self.device)
                raise OutOfMemory(
                    f"generation of {request.concurrency} responses x {request.max_new_tokens} tokens "
                    f"ran out of memory: {str(exc).splitlines()[0]}"
                ) from None
            raise
        got = response_lengths(out[:, request.prompt_tokens :], self.eos_ids)
        return GenResult(
            responses=int(out.shape[0]),
            output_tokens=int(got.sum()),
            elapsed_s=t["elapsed_s"],
            peak_mem_bytes=timing.peak_memory_bytes(self.device),
            preemptions=0,  # a static batch never preempts
        )

    def train_step_s(self, batch_responses: int, seq_tokens: int) -> float:
        if self._optimizer is None:
            self._optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6)
        elapsed, used = timing.time_train_step(
            self.model,
            self._optimizer,
            batch_responses,
            seq_tokens,
            self.vocab_size,
            self.device,
            micro_batch=min(self._micro or batch_responses, batch_responses),
            seed=self.recipe.generation.seed,
        )
        if used < batch_responses:  # only an OOM-lowered micro-batch carries over to larger batches
            self._micro = used
        self.model.eval()
        return elapsed

    def close(self) -> None:
        device = self.device
        self._optimizer = None
        self.model = None
        timing.release_memory(device)


def _random_model(recipe: Recipe) -> tuple[Any, torch.device, torch.dtype]:
    """A model of the shape in ``<model.name>/config.json`` with random weights (no weight files)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(recipe.model.name)
    if not (path / "config.json").is_file():
        raise BackendError(
            f"generation.random_weights needs a local model directory with a config.json; "
            f"{recipe.model.name!r} has none"
        )
    device = resolve_device(recipe.hardware.device)
    dtype = resolve_dtype(recipe.model.dtype, device)
    torch.manual_seed(recipe.generation.seed)
    config = AutoConfig.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device), device, dtype
