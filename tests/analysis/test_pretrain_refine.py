"""Which batches to add where B_opt sits between grid points (analysis/pretrain/refine.py)."""

from __future__ import annotations

from batchtune.analysis.pretrain.refine import batches_to_add, refine_note


def test_a_doubling_grid_gets_the_half_steps_beside_the_minimum() -> None:
    assert batches_to_add([256, 512, 1024, 2048], 1024) == (724, 1448)  # 2^(1/2) steps
    assert batches_to_add([256, 512, 1024, 2048], 1024, seq_len=32) == (736, 1440)  # whole sequences


def test_then_quarter_steps_and_then_nothing() -> None:
    half = [512, 724, 1024, 1448, 2048]
    assert batches_to_add(half, 1024) == (861, 1218)  # 2^(1/4) steps
    quarter = sorted([*half, 861, 1218])
    assert batches_to_add(quarter, 1024) == ()


def test_a_minimum_at_the_grid_end_refines_inwards_only_and_none_says_nothing() -> None:
    assert batches_to_add([256, 512, 1024], 256) == (362,)
    assert batches_to_add([256, 512], None) == ()
    assert refine_note([256, 512], None) is None
    note = refine_note([256, 512, 1024], 512)
    assert note is not None and "362, 724" in note


def test_pretrain_on_logs_of_a_doubling_grid_says_which_batches_to_add(tmp_path) -> None:
    import numpy as np
    from typer.testing import CliRunner

    from batchtune.analysis.pretrain.synth import SynthLaw, synth_curves
    from batchtune.cli import app

    rows = ["run,batch_tokens,step,loss,seed"]
    for b, seed, tokens, loss in synth_curves(
        SynthLaw(), 256.0 * 2.0 ** np.arange(7), (0, 1), max_tokens=2e8
    ):
        rows += [
            f"B{b:.0f}-s{seed},{b},{t / b:.0f},{v:.6f},{seed}" for t, v in zip(tokens, loss, strict=True)
        ]
    log = tmp_path / "runs.csv"
    log.write_text("\n".join(rows) + "\n")
    out = CliRunner().invoke(app, ["pretrain", str(log), "--targets", "2.9"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "B_opt lies between grid points: add batches" in out.output
