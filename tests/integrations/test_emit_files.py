"""`--emit TRAINER --out FILE`: files a trainer takes as they are; LRs to 3 significant digits; plain
text (no boxes) when stdout is not a terminal; a caveat for concurrency measured elsewhere."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.integrations.emit import emit
from batchtune.integrations.emit_base import RecommendationInput
from batchtune.integrations.emit_files import hardware_caveat, sig3, trainer_file, write_trainer_file
from batchtune.recipe.load import shipped_recipes

REC = RecommendationInput(prompts=16, group_size=8, lr=5.65685424949238e-4, generation_concurrency=64)
HUNYUAN = str(shipped_recipes()["hunyuan-grpo-measurements"])


def test_sig3():
    assert sig3(0.000565685424949238) == 0.000566 and repr(sig3(1.41421356e-6)) == "1.41e-06"
    assert sig3(0.0) == 0.0 and sig3(float("nan")) != sig3(float("nan"))


@pytest.mark.parametrize("trainer", ["verl", "trl", "openrlhf"])
def test_emitted_lr_has_three_significant_digits(trainer: str):
    out = emit(trainer, REC, 8)
    lrs = [v for k, v in out.values.items() if ("lr" in k and "scheduler" not in k) or "learning_rate" in k]
    assert lrs == [0.000566]
    assert "0.000565685" not in out.text


def test_verl_override_file_is_one_key_value_per_line(tmp_path: Path):
    out = emit("verl", REC, 16, gpus_per_node=8)
    path = write_trainer_file("verl", out.values, out.text, tmp_path / "verl.overrides")
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    parsed = dict(ln.split("=", 1) for ln in lines)
    assert parsed == {k: (repr(v) if isinstance(v, float) else str(v)) for k, v in out.values.items()}
    assert parsed["trainer.nnodes"] == "2" and parsed["data.train_batch_size"] == "16"


def test_trl_yaml_round_trips_and_carries_notes():
    out = emit("trl", REC, 8)
    text = trainer_file("trl", out.values, out.text)
    assert yaml.safe_load(text) == out.values
    assert "# 16 prompts x 8 = 128 completions" in text


@pytest.mark.slow  # imports TRL and transformers (~6 s)
def test_trl_yaml_is_accepted_by_grpoconfig(tmp_path: Path):
    trl = pytest.importorskip("trl")
    out = emit("trl", REC, 8)
    path = write_trainer_file("trl", out.values, out.text, tmp_path / "grpo.yaml")
    cfg = trl.GRPOConfig(**yaml.safe_load(path.read_text()), output_dir=str(tmp_path / "o"), use_cpu=True)
    assert cfg.num_generations == 8 and cfg.learning_rate == pytest.approx(0.000566)
    assert cfg.generation_batch_size == 128


def test_openrlhf_script_is_valid_bash_and_executable(tmp_path: Path):
    out = emit("openrlhf", REC, 8)
    path = write_trainer_file("openrlhf", out.values, out.text, tmp_path / "launch.sh")
    assert path.stat().st_mode & stat.S_IXUSR
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash") and '"$@"' in text and "--rollout.batch_size 16" in text


def test_hardware_caveat_says_off_gpu():
    assert "off-GPU" in hardware_caveat("cpu", 64, ("H200", "H100-SXM"))
    assert "off-GPU" not in hardware_caveat("NVIDIA H100 80GB HBM3", 64, ("H200", "H100-SXM"))


def test_recommend_emit_out_writes_file_and_prints_plain_text(tmp_path: Path):
    path = tmp_path / "grpo.yaml"
    args = ["recommend", "-m", HUNYUAN, "--emit", "trl", "--gpus", "8", "--out", str(path)]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert path.is_file() and yaml.safe_load(path.read_text())["num_generations"] > 0
    assert f"written to {path}" in out.stdout
    config = out.stdout[out.stdout.index("Trainer config:") :]
    assert "│" not in config and "GRPOConfig(" in config  # no rich box around what is pasted


def test_out_without_emit_is_refused(tmp_path: Path):
    out = CliRunner().invoke(app, ["recommend", "-m", HUNYUAN, "--out", str(tmp_path / "x")])
    assert out.exit_code == 2 and "--emit" in out.output
