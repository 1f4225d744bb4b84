"""Rollouts and log-probabilities: the parts of RL that touch the language model directly.

Prompts are left-padded so that every response starts at the same column; the response mask keeps
each response's tokens up to and including its first EOS (pads after EOS are masked out).
Sampling uses ``model.generate`` (KV cache) with an explicit GenerationConfig, so a pretrained
model's own generation defaults (top_k, repetition penalty, ...) never leak into the rollouts:
on-policy RL needs samples from the very distribution whose log-probs it trains on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from batchtune.backends.models import LoadedModel
from batchtune.backends.spec import RunFailed


@dataclass
class Rollout:
    """A batch of responses to left-padded prompts. Shapes: [N, prompt_len + T] and [N, T]."""

    sequences: torch.Tensor  # prompt (left-padded) + response token ids
    attention_mask: torch.Tensor  # 1 on real prompt tokens and on every response column
    position_ids: torch.Tensor
    prompt_len: int
    response_mask: torch.Tensor  # float, 1 on response tokens up to and including the first EOS
    texts: list[str]  # decoded responses

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    def select(self, index: torch.Tensor) -> Rollout:
        return Rollout(
            self.sequences[index],
            self.attention_mask[index],
            self.position_ids[index],
            self.prompt_len,
            self.response_mask[index],
            [self.texts[i] for i in index.tolist()],
        )


def autocast(lm: LoadedModel, compute_dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision: float32 master weights, matmuls in ``compute_dtype`` (bf16 on GPU)."""
    if compute_dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=lm.device.type, dtype=compute_dtype)


def encode_prompts(lm: LoadedModel, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and attention mask on the model's device."""
    rows = [lm.encode(p) for p in prompts]
    width = max(len(r) for r in rows)
    pad = lm.tokenizer.pad_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids.to(lm.device), mask.to(lm.device)


def response_mask(response: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after it."""
    is_eos = (response == eos_id).long()
    before = is_eos.cumsum(-1) - is_eos  # EOS tokens strictly before each position
    return (before == 0).float()


def _generation_config(lm: LoadedModel, max_new_tokens: int, sample: bool, temperature: float, top_p: float):
    from transformers import GenerationConfig

    tok = lm.tokenizer
    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
        "do_sample": sample,
    }
    if sample:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
    return GenerationConfig(**kwargs)


def _nonfinite_error(exc: RuntimeError) -> bool:
    """torch.multinomial's complaint about NaN/inf probabilities (weights blown up by the update)."""
    return "probability tensor contains" in str(exc)


@torch.no_grad()
def generate(
    lm: LoadedModel,
    prompts: list[str],
    max_new_tokens: int,
    compute_dtype: torch.dtype,
    sample: bool,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> Rollout:
    """Sample (or greedily decode) one response per prompt; repeat prompts for groups."""
    ids, mask = encode_prompts(lm, prompts)
    config = _generation_config(lm, max_new_tokens, sample, temperature, top_p)
    try:
        with autocast(lm, compute_dtype):
            seqs = lm.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    except RuntimeError as exc:
        if _nonfinite_error(exc) and not isinstance(exc, torch.cuda.OutOfMemoryError):
            raise RunFailed("diverged", f"generation hit non-finite probabilities: {exc}") from None
        raise
    prompt_len = ids.shape[1]
    response = seqs[:, prompt_len:]
    rmask = response_mask(response, lm.tokenizer.eos_token_id)
    full_mask = torch.cat([mask, torch.ones_like(response)], 1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    texts = [
        lm.decode(row[: int(n)]) for row, n in zip(response.tolist(), rmask.sum(-1).tolist(), strict=True)
    ]
    return Rollout(seqs, full_mask, positions, prompt_len, rmask, texts)


def _forward(model: Any, rollout: Rollout, compute_dtype: torch.dtype, device_type: str) -> Any:
    """One forward pass over the rollout's sequences, without a KV cache, under autocast unless the
    compute dtype is float32."""
    ctx = (
        contextlib.nullcontext()
        if compute_dtype == torch.float32
        else torch.autocast(device_type=device_type, dtype=compute_dtype)
    )
    with ctx:
        return model(
            input_ids=rollout.sequences,
            attention_mask=rollout.attention_mask,
            position_ids=rollout.position_ids,
            use_cache=False,
        )


def token_logprobs(
    model: Any, rollout: Rollout, compute_dtype: torch.dtype, device_type: str, temperature: float
) -> torch.Tensor:
    """log pi(y_t | x, y_<t) of every response token, [N, T], in float32 (with grad if enabled).

    Logits are divided by the sampling temperature, so the log-probs are those of the
    distribution the responses were actually drawn from.
    """
    out = _forward(model, rollout, compute_dtype, device_type)
    p = rollout.prompt_len
    logits = out.logits[:, p - 1 : -1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = rollout.sequences[:, p:]
    return torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def hidden_states(body: Any, rollout: Rollout, compute_dtype: torch.dtype, device_type: str) -> torch.Tensor:
    """Last hidden states at the positions that predict each response token, [N, T, H], float32."""
    out = _forward(body, rollout, compute_dtype, device_type)
    p = rollout.prompt_len
    return out.last_hidden_state[:, p - 1 : -1].float()


def chunks(n: int, size: int) -> Iterator[torch.Tensor]:
    """Index tensors splitting range(n) into consecutive chunks of at most ``size`` (all when 0)."""
    size = n if size <= 0 else size
    for start in range(0, n, size):
        yield torch.arange(start, min(n, start + size))


@torch.no_grad()
def micro_batched(fn: Callable[[Rollout], torch.Tensor], rollout: Rollout, micro: int) -> torch.Tensor:
    """``fn`` of the rollout's responses without grad, ``micro`` at a time (all when 0), concatenated
    along the responses (frozen log-probs and values: the behaviour policy's, the reference's)."""
    return torch.cat([fn(rollout.select(i)) for i in chunks(len(rollout.texts), micro)])


def micro_batches(
    rollout: Rollout, mini_batch: torch.Tensor, micro: int
) -> Iterator[tuple[torch.Tensor, Rollout, torch.Tensor]]:
    """A mini-batch's micro-batches (gradient accumulation), ``micro`` responses at a time (all when
    0): each as its response indices, its responses and their response mask."""
    for part in chunks(len(mini_batch), micro):
        idx = mini_batch[part]
        yield idx, rollout.select(idx), rollout.response_mask[idx]
