"""`plan` and `--dry-run` refuse what the probe refuses, before timing anything, and their wall-time
lines say which way each assumption errs and how the machine's load was counted (issue 33, item 10)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.recipe.load import shipped_recipes

NQM = str(shipped_recipes()["nqm"])
SMALL = ["--set", "candidates.prompts=[1,4]", "--set", "budget.seeds=[0]"]


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("command", [["plan"], ["probe", "--dry-run"], ["tune", "--dry-run"]])
def test_a_reward_target_above_its_range_is_refused_by_the_plan(tmp_path: Path, command: list[str]):
    results = tmp_path / "r"
    out = _invoke(*command, "tiny-grpo", "-r", str(results), "--set", "target.value=1.5")
    assert out.exit_code == 2, out.output
    assert "outside eval_reward's range [0, 1]" in out.output
    assert not results.exists()  # refused before the timing scratch folder is made


@pytest.mark.parametrize("command", [["probe"], ["plan"], ["probe", "--dry-run"]])
def test_an_nqm_loss_target_below_zero_is_refused_before_the_probe_runs(tmp_path: Path, command: list[str]):
    """The NQM loss 1/2 sum h theta^2 is never negative: before, the whole probe ran, then exit 3."""
    results = tmp_path / "r"
    out = _invoke(*command, NQM, "-r", str(results), *SMALL, "--set", "target.value=-1")
    assert out.exit_code == 2, out.output
    assert "outside loss's range [0, inf]" in out.output
    assert not (results / "runs").exists()


def test_a_reachable_nqm_target_still_plans(tmp_path: Path):
    args = ("plan", NQM, "-r", str(tmp_path / "r"), *SMALL, "--time-steps", "0")
    out = _invoke(*args, "--set", "target.value=0")  # the range's own edge is inside it
    assert out.exit_code == 0, out.output


def test_plan_time_wording_has_no_bound_that_contradicts_itself(tmp_path: Path):
    """Before: "at most 1.5 min" and, two lines on, "a lower bound on that account"."""
    args = ("plan", NQM, "-r", str(tmp_path / "r"), *SMALL, "--set", "run.workers=2", "--time-steps", "2")
    out = _invoke(*args)
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())  # rich wraps long lines
    wall = text[text.index("Predicted wall time here:") :]
    assert not wall.startswith("Predicted wall time here: at most")
    assert "with every run to its budget, 2 run(s) at a time" in wall
    assert "lower bound" not in text
    assert "the probe takes longer than predicted" in text  # runs at once can only lengthen it
    data = json.loads(_invoke(*args, "--json").stdout)
    assert "CPU cores busy on average (from /proc/stat" in data["timing_source"]
    assert math.isfinite(data["other_cores_busy"]) and data["other_cores_busy"] >= 0.0


def test_recipes_validate_refuses_the_unreachable_target_too(tmp_path: Path):
    text = Path(NQM).read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("\nvalue = 1.0", "\nvalue = -1.0", 1))
    assert bad.read_text() != text
    out = _invoke("recipes", "validate", str(bad))
    assert out.exit_code == 2 and "outside loss's range [0, inf]" in out.output


OFFPOLICY_REFUSALS = [  # (recipe, --set, the message's fragment)
    ("tiny-trl-grpo", "probe.staleness=[0, 1]", "probe.staleness: the trl backend runs on-policy only"),
    ("tiny-trl-grpo", "algorithm.mode=async", "algorithm.mode: the trl backend trains in turn only"),
    ("verl-grpo", "probe.updates_per_batch=[1, 2]", "updates_per_batch: the command backend runs on-policy"),
    ("tiny-pretrain", "probe.async_sweep=auto", "probe.async_sweep: the pretrain backend runs on-policy"),
    ("tiny-grpo-async", "algorithm.sync_every=3", "sync_every = 3: the async trainer needs staleness"),
]  # fmt: skip


@pytest.mark.parametrize(("recipe", "setting", "fragment"), OFFPOLICY_REFUSALS)
def test_off_policy_knobs_the_backend_cannot_honour_are_refused_before_a_run(
    tmp_path: Path, recipe: str, setting: str, fragment: str
):
    """Before: the trl, command and pretrain backends ran every -k{k}u{u} candidate on-policy under
    its off-policy label (exit 0, a wrong comparison), and the async trainer's sync_every > k + 1
    failed the reference's first run after the probe began (exit 4, 'fix the trainer')."""
    results = tmp_path / "r"
    out = _invoke("probe", recipe, "-r", str(results), "--set", setting)
    assert out.exit_code == 2, out.output
    assert fragment in " ".join(out.output.split()) and "Traceback" not in out.output
    assert not (results / "runs").exists()


def test_the_nqm_takes_off_policy_knobs_and_any_sync_every(tmp_path: Path):
    sets = [
        "--set",
        "probe.staleness=[0, 1]",
        "--set",
        "algorithm.mode=async",
        "--set",
        "algorithm.sync_every=3",
    ]
    out = _invoke("plan", NQM, "-r", str(tmp_path / "r"), *SMALL, *sets, "--time-steps", "0")
    assert out.exit_code == 0, out.output


def test_the_async_reference_takes_any_sync_every():
    """k = 0 syncs every step (async_run.sync_interval): only an off-policy k below sync_every - 1 is
    refused (before, sync_every = 2 was refused for the k = 0 the probe always runs)."""
    from batchtune.measure.preflight import problems
    from batchtune.recipe.load import load_recipe

    recipe = str(shipped_recipes()["tiny-grpo-async"])
    assert not [m for m in problems(load_recipe(recipe, ["algorithm.sync_every=2"])) if "sync_every" in m]
    (msg,) = [m for m in problems(load_recipe(recipe, ["algorithm.sync_every=3"])) if "sync_every" in m]
    assert "k = 1;" in msg
