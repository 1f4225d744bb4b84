"""Offline data for the pre-training backend: a synthetic Markov language with an exact loss floor,
and the user's own local text or JSONL files through a byte-level tokenizer. numpy only.

A data stream is a numpy Generator: its state is the data position (saved in checkpoints), and runs
with the same seed at different batches read the same sequences in the same order (paired seeds).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from batchtune.errors import BackendError


class MarkovSource:
    """A random sparse Markov source of order ``k`` over ``V`` tokens.

    Every context (the k previous tokens) has ``branching`` possible next tokens, drawn without
    replacement, with probabilities from Dirichlet(``concentration``). Sequences start from the
    stationary distribution of the context chain. The entropy rate is exact:
    ``H = sum_c pi(c) H(P(. | c))`` (Cover and Thomas, Elements of Information Theory, Thm 4.2.4),
    and :meth:`loss_floor` is the Bayes-optimal mean next-token loss over positions 1..seq_len-1,
    where the first k-1 predicted positions see a shorter context (their conditional entropies come
    from the stationary joint of the first tokens).
    """

    def __init__(self, vocab: int, order: int, branching: int, concentration: float, seed: int):
        rng = np.random.default_rng([seed, 7919])
        self.vocab, self.order = vocab, order
        n_ctx = vocab**order
        self.next_tokens = np.stack([rng.choice(vocab, branching, replace=False) for _ in range(n_ctx)])
        self.probs = rng.dirichlet(np.full(branching, concentration), size=n_ctx)
        self.cum = np.cumsum(self.probs, axis=1)
        self.cum[:, -1] = 1.0
        self.stationary = self._stationary()

    def _stationary(self) -> np.ndarray:
        n_ctx = self.vocab**self.order
        ctx = np.arange(n_ctx)
        nxt = (ctx[:, None] * self.vocab + self.next_tokens) % n_ctx  # the context after each token
        pi: np.ndarray = np.full(n_ctx, 1.0 / n_ctx)
        for _ in range(5000):
            new = np.bincount(nxt.ravel(), weights=(pi[:, None] * self.probs).ravel(), minlength=n_ctx)
            new = 0.5 * (new + pi)  # lazy chain: same stationary law, no periodicity
            if np.abs(new - pi).sum() < 1e-13:
                return new
            pi = new
        return pi

    def entropy_rate(self) -> float:
        """nats per token."""
        row_h = -(self.probs * np.log(np.maximum(self.probs, 1e-300))).sum(axis=1)
        return float(self.stationary @ row_h)

    def loss_floor(self, seq_len: int) -> float:
        """Bayes loss per predicted token of a sequence of ``seq_len`` tokens (nats)."""
        joint = self.stationary.reshape((self.vocab,) * self.order)  # stationary law of k-grams
        h = []
        for j in range(1, min(self.order, seq_len - 1) + 1):  # H(X_j | X_0..X_{j-1}) for j < k
            if j < self.order:
                pj1 = joint.sum(axis=tuple(range(j + 1, self.order))).ravel()
                pj = joint.sum(axis=tuple(range(j, self.order))).ravel()
                h.append(_entropy(pj1) - _entropy(pj))
        rate = self.entropy_rate()
        h += [rate] * (seq_len - 1 - len(h))
        return float(np.mean(h))

    def sample(self, rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
        """``n`` sequences of ``seq_len`` tokens (int64), contexts from the stationary law."""
        n_ctx = self.vocab**self.order
        ctx = rng.choice(n_ctx, size=n, p=self.stationary)
        first = np.stack([(ctx // self.vocab**i) % self.vocab for i in reversed(range(self.order))], 1)
        out = np.empty((n, max(seq_len, self.order)), dtype=np.int64)
        out[:, : self.order] = first
        for t in range(self.order, seq_len):
            u = rng.random(n)
            branch = (u[:, None] > self.cum[ctx]).sum(axis=1)
            tok = self.next_tokens[ctx, branch]
            out[:, t] = tok
            ctx = (ctx * self.vocab + tok) % n_ctx
        return out[:, :seq_len]


def _entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


class ByteCorpus:
    """Local .txt or .jsonl files as bytes (vocabulary 256, no download); the last 5% is held out.

    Sequences are windows at uniformly random offsets of the training part.
    """

    vocab = 256

    def __init__(self, files: list[str], text_key: str):
        chunks = []
        for name in files:
            path = Path(name)
            if not path.is_file():
                raise BackendError(f"pretrain.files: {path} not found")
            if path.suffix == ".jsonl":
                for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                    if line.strip():
                        try:
                            chunks.append(str(json.loads(line)[text_key]))
                        except (json.JSONDecodeError, KeyError, TypeError, RecursionError):
                            raise BackendError(f"{path}:{i}: no JSON field {text_key!r}") from None
            else:
                chunks.append(path.read_text(encoding="utf-8", errors="replace"))
        data = np.frombuffer("\n".join(chunks).encode("utf-8"), dtype=np.uint8).astype(np.int64)
        split = int(0.95 * data.size)
        self.train, self.held_out = data[:split], data[split:]

    def sample(self, rng: np.random.Generator, n: int, seq_len: int, held_out: bool = False) -> np.ndarray:
        data = self.held_out if held_out else self.train
        if data.size <= seq_len:
            raise BackendError(f"pretrain.files: {data.size} bytes is too little for seq_len {seq_len}")
        starts = rng.integers(0, data.size - seq_len, size=n)
        return data[starts[:, None] + np.arange(seq_len)]


def make_data(p: Any) -> tuple[Any, int, float | None]:
    """(source, vocab size, loss floor or None) for a recipe's ``pretrain`` section."""
    if p.data == "markov":
        src = MarkovSource(
            p.markov_vocab, p.markov_order, p.markov_branching, p.markov_concentration, p.data_seed
        )
        return src, p.markov_vocab, src.loss_floor(p.seq_len)
    return ByteCorpus(list(p.files), p.text_key), ByteCorpus.vocab, None


def eval_batch(source: Any, p: Any) -> np.ndarray:
    """The fixed held-out sequences of this data seed (shared by every run)."""
    rng = np.random.default_rng([p.data_seed, 104729])
    if isinstance(source, ByteCorpus):
        return source.sample(rng, p.eval_sequences, p.seq_len, held_out=True)
    return source.sample(rng, p.eval_sequences, p.seq_len)


def stream(seed: int, data_seed: int) -> np.random.Generator:
    return np.random.default_rng([data_seed, seed, 31])


def uniform_loss(vocab: int) -> float:
    return math.log(vocab)
