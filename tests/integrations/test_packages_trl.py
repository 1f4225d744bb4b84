"""TRL and transformers build their configs from every setting batchtune emits for them (marker
``trainers``; .ci/trainers.sh, and the project's own environment, which has trl).

TRL: ``GRPOConfig(**values)``, the printed ``GRPOConfig(...)`` call, the YAML file and the
``trl grpo`` flags (through transformers' HfArgumentParser, which refuses an unknown flag) must give
the same config; a schedule stage's resume settings (max_steps, ignore_data_skip) are fields too.
Pre-training: each ``TrainingArguments(...)`` line of the HF schedule builds.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from batchtune.analysis.pretrain.schedule import ScheduleStage
from batchtune.integrations.emit_pretrain import emit_pretrain
from tests.integrations.packages_cases import EXAMPLES, Emitted, all_emitted

pytestmark = [pytest.mark.trainers, pytest.mark.slow]  # builds ~40 configs (about 20 s)
trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

FIXED = {"use_cpu": True, "report_to": "none"}  # the run's own settings, not batchtune's


def _call_kwargs(text: str, name: str) -> list[dict]:
    """The keyword arguments of each ``name(...)`` call in ``text`` (``...`` placeholders dropped)."""
    out = []
    for m in re.finditer(rf"^{name}\((.*?)^\)$", text, re.M | re.S):
        body = "\n".join(
            ln.split("#")[0] for ln in m.group(1).splitlines() if ln.split("#")[0].strip() != "..."
        )
        call = ast.parse(f"f({body})", mode="eval").body
        assert isinstance(call, ast.Call)
        out.append({k.arg: ast.literal_eval(k.value) for k in call.keywords})
    return out


def _cli_flags(text: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith("# CLI: trl grpo "))
    return line[len("# CLI: trl grpo ") :].split()


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> list[Emitted]:
    return all_emitted("trl", tmp_path_factory.mktemp("trl"))


def test_grpoconfig_builds_from_every_emitted_config(emitted, tmp_path):
    out = str(tmp_path / "o")
    parser = transformers.HfArgumentParser(trl.GRPOConfig)
    assert len(emitted) >= 10
    for e in emitted:
        if e.text.startswith("# batchtune: TRL GRPOConfig"):  # the YAML file
            values = yaml.safe_load(e.text)
        else:
            (values,) = _call_kwargs(e.text, "GRPOConfig")
            (cli,) = parser.parse_args_into_dataclasses(
                [*_cli_flags(e.text), "--output_dir", out, "--use_cpu", "true"]
            )
            for k, v in values.items():
                assert getattr(cli, k) == v, (e.label, k)
        if e.values is not None:
            assert values == e.values, e.label
        resume = re.search(r"with max_steps=(\d+), ignore_data_skip=True", e.text)
        if "# resume:" in e.text:
            assert resume, e.label
            values = {**values, "max_steps": int(resume.group(1)), "ignore_data_skip": True}
        cfg = trl.GRPOConfig(output_dir=out, **FIXED, **values)  # an unknown key is a TypeError
        for k, v in values.items():
            assert getattr(cfg, k) == v, (e.label, k)
        assert cfg.generation_batch_size % cfg.num_generations == 0


def test_grpoconfig_refuses_what_it_does_not_know(tmp_path):
    with pytest.raises(TypeError):
        trl.GRPOConfig(output_dir=str(tmp_path), num_generationz=8, **FIXED)
    with pytest.raises(ValueError, match="not used by the HfArgumentParser"):  # an unknown flag
        transformers.HfArgumentParser(trl.GRPOConfig).parse_args_into_dataclasses(
            ["--num_generationz", "8", "--output_dir", str(tmp_path), "--use_cpu", "true"]
        )


@pytest.mark.parametrize("name", ["grpo_config.yaml", "grpo_config_big.json"])
def test_shipped_trl_examples_build(name, tmp_path):
    values = yaml.safe_load((EXAMPLES / "trl" / name).read_text())  # JSON is YAML
    trl.GRPOConfig(
        output_dir=str(tmp_path), **FIXED, **{k: v for k, v in values.items() if k != "num_processes"}
    )


def test_training_arguments_build_from_the_hf_pretrain_schedule(tmp_path):
    stages = (ScheduleStage(0.0, 2 * 4096 * 256, 3e-4), ScheduleStage(125e9, 4 * 4096 * 256, 4.243e-4, 0.1))
    text = emit_pretrain("hf", stages, seq_len=4096, total_tokens=250 * 10**9, gpus=8, micro_batch_seqs=4)
    calls = [
        ast.parse(ln, mode="eval").body for ln in text.splitlines() if ln.startswith("TrainingArguments(")
    ]
    assert len(calls) == 2
    for call in calls:
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}  # type: ignore[attr-defined]
        args = transformers.TrainingArguments(output_dir=str(tmp_path), **FIXED, **kwargs)
        assert args.max_steps == kwargs["max_steps"]


def test_emitted_yaml_file_is_the_one_trl_grpo_reads(emitted, tmp_path):
    """``trl grpo --config FILE`` reads YAML through TrlParser: the file's keys are GRPOConfig fields."""
    from trl import TrlParser

    files = [e for e in emitted if e.text.startswith("# batchtune: TRL GRPOConfig")]
    assert files
    for e in files:
        path = Path(tmp_path / f"{e.label}.yaml")
        path.write_text(e.text)
        (cfg,) = TrlParser((trl.GRPOConfig,)).parse_args_and_config(
            ["--config", str(path), "--output_dir", str(tmp_path / "o"), "--use_cpu", "true"]
        )
        assert cfg.num_generations == e.values["num_generations"]  # type: ignore[index]
