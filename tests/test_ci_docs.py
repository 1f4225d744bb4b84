"""docs/ci.md as written: its ci-test commands run as subprocesses on a copy of the shipped example
layout (examples/ and recipes/nqm.toml), no network; JUnit parses, the step summary has a table, the
pre-commit hook runs; and check's exit codes on every shipped example (in process)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from batchtune.cli import app

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = "examples/ci/evidence/nqm"
EXAMPLES = {
    "verl/ppo_trainer.yaml": 0,
    "verl/train_doubled_n.sh": 1,
    "trl/grpo_config.yaml": 0,  # passes with a warning (concurrency below the knee)
    "trl/grpo_config_big.json": 1,
    "openrlhf/train_ppo_ray.sh": 0,
    "openrlhf/train_ppo_ray_legacy.sh": 1,
}


def blocks(kind: str) -> list[str]:
    text = (ROOT / "docs" / "ci.md").read_text()
    found = re.findall(rf"```bash {kind}\n(.*?)```", text, flags=re.S)
    return [ln for b in found for ln in b.splitlines() if ln.strip()]


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / "recipes").mkdir()
    shutil.copy(ROOT / "recipes" / "nqm.toml", tmp_path / "recipes" / "nqm.toml")
    return tmp_path


def run(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(line)
    assert argv[0] == "batchtune"
    return subprocess.run(
        [sys.executable, "-m", "batchtune", *argv[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow  # four CLI subprocesses, smoke included (~15 s on 2 cores)
def test_doc_commands_run_as_written(layout: Path) -> None:
    summary = layout / "summary.md"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_ACTIONS": "true"}
    passing, failing = blocks("ci-test"), blocks("ci-test-fails")
    assert passing and failing
    for line in passing:
        out = run(line, layout, env)
        assert out.returncode == 0, (line, out.stdout[-2000:], out.stderr[-2000:])
    for line in failing:
        out = run(line, layout, env)
        assert out.returncode == 1, (line, out.stderr[-2000:])
        assert "::error file=examples/ci/verl/train_doubled_n.sh,line=9," in out.stdout  # the LR
    junits = sorted((layout / "reports").glob("*.xml"))
    assert len(junits) == 3
    for j in junits:
        suite = ET.parse(j).getroot().find("testsuite")
        assert suite is not None and int(suite.get("tests")) == 4
    doubled = ET.parse(layout / "reports" / "batchtune-doubled.xml").getroot()
    # 512 responses ties the evidence's pick (256) on time-to-target: only the unscaled LR fails
    assert {c.get("name") for c in doubled.iter("testcase") if c.find("failure") is not None} == {"lr"}
    md = summary.read_text()
    assert md.count("| check | status | configured | expected | why |") == 3
    assert re.search(r"^\| lr \| .*fail", md, flags=re.M)


@pytest.mark.slow  # two CLI subprocesses
def test_pre_commit_hook_entry(layout: Path) -> None:
    hook = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())[0]
    bindir = layout / "bin"
    bindir.mkdir()
    shim = bindir / "batchtune"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m batchtune "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("GITHUB_STEP_SUMMARY", None)
    files = ["examples/ci/openrlhf/train_ppo_ray.sh", "examples/ci/openrlhf/train_ppo_ray_legacy.sh"]
    argv = [*shlex.split(hook["entry"]), "--results", EVIDENCE, *files]
    out = subprocess.run(argv, cwd=layout, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr  # the legacy one did not rescale its LR
    assert all(re.search(p, f) for f in files for p in [hook["files"]])


@pytest.mark.parametrize(("config", "code"), sorted(EXAMPLES.items()))
def test_shipped_examples_exit_codes(config: str, code: int, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    junit = tmp_path / "j.xml"
    res = CliRunner().invoke(
        app, ["check", f"examples/ci/{config}", "--results", EVIDENCE, "--junit", str(junit), "--json"]
    )
    assert res.exit_code == code, res.output
    root = ET.parse(junit).getroot()
    assert len(list(root.iter("testcase"))) == 4


def test_bad_input_and_missing_evidence(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    bad = tmp_path / "x.toml"
    bad.write_text("prompts = 8\n")
    assert CliRunner().invoke(app, ["check", str(bad), "--results", EVIDENCE]).exit_code == 2
    ok = tmp_path / "big.toml"
    ok.write_text("prompts = 8\ngroup_size = 8\nlr = 0.24\n")
    assert CliRunner().invoke(app, ["check", str(ok)]).exit_code == 2  # no evidence given
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(app, ["check", str(ok), "--results", str(empty)])
    assert res.exit_code in (2, 3), res.output


def test_a_check_that_cannot_run_still_writes_its_junit_and_json(tmp_path: Path, monkeypatch) -> None:
    """Exit 2 wrote no JUnit file, so a CI job read the previous run's passing report."""
    monkeypatch.chdir(ROOT)
    junit = tmp_path / "j.xml"
    junit.write_text("<testsuites><testsuite tests='4' failures='0'/></testsuites>")  # a stale pass
    bad = tmp_path / "x.toml"
    bad.write_text("prompts = 8\n")
    res = CliRunner().invoke(app, ["check", str(bad), "--results", EVIDENCE, "--junit", str(junit), "--json"])
    assert res.exit_code == 2, res.output
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1"
    (case,) = suite.iter("testcase")
    error = case.find("error")
    assert error is not None and error.get("type") == "batchtune.bad_input" and case.get("file") == str(bad)
    data = json.loads(res.stdout)
    assert data["status"] == "error" and data["exit_code"] == 2 and data["error"]


def test_a_baseline_of_another_target_is_refused(tmp_path: Path, monkeypatch) -> None:
    """The baseline stored a time and its unit only: a time to loss 1.0 was compared with a time to
    another target, and "0.53x the baseline" passed. It now records its target, and a baseline of
    another target is bad input; one written before it recorded one is not compared silently."""
    monkeypatch.chdir(ROOT)
    config, base = (
        "examples/ci/verl/ppo_trainer.yaml",
        json.loads(Path("examples/ci/baseline.json").read_text()),
    )
    assert base["predicted_time_to_target"]["target"] == {
        "metric": "loss",
        "target": 1.0,
        "higher_is_better": False,
    }
    other = tmp_path / "other.json"
    base["predicted_time_to_target"]["target"]["target"] = 0.5
    other.write_text(json.dumps(base))
    res = CliRunner().invoke(app, ["check", config, "--results", EVIDENCE, "--baseline", str(other)])
    assert res.exit_code == 2 and "loss <= 0.5" in res.output and "loss <= 1" in res.output, res.output
    old = tmp_path / "old.json"
    del base["predicted_time_to_target"]["target"]
    old.write_text(json.dumps(base))
    res = CliRunner().invoke(app, ["check", config, "--results", EVIDENCE, "--baseline", str(old), "--json"])
    assert res.exit_code == 0, res.output
    assert any("does not record its target" in n for n in json.loads(res.stdout)["notes"])
    typed = tmp_path / "typed.json"
    base["predicted_time_to_target"]["target"] = {
        "metric": "loss",
        "target": "1.0",
        "higher_is_better": False,
    }
    typed.write_text(json.dumps(base))
    res = CliRunner().invoke(app, ["check", config, "--results", EVIDENCE, "--baseline", str(typed)])
    assert res.exit_code == 2 and "target: a number or null" in res.output, res.output


def test_a_baseline_without_a_target_value_round_trips(tmp_path: Path, monkeypatch) -> None:
    """Measurements without study.target have a NaN target, written as null: fed back as the
    baseline it crashed check (exit 70), NaN never equalling null."""
    monkeypatch.chdir(ROOT)
    config = tmp_path / "v.yaml"
    config.write_text(
        "data:\n  train_batch_size: 1024\nactor_rollout_ref:\n  rollout:\n    n: 8\n"
        "  actor:\n    optim:\n      lr: 1.0e-6\n"
    )
    measured = ["check", str(config), "-f", "verl", "-m", "recipes/hunyuan-grpo-measurements.toml"]
    first = CliRunner().invoke(app, [*measured, "--json"])
    base = tmp_path / "base.json"
    base.write_text(first.stdout)
    assert json.loads(first.stdout)["predicted_time_to_target"]["target"]["target"] is None
    again = CliRunner().invoke(app, [*measured, "--baseline", str(base), "--json"])
    assert again.exit_code == first.exit_code, again.output
    (time,) = [c for c in json.loads(again.stdout)["checks"] if c["name"] == "time_to_target"]
    assert time["status"] == "pass", time


def test_a_config_that_is_not_text_still_writes_the_junit_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    junit = tmp_path / "j.xml"
    junit.write_text("<testsuites><testsuite tests='4' failures='0'/></testsuites>")  # a stale pass
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe\x00")
    res = CliRunner().invoke(app, ["check", str(bad), "--results", EVIDENCE, "--junit", str(junit), "--json"])
    assert res.exit_code == 2, res.output
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1"
    assert json.loads(res.stdout)["status"] == "error"


def test_check_carries_the_evidences_own_weak_evidence_warning_as_a_note(tmp_path: Path, monkeypatch) -> None:
    """A gate built on a probe whose own pick rests on thin evidence says so (a note, same exit code)."""
    import dataclasses
    import json

    from batchtune.workflow import ci as workflow_ci

    monkeypatch.chdir(ROOT)
    real = workflow_ci.recommend_from_args

    def weak(*args, **kwargs):
        rec, *rest = real(*args, **kwargs)
        return (
            dataclasses.replace(rec, evidence=("P16xG8's R rests on one seed, so it has no interval",)),
            *rest,
        )

    monkeypatch.setattr(workflow_ci, "recommend_from_args", weak)
    res = CliRunner().invoke(
        app, ["check", "examples/ci/verl/ppo_trainer.yaml", "--results", EVIDENCE, "--json"]
    )
    assert res.exit_code == EXAMPLES["verl/ppo_trainer.yaml"], res.output
    notes = json.loads(res.output)["notes"]
    assert "the evidence's own pick rests on thin evidence: P16xG8's R rests on one seed" in " ".join(notes)


def test_tolerance_options_reach_the_check_and_bad_ones_are_refused(tmp_path: Path, monkeypatch) -> None:
    """--lr-tolerance -1 divided by zero inside the LR check (an internal error); the tolerances are
    now built and checked by the workflow, and an error still leaves its JUnit report."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    legacy = ["check", "examples/ci/openrlhf/train_ppo_ray_legacy.sh", "--results", EVIDENCE]
    wide = CliRunner().invoke(app, [*legacy, "--lr-tolerance", "5", "--json"])
    assert wide.exit_code == 0, wide.output  # its LR fails at the default 0.25, not within 1+5
    junit = tmp_path / "j.xml"
    bad = [("--lr-tolerance", "-1"), ("--time-tolerance", "nan"), ("--waste-tolerance", "-0.5")]
    for option, value in bad:
        res = CliRunner().invoke(app, [*legacy, option, value, "--junit", str(junit)])
        assert res.exit_code == 2, res.output
        assert f"{option} {value}: give a finite number >= 0" in res.stderr
        assert "internal error" not in res.output + res.stderr
        error = ET.parse(junit).getroot().find("testsuite/testcase/error")
        assert error is not None and error.get("type") == "batchtune.bad_input"
