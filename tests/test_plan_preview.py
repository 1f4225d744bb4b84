"""`batchtune plan` / `probe --dry-run` (cost preview) and the probe's fail-fast checks, on the NQM
simulation (seconds) and, for the declared reward range, the tiny GRPO recipe (nothing runs)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.errors import MetricMissingError
from batchtune.measure.guards import check_metric_present
from batchtune.recipe.load import shipped_recipes

NQM = str(shipped_recipes()["nqm"])
SMALL = ["--set", "candidates.prompts=[1,4,16]", "--set", "budget.seeds=[0,1]"]
SHORT = [  # a probe that finishes its planned runs alone (no extra seeds): 6 runs of a smaller NQM
    *("--set", "nqm.dim=100", "--set", "target.value=2.0"),
    *("--set", "budget.max_samples=4096", "--set", "budget.max_extra_seeds=0"),
]


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_plan_json_budgets_and_cost_ratio(tmp_path: Path):
    out = _invoke("plan", NQM, "-r", str(tmp_path / "r"), *SMALL, "--time-steps", "2", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["runs"] == 6 and data["reference"] == "P1xG8"
    cands = {c["label"]: c for c in data["candidates"]}
    for c in cands.values():
        # every run's budget covers max_samples in whole steps
        assert c["max_steps_per_run"] == math.ceil(40960 / c["batch_responses"])
        assert c["max_samples_per_run"] >= 40960
        assert c["step_s"] > 0 and c["run_s_max"] > 0
    assert data["total_samples_max"] == sum(c["max_samples_per_run"] * 2 for c in cands.values())
    assert data["cost_vs_reference_run"] == pytest.approx(data["total_samples_max"] / 40960)
    assert data["wall_s_max"] > 0 and "timed alone" in data["timing_source"]
    assert not (tmp_path / "r" / "plan-timing").exists()  # the timing scratch is removed
    assert not (tmp_path / "r" / "runs").exists()  # nothing of a probe was written


def test_probe_dry_run_is_the_plan_and_runs_nothing(tmp_path: Path):
    out = _invoke("probe", NQM, "-r", str(tmp_path / "r"), *SMALL, "--dry-run", "--time-steps", "0")
    assert out.exit_code != 0  # --time-steps belongs to `plan` only
    out = _invoke("probe", NQM, "-r", str(tmp_path / "r"), *SMALL, "--dry-run")
    assert out.exit_code == 0, out.output
    assert "Probe budget: " in out.stdout and "one full run at the reference P1xG8" in out.stdout
    assert not (tmp_path / "r" / "runs").exists()


def test_plan_untimed_has_no_wall_time(tmp_path: Path):
    out = _invoke("plan", NQM, "-r", str(tmp_path / "r"), *SMALL, "--time-steps", "0", "--json")
    data = json.loads(out.stdout)
    assert data["wall_s_max"] is None and data["timing_source"].startswith("not timed")


def test_metric_check_names_what_is_logged():
    check_metric_present("eval_reward", {"eval_reward": 0.5}, {"eval_reward"})
    check_metric_present("eval_reward", {"reward": 0.5, "loss": 1.0}, {"reward", "loss"})  # no eval yet
    # a PPO step between evaluations (a branch resumed mid-run has no step-0 evaluation): value_loss
    # is the critic's training loss, not a held-out metric
    check_metric_present("eval_reward", {"reward": 0.5, "value_loss": 0.1}, {"reward", "value_loss"})
    with pytest.raises(MetricMissingError):
        check_metric_present("eval_reward", {"val/loss": 1.0, "value_loss": 0.1}, {"val/loss", "value_loss"})
    with pytest.raises(MetricMissingError, match="eval_reward, loss, reward"):
        check_metric_present("accuracy", {"reward": 0.5, "loss": 1.0}, {"eval_reward", "reward", "loss"})
    with pytest.raises(MetricMissingError, match="eval_acc"):
        check_metric_present("eval_acc", {"eval_reward": 0.5}, {"eval_reward"})


def test_probe_stops_at_first_step_on_a_wrong_metric(tmp_path: Path):
    results = tmp_path / "r"
    out = _invoke("probe", NQM, "-r", str(results), *SMALL, "--set", 'target.metric="accuracy"')
    assert out.exit_code == 2
    assert "'accuracy' is not logged" in out.output and "loss" in out.output
    steps = [len(p.read_text().splitlines()) for p in results.glob("runs/*/steps*.jsonl*")]
    assert steps and max(steps) <= 1  # stopped at the first step, not at the budget
    assert not (results / "manifest.json").exists()  # so the corrected rerun starts afresh
    out = _invoke("probe", NQM, "-r", str(results), *SMALL, "--dry-run")
    assert out.exit_code == 0, out.output


def test_target_outside_declared_range_refused_before_running(tmp_path: Path):
    out = _invoke("probe", "tiny-grpo", "-r", str(tmp_path / "r"), "--set", "target.value=2.0")
    assert out.exit_code == 2
    assert "outside eval_reward's range [0, 1]" in out.output
    assert not (tmp_path / "r").exists()


def test_plan_of_the_shipped_nqm_recipe_notes_the_batch_that_diverges_while_timed(tmp_path: Path):
    """N = 1024 at lr 3.84 diverges at its second step: timing it is data, not an internal error."""
    out = _invoke("plan", NQM, "-r", str(tmp_path / "r"), "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["runs"] == 24
    failed = [n for n in data["notes"] if "failed while timed" in n]
    assert len(failed) == 1 and failed[0].startswith("P128xG8 failed while timed (simulated NQM loss")
    assert all(c["step_s"] > 0 for c in data["candidates"])  # its one step before diverging is timed


def test_bisect_worst_is_the_most_batches_the_search_can_test():
    from batchtune.measure.preview_branched import bisect_worst

    # n main candidates (the reference first): every previous answer, every outcome of each test
    assert [bisect_worst(n) for n in range(2, 10)] == [1, 2, 3, 4, 4, 5, 5, 5]


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["branch.search=all", "budget.seeds=[0, 1]"],
        ["branch.checkpoints=[0.0, 0.5, 1.0]", "branch.trunk_samples=1024", "budget.seeds=[3]"],
    ],
)
def test_a_branched_plan_bounds_what_the_branched_probe_spends(tmp_path: Path, sets: list[str]):
    """`plan` of a branched recipe previews the branched probe (not the grid it does not run), and
    its bound holds: the probe, run, spends no more samples than the plan's most."""
    args = [a for s in ["probe.mode=branched", *sets] for a in ("--set", s)]
    out = _invoke("plan", NQM, "-r", str(tmp_path / "r"), *args, "--json")
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)
    assert plan["mode"] == "branched" and plan["total_samples_max"] < plan["grid_samples_max"]
    assert {c["label"] for c in plan["candidates"]} == {f"P{p}xG8" for p in (2, 4, 8, 16, 32, 64, 128)}
    probe = _invoke("probe", NQM, "-r", str(tmp_path / "r"), *args, "--json")
    assert probe.exit_code == 0, probe.output
    spent = json.loads(probe.stdout)["probe_cost"]["samples"]
    assert 0 < spent <= plan["total_samples_max"]
    assert plan["runs_finished"] == 0
    again = json.loads(_invoke("plan", NQM, "-r", str(tmp_path / "r"), *args, "--json").stdout)
    assert again["runs_finished"] == json.loads(probe.stdout)["runs_done"] > 0  # a rerun reuses them
    text = _invoke("probe", NQM, "-r", str(tmp_path / "r2"), *args, "--dry-run")
    assert text.exit_code == 0 and "Branched probe plan" in text.stdout and "Trunk: " in text.stdout


def test_tune_dry_run_is_the_probes_plan_and_runs_nothing(tmp_path: Path):
    out = _invoke("tune", NQM, "-r", str(tmp_path / "r"), *SMALL, "--dry-run")
    assert out.exit_code == 0, out.output
    assert "Probe budget: " in out.stdout and "Run it: batchtune tune" in out.stdout
    assert "Then profile-gen" in out.stdout and not (tmp_path / "r" / "runs").exists()
    data = json.loads(_invoke("tune", NQM, "-r", str(tmp_path / "r"), *SMALL, "--dry-run", "--json").stdout)
    assert data["mode"] == "grid" and data["runs"] == 6
    assert _invoke("tune", NQM, "--dry-run", "--smoke").exit_code == 2


def test_run_it_carries_the_users_options_so_it_runs_the_plan_shown(tmp_path: Path):
    """`Run it:` is the command with the recipe, --set (brackets and spaces quoted), --results and
    --workers the plan was made with: without them it ran another probe (the grid for a branched
    plan). Its argv, run through the CLI, gives the same plan."""
    import shlex

    r = str(tmp_path / "r")
    args = ["--set", "probe.mode=branched", "--set", "budget.seeds=[0, 1]", "-r", r, "--workers", "1"]
    out = _invoke("plan", NQM, *args, "--time-steps", "1")
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("Run it: "))
    argv = shlex.split(line.removeprefix("Run it: "))
    assert argv[:3] == ["batchtune", "probe", NQM] and "budget.seeds=[0, 1]" in argv
    assert argv[argv.index("--results") + 1] == r and "--time-steps" not in argv
    again = json.loads(_invoke("plan", *argv[2:], "--time-steps", "1", "--json").stdout)
    first = json.loads(_invoke("plan", NQM, *args, "--time-steps", "1", "--json").stdout)
    assert again["mode"] == first["mode"] == "branched" and again["run_it"] == first["run_it"]
    assert again["total_samples_max"] == first["total_samples_max"]
    tune = _invoke("tune", NQM, *args, "--emit", "verl", "--dry-run")
    assert "Run it: batchtune tune" in tune.stdout and "--emit verl --gpus 8" in tune.stdout


def test_plan_of_a_pretraining_recipe_is_its_grid_of_token_batches(tmp_path: Path):
    """`plan tiny-pretrain` showed the RL candidates of the recipe's defaults (P4xG8 ..., 12 runs),
    not the 27 runs at 9 token batches the probe makes."""
    pre = str(shipped_recipes()["tiny-pretrain"])
    out = _invoke("plan", pre, "-r", str(tmp_path / "r"), "--time-steps", "0", "--json")
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)
    assert plan["unit"] == "tokens" and plan["workers"] == 1
    labels = [c["label"] for c in plan["candidates"]]
    assert labels == ["B16", "B32", "B48", "B64", "B96", "B128", "B192", "B256", "B512"]
    assert plan["runs"] == 27 and plan["reference"] == "B32"
    assert all(48_000 <= c["max_samples_per_run"] < 48_000 + c["batch_responses"] for c in plan["candidates"])
    text = _invoke("plan", pre, "-r", str(tmp_path / "r"), "--time-steps", "0")
    assert "tokens/run" in text.stdout and "48,000 tokens" in text.stdout


def test_plan_of_a_branched_pretraining_recipe_is_in_tokens(tmp_path: Path):
    """A branched pre-training probe was refused; its plan is the trunk and branches of the token
    batches (not the recipe's RL defaults), counted in tokens."""
    pre = str(shipped_recipes()["tiny-pretrain-branched"])
    out = _invoke("plan", pre, "-r", str(tmp_path / "r"), "--time-steps", "0", "--json")
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)
    assert plan["mode"] == "branched" and plan["unit"] == "tokens"
    assert plan["reference"] == "B16" and plan["checkpoints"] == [4096, 8192, 16384]
    labels = [c["label"] for c in plan["candidates"]]
    assert labels == ["B32", "B48", "B64", "B96", "B128", "B192", "B256", "B512"]
    text = _invoke("plan", pre, "-r", str(tmp_path / "r"), "--time-steps", "0")
    assert "seqs x len" in text.stdout and "Trunk: 16,384 tokens at B16" in text.stdout
    assert "samples" not in text.stdout.split("note:")[0]


def test_plan_of_a_finished_probe_says_what_is_left_to_run(tmp_path: Path):
    """`plan` on a finished results directory predicted the whole probe's wall time beside "N of N
    runs already finished": it now says what a rerun has left."""
    r = str(tmp_path / "r")
    small = [*SMALL, *SHORT]
    probe = _invoke("probe", NQM, "-r", r, *small, "--json")
    assert probe.exit_code == 0, probe.output
    plan = json.loads(_invoke("plan", NQM, "-r", r, *small, "--json").stdout)
    assert plan["runs_finished"] == json.loads(probe.stdout)["runs_done"] > 0
    left = plan["runs"] - plan["runs_finished"]
    assert plan["wall_s_max"] > 0 and plan["wall_s_left_max"] < plan["wall_s_max"]
    assert (plan["wall_s_left_max"] == 0) == (left == 0)
    text = _invoke("plan", NQM, "-r", r, *small).stdout
    assert (f"Left to run: {left} of {plan['runs']} runs" if left else "Left to run: nothing") in text
    # one run left on a pool of 4 runs alone: its bound is its own time, not a quarter of it
    gone = sorted(Path(r, "runs").iterdir())[-1]
    shutil.rmtree(gone)
    pooled = json.loads(_invoke("plan", NQM, "-r", r, *small, "--set", "run.workers=4", "--json").stdout)
    run_s = {c["label"]: c["run_s_max"] for c in pooled["candidates"]}[gone.name.rsplit("-s", 1)[0]]
    assert pooled["runs"] - pooled["runs_finished"] == 1 and pooled["wall_s_left_max"] >= run_s
