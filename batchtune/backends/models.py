"""Models and tokenizers for the torch backends: a tiny Llama built from a config in code (no
download), or any transformers causal LM from a local directory or hub name.

Imports torch and transformers: only backends import this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from batchtune.errors import BackendError
from batchtune.recipe.schema import ModelConfig

TINY_NAMES = ("tiny-llama",)

# Character vocabulary of the built-in tasks: digits, lower-case letters, operators and separators.
_CHARS = list("0123456789abcdefghijklmnopqrstuvwxyz+-*=:,;|()[]<>? ")
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


class CharTokenizer:
    """A character-level tokenizer for the tiny model and built-in tasks (no files, no download).

    Offers the small part of the transformers tokenizer interface the backends use.
    """

    def __init__(self) -> None:
        self.vocab = [PAD, BOS, EOS, *_CHARS]
        self._index = {tok: i for i, tok in enumerate(self.vocab)}
        self.pad_token_id = 0
        self.bos_token_id = 1
        self.eos_token_id = 2
        self.padding_side = "left"

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        unknown = sorted({c for c in text if c not in self._index})
        if unknown:
            raise BackendError(f"the tiny tokenizer has no character(s) {unknown!r}; use a real model")
        ids = [self._index[c] for c in text]
        return [self.bos_token_id, *ids] if add_bos else ids

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_token_id and skip_special_tokens:
                break
            if i < 3 and skip_special_tokens:
                continue
            out.append(self.vocab[i])
        return "".join(out)

    def batch_decode(self, rows: Any, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(r, skip_special_tokens) for r in rows]


@dataclass
class LoadedModel:
    model: Any  # a transformers PreTrainedModel
    tokenizer: Any  # CharTokenizer or a transformers tokenizer
    device: torch.device
    dtype: torch.dtype
    name: str
    is_tiny: bool

    def encode(self, text: str) -> list[int]:
        if self.is_tiny:
            return self.tokenizer.encode(text)
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def decode(self, ids: Any) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendError("hardware.device = 'cuda' but no CUDA GPU is visible; use 'cpu' or 'auto'")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def tiny_llama_config(cfg: ModelConfig, vocab_size: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )


def load_model(cfg: ModelConfig, device: str = "auto", seed: int = 0) -> LoadedModel:
    """Build the tiny Llama (random init from ``seed``) or load a pretrained causal LM."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    dev = resolve_device(device)
    dtype = resolve_dtype(cfg.dtype, dev)
    if cfg.name in TINY_NAMES:
        tok = CharTokenizer()
        torch.manual_seed(seed)
        model = LlamaForCausalLM(tiny_llama_config(cfg, tok.vocab_size))
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.bos_token_id = tok.bos_token_id
        return LoadedModel(model.to(dev, dtype), tok, dev, dtype, cfg.name, True)  # type: ignore[arg-type]
    try:
        tok = AutoTokenizer.from_pretrained(cfg.name)  # type: ignore[assignment]
        model = AutoModelForCausalLM.from_pretrained(cfg.name, dtype=dtype)  # type: ignore[assignment]
    except (OSError, ValueError) as exc:
        raise BackendError(
            f"cannot load model {cfg.name!r}: {str(exc).splitlines()[0]} "
            "(give a local model directory, or a hub name with network access)"
        ) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return LoadedModel(model.to(dev), tok, dev, dtype, cfg.name, False)  # type: ignore[arg-type]


def count_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
