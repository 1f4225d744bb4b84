"""The pre-training backend: exact loss floor, learning, checkpoint round trip, the CLI grid."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from batchtune.backends.pretrain_data import ByteCorpus, MarkovSource
from batchtune.backends.pretrain_lm import LMRun, lr_factor
from batchtune.cli import app
from batchtune.recipe.load import load_recipe

RECIPE = "recipes/tiny-pretrain.toml"
SMALL = ["pretrain.batches_tokens=[32, 48, 64]", "pretrain.max_tokens=4096", "pretrain.eval_every_tokens=512",
         "budget.seeds=[0]", "pretrain.targets=[3.9, 3.6]", "pretrain.warmup_tokens=256"]  # fmt: skip


def test_markov_entropy_rate_matches_empirical_bigram_entropy():
    src = MarkovSource(32, 1, 4, 0.5, seed=3)
    x = src.sample(np.random.default_rng(0), 20000, 16)
    counts = np.zeros((32, 32))
    np.add.at(counts, (x[:, :-1].ravel(), x[:, 1:].ravel()), 1)
    cond = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    joint = counts / counts.sum()
    empirical = -(joint[counts > 0] * np.log(cond[counts > 0])).sum()
    assert empirical == pytest.approx(src.entropy_rate(), rel=0.01)
    assert src.loss_floor(16) == pytest.approx(src.entropy_rate())
    assert MarkovSource(16, 2, 4, 0.5, 0).loss_floor(16) > MarkovSource(16, 2, 4, 0.5, 0).entropy_rate()


def test_wsd_and_cosine_factors():
    assert lr_factor(50, "wsd", 100, 1000, 0.2) == pytest.approx(0.5)
    assert lr_factor(500, "wsd", 100, 1000, 0.2) == 1.0
    assert lr_factor(900, "wsd", 100, 1000, 0.2) == pytest.approx(0.5)
    assert lr_factor(1000, "cosine", 0, 1000, 0.0) == pytest.approx(0.0)


@pytest.mark.slow  # builds a model: transformers import and init, ~5-60 s on a loaded 2-core box
def test_checkpoint_resume_is_exact(tmp_path):
    recipe = load_recipe(RECIPE, ["pretrain.micro_batch_tokens=16"])  # accumulation on
    a = LMRun(recipe, seed=1)
    for _ in range(3):
        a.step(4, 1e-3)
    ckpt = a.save_checkpoint(tmp_path / "state.pt")
    ref = [a.step(4, 1e-3)[0] for _ in range(3)]
    b = LMRun.resume_from(ckpt, recipe)
    assert (b.steps, b.tokens) == (3, 3 * 4 * 16)
    assert [b.step(4, 1e-3)[0] for _ in range(3)] == pytest.approx(ref, rel=1e-6)
    # a branch at another seed: same weights and counters, its own data stream (a replicate)
    other = LMRun.resume_from(ckpt, recipe, seed=2)
    assert (other.steps, other.tokens, other.seed) == (3, 3 * 4 * 16, 2)
    assert [other.step(4, 1e-3)[0] for _ in range(3)] != pytest.approx(ref, rel=1e-6)


def test_byte_corpus_reads_text_and_jsonl(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 50)
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "more text here " * 20}) + "\n")
    corpus = ByteCorpus([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")], "text")
    x = corpus.sample(np.random.default_rng(0), 4, 8)
    assert x.shape == (4, 8) and x.max() < 256


@pytest.mark.slow
def test_probe_cli_runs_the_grid(tmp_path):
    out = tmp_path / "res"
    args = ["probe", RECIPE, "--results", str(out), "--json"] + sum((["--set", s] for s in SMALL), [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    ests = data["analysis"]["estimates"]
    assert [e["target_loss"] for e in ests] == [3.9, 3.6]
    assert all(len(e["tokens_to_target"]) == 3 for e in ests)
    assert (out / "plots" / "bopt_bmin.png").is_file()
    assert 0 < data["analysis"]["loss_floor"] < 3.0  # the Markov language's exact floor, nats/token
