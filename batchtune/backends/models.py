"""Models and tokenizers for the torch backends: a tiny Llama built from a config in code (no
download), or any transformers causal LM from a local directory or hub name.

Imports torch and transformers: only backends import this module.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
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
    from transformers import LlamaForCausalLM

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
    tok, model = _from_pretrained(cfg.name, dtype)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return LoadedModel(model.to(dev), tok, dev, dtype, cfg.name, False)


HUB_TIMEOUT_S = 5.0  # how long the hub may take to answer before a hub name is called unreachable


def _hub_unreachable(name: str, timeout_s: float = HUB_TIMEOUT_S) -> str:
    """Why the hub cannot serve ``name`` now ("" when it answered, an HTTP error included): one HEAD
    request, bounded in a daemon thread so that a hanging DNS lookup or a silent server cannot stall."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    why: list[str] = [f"{endpoint} did not answer within {timeout_s:g} s"]

    def probe() -> None:
        try:
            req = urllib.request.Request(f"{endpoint}/api/models/{name}", method="HEAD")
            with urllib.request.urlopen(req, timeout=timeout_s):  # noqa: S310 - the user's endpoint
                why[0] = ""
        except urllib.error.HTTPError:
            why[0] = ""  # it answered: from_pretrained words a missing or gated model itself
        except (OSError, ValueError) as exc:
            why[0] = f"{endpoint} cannot be reached ({getattr(exc, 'reason', exc)})"

    thread = threading.Thread(target=probe, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    return why[0]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _from_pretrained(name: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """A local directory, else the hub cache, else the hub once it answers within seconds: without
    network a hub name fails at once naming the model and HF_HUB_OFFLINE, instead of hanging."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load(**kw: Any) -> tuple[Any, Any]:
        return (
            AutoTokenizer.from_pretrained(name, **kw),
            AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **kw),
        )

    def failed(exc: BaseException) -> BackendError:
        return BackendError(
            f"cannot load model {name!r}: {str(exc).splitlines()[0] if str(exc) else exc!r} "
            "(give a local model directory, or a hub name with network access)"
        )

    if Path(name).expanduser().is_dir():
        try:
            return load()
        except (OSError, ValueError) as exc:
            raise failed(exc) from None
    if name.startswith(("/", ".", "~")):
        raise BackendError(
            f"model {name!r}: no such directory (model.name is a local directory or a hub name)"
        )
    try:
        return load(local_files_only=True)  # the hub cache first: no network needed
    except (OSError, ValueError) as exc:
        if _offline():
            raise BackendError(
                f"model {name!r} is not in the local hub cache and HF_HUB_OFFLINE is set: download it "
                f"where there is network (hf download {name}) or give a local model directory"
            ) from None
        cached_error = exc
    why = _hub_unreachable(name)
    if why:
        raise BackendError(
            f"model {name!r} is neither a local directory nor in the hub cache, and {why}: download it "
            f"where there is network (hf download {name}), give a local model directory, or set "
            "HF_HUB_OFFLINE=1 to fail at once"
        ) from None
    try:
        return load()
    except (OSError, ValueError) as exc:
        raise failed(exc if str(exc) else cached_error) from None


def count_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
