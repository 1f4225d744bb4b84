"""The grid's schedule: LRs by the rule for each stage's own batch, from the LR at a given batch."""

from __future__ import annotations

import math

import pytest

from batchtune.analysis.pretrain.grid import GridCurve, analyse_grid

# tokens to loss 3.0 per batch: fewest at 64, so B_opt sits above the smallest batch
TOKENS_TO_TARGET = {16: 3000.0, 32: 2000.0, 64: 1500.0, 128: 2500.0}


def _curves() -> list[GridCurve]:
    tokens = tuple(100.0 * i for i in range(61))
    return [
        GridCurve(float(b), 0, tokens, tuple(4.0 - t / e for t in tokens))
        for b, e in TOKENS_TO_TARGET.items()
    ]


def test_the_first_stage_runs_at_the_rules_lr_for_its_own_batch():
    lr16 = 1e-3  # the LR the probe ran its smallest batch (16 tokens) at
    grid = analyse_grid(_curves(), [3.0], base_lr=lr16, rule="sqrt", lr_batch=16.0)
    first = grid.schedule[0]
    assert first.batch_tokens > 16
    assert first.lr == pytest.approx(lr16 * math.sqrt(first.batch_tokens / 16))


def test_without_lr_batch_the_base_lr_is_the_first_stages():
    grid = analyse_grid(_curves(), [3.0], base_lr=1e-3, rule="sqrt")
    assert grid.schedule[0].lr == pytest.approx(1e-3)
