"""`batchtune pretrain` on loss logs generated from a known law (analysis/pretrain/synth.SynthLaw):
B_opt and B_min recovered per target through the grid estimators, seeds paired, schedule emitted."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from batchtune.analysis.pretrain.synth import SynthLaw, synth_curves
from batchtune.cli import app

LAW = SynthLaw()
BATCHES = 256.0 * np.sqrt(2.0) ** np.arange(13)  # 256 .. 16384 tokens
TARGETS = (2.9, 2.65)


def _write(path, seeds=(0, 1, 2), seed_column=True, noise=0.0):
    rows = ["run,batch_tokens,step,loss" + (",seed" if seed_column else "")]
    for b, seed, tokens, loss in synth_curves(LAW, BATCHES, seeds, max_tokens=2e8, noise_rel=noise):
        for t, v in zip(tokens, loss, strict=True):
            rows.append(f"B{b:.0f}-s{seed},{b},{t / b:.0f},{v:.6f}" + (f",{seed}" if seed_column else ""))
    path.write_text("\n".join(rows) + "\n")


def test_recovers_b_opt_and_b_min_per_target(tmp_path):
    log = tmp_path / "runs.csv"
    _write(log)
    targets = ",".join(map(str, TARGETS))
    out = CliRunner().invoke(app, ["pretrain", str(log), "--targets", targets, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)["analysis"]
    est = {e["target_loss"]: e for e in data["grid"]["estimates"]}
    for loss in TARGETS:
        e = est[loss]
        assert e["b_opt_tokens"] == pytest.approx(LAW.b_opt(loss), rel=0.10)
        lo, hi = e["b_min_bracket"]
        assert (lo or 0.0) <= LAW.b_min(loss) <= hi
        assert e["n_seeds"] == 3
    # B_opt rises as the target falls, and the schedule follows it with a rising LR
    assert est[2.65]["b_opt_tokens"] > est[2.9]["b_opt_tokens"]
    sched = data["grid"]["schedule"]
    assert len(sched) == 2 and sched[1]["batch_tokens"] > sched[0]["batch_tokens"]
    assert sched[1]["lr"] > sched[0]["lr"]


def test_seeds_paired_by_name_without_a_seed_column_and_tables(tmp_path):
    log = tmp_path / "runs.csv"
    _write(log, seeds=(0, 1), seed_column=False, noise=0.005)
    out = CliRunner().invoke(app, ["pretrain", str(log), "--targets", "2.9"], env={"COLUMNS": "160"})
    assert out.exit_code == 0, out.output
    assert "B_opt and B_min per target loss" in out.output and "Token-keyed schedule" in out.output
    bad = tmp_path / "bad.csv"
    bad.write_text("run,batch_tokens,step,loss\na,1e5,1,x\n")
    out = CliRunner().invoke(app, ["pretrain", str(bad)])
    assert out.exit_code == 2 and "bad.csv:2" in out.output


def test_emit_flags_from_the_command(tmp_path):
    log = tmp_path / "runs.csv"
    _write(log, seeds=(0,))
    base = ["pretrain", str(log), "--targets", "2.9,2.65", "--seq-len", "128", "--gpus", "2"]
    out = CliRunner().invoke(app, [*base, "--emit", "megatron"])
    assert out.exit_code == 2 and "--total-tokens" in out.output
    out = CliRunner().invoke(app, [*base, "--emit", "megatron", "--total-tokens", "1000000000"])
    assert out.exit_code == 0, out.output
    assert "--step-batch-size-schedule" in out.output and "--seq-length 128" in out.output
    assert "--override-opt_param-scheduler" in out.output


def test_no_batch_reaching_any_target_shows_the_table_and_exits_3(tmp_path):
    """docs/pretraining.md: `pretrain` exits 3 when no batch reaches any target (it exited 0)."""
    log = tmp_path / "runs.csv"
    _write(log, seeds=(0,))
    out = CliRunner().invoke(app, ["pretrain", str(log), "--targets", "0.5"])
    assert out.exit_code == 3, out.output
    assert "no batch reached this target" in out.stdout  # the table is still shown
    assert "no batch reached any target loss (0.5)" in out.stderr
    out = CliRunner().invoke(app, ["pretrain", str(log), "--targets", "0.5", "--json"])
    assert out.exit_code == 3 and json.loads(out.stdout)["analysis"]["grid"]["schedule"] == []
    base = ["pretrain", str(log), "--emit", "megatron", "--total-tokens", "1000000000"]
    out = CliRunner().invoke(app, [*base, "--targets", "0.5"])
    assert out.exit_code == 3 and "--step-batch-size-schedule" not in out.stdout
    out = CliRunner().invoke(app, [*base, "--targets", "2.9,0.5"])  # one target reached: a schedule
    assert out.exit_code == 0, out.output
    assert "--step-batch-size-schedule" in out.stdout


def test_a_diverged_run_is_data_and_repeated_steps_or_seeds_are_refused(tmp_path):
    """A loss of inf or nan refused the whole file ("out of range"); a run name with two seeds
    merged them into one curve, and a step logged twice was read as two points."""
    log = tmp_path / "runs.csv"
    _write(log, seeds=(0, 1))
    lines = log.read_text().splitlines()
    big = f"B{BATCHES[-1]:.0f}-s0,"
    at = [i for i, ln in enumerate(lines) if ln.startswith(big)]
    cut = at[len(at) // 3]
    step = lines[cut].split(",")[2]

    def inf_loss(ln: str) -> str:
        run, b, st, _, seed = ln.split(",")
        return ",".join([run, b, st, "inf", seed])

    diverged = [*lines[:cut], *(inf_loss(ln) if ln.startswith(big) else ln for ln in lines[cut:])]
    log.write_text("\n".join(diverged) + "\n")
    out = CliRunner().invoke(app, ["pretrain", str(log), "--targets", "2.9", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)["analysis"]
    assert any(f"run {big[:-1]} diverged at step {step}" in n for n in data["notes"]), data["notes"]
    twice = tmp_path / "twice.csv"
    twice.write_text("\n".join([*lines, lines[1]]) + "\n")
    out = CliRunner().invoke(app, ["pretrain", str(twice)])
    assert out.exit_code == 2 and "logs step" in out.output and "twice" in out.output
    seeds = tmp_path / "seeds.csv"
    seeds.write_text(
        "\n".join([*lines[:3], lines[3].replace("-s0,", "-s0,").rsplit(",", 1)[0] + ",7"]) + "\n"
    )
    out = CliRunner().invoke(app, ["pretrain", str(seeds)])
    assert out.exit_code == 2 and "has seeds 0 and 7" in out.output, out.output


def test_pretrain_is_one_workflow_call(tmp_path):
    """workflow.pretrain.pretrain analyses the logs and emits the schedule in one call; a target no
    batch reaches gives its reason and no schedule, whatever --emit asked."""
    from batchtune.workflow.pretrain import PretrainOutcome, ScheduleEmit, pretrain

    log = tmp_path / "runs.csv"
    _write(log, seeds=(0, 1))
    emit = ScheduleEmit("megatron", total_tokens=10**9)
    out = pretrain([log], "2.9", None, None, [], emit=emit)
    assert isinstance(out, PretrainOutcome) and out.unreached is None
    assert out.emitted is not None and "--global-batch-size" in out.emitted
    none = pretrain([log], "0.5", None, None, [], emit=emit)
    assert none.unreached is not None and none.emitted is None


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--targets", "-1"], "--targets"),
        (["--base-lr", "-1"], "--base-lr"),
        (["--rule", "foo"], "--rule"),
        (["--emit", "bogus", "--total-tokens", "1000000"], "--emit 'bogus'"),
        (["--emit", "megatron", "--total-tokens", "-5"], "--total-tokens"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(tmp_path, args, named):
    log = tmp_path / "runs.csv"
    log.write_text("run,batch_tokens,step,loss\nB1,1,1,3.0\n")  # never read: the flags are checked first
    out = CliRunner().invoke(app, ["pretrain", str(log), *args])
    assert out.exit_code == 2, out.output
    assert named in out.output and "Traceback" not in out.output


def test_a_folder_is_not_said_to_be_missing(tmp_path):
    out = CliRunner().invoke(app, ["pretrain", str(tmp_path)])
    assert out.exit_code == 2, out.output
    assert "is a folder: give the CSV or JSONL loss logs in it" in " ".join(out.stderr.split())
