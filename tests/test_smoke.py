"""Smoke mode works end to end (the figures are benchmarks/smoke_times.py's job, not a test's)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.workflow import smoke as workflow_smoke


def test_smoke_nqm_runs_every_stage_and_says_what_it_shrank(tmp_path):
    res = workflow_smoke.smoke("nqm", [], str(tmp_path / "r"))
    assert res.ok
    assert [s.name for s in res.stages] == ["probe", "profile-gen", "recommend"]
    assert {s.status for s in res.stages[:2]} == {"ok"}
    assert any(r.startswith("seeds:") for r in res.reduced) and any(
        r.startswith("batches:") for r in res.reduced
    )
    assert (tmp_path / "r" / "runs").is_dir()


def test_smoke_of_a_branched_recipe_runs_its_grid_and_its_checkpoint_path(tmp_path):
    """smoke of a branched recipe ran the grid's runs, then recommend read the branched runs it had
    not made: 'recommend failed ... lacks the run trunk-P1xG8-s0' on every branched recipe. The
    probe stage now runs the grid, and a branches stage a one-step trunk and its branches."""
    res = workflow_smoke.smoke("nqm", ["probe.mode=branched"], str(tmp_path / "r"))
    assert res.ok and all(s.status != "failed" for s in res.stages), res.stages
    assert [s.name for s in res.stages] == ["probe", "branches", "profile-gen", "recommend"]
    assert {s.name: s.status for s in res.stages}["branches"] == "ok"
    assert any(r.startswith("branches: a trunk of one step at 8") for r in res.reduced)
    runs = {p.name for p in (tmp_path / "r" / "branches" / "runs").iterdir()}
    assert runs == {"trunk-P1xG8-s0", "c8-P1xG8-s0", "c8-P2xG8-s0"}  # a step of every batch resumed
    assert not (tmp_path / "r" / "branched").exists()  # the grid's results are the grid's
    # a second smoke into the same folder starts its branches over (a smoke is never resumed)
    stale = tmp_path / "r" / "branches" / "runs" / "c8-P2xG8-s0" / "stale"
    stale.write_text("")
    again = workflow_smoke.smoke("nqm", ["probe.mode=branched"], str(tmp_path / "r"))
    assert again.ok and not stale.exists()


def test_smoke_cli_leaves_no_results_behind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(app, ["smoke", "nqm"])
    assert out.exit_code == 0, out.output
    assert "checked at smoke size only" in out.output and "probe" in out.output
    assert not any(tmp_path.iterdir())


@pytest.mark.slow  # a tiny Llama warm start and two GRPO runs (~3-8 s on 2 cores)
def test_smoke_tiny_grpo(tmp_path):
    res = workflow_smoke.smoke("tiny-grpo", [], str(tmp_path / "r"))
    assert res.ok and res.stages[0].status == "ok"


def _failing_command_recipe(tmp_path) -> str:
    cmd = ["python3", "-c", "import sys; sys.exit('SystemExit: boom, no trainer here')", "{max_steps}"]
    path = tmp_path / "cmd.toml"
    path.write_text(
        "[candidates]\nprompts = [2, 4, 8]\ngroup_size = 4\n[target]\nmetric = 'reward'\nvalue = 0.5\n"
        f"[backend]\ntraining = 'command'\ncommand = {cmd!r}\ncommand_log = 'log.jsonl'\n"
    )
    return str(path)


def test_smoke_of_a_failing_command_fails_at_the_first_run_with_its_reason(tmp_path):
    res = workflow_smoke.smoke(_failing_command_recipe(tmp_path), [], str(tmp_path / "r"))
    probe, profile, recommend = res.stages
    assert not res.ok and probe.status == "failed" and "boom, no trainer here" in probe.detail
    assert "target metric" not in probe.detail
    assert len(list((tmp_path / "r" / "runs").iterdir())) == 1  # stopped at the first failure
    assert profile.status == "skipped" and "[model] is the built-in default" in profile.detail
    assert recommend.status == "skipped"


def test_smoke_says_what_it_could_not_check(tmp_path):
    over = ["generation.backend=vllm", "generation.random_weights=true", "model.name=some/shape"]
    res = workflow_smoke.smoke("nqm", [*over, "backend.training=torch"], str(tmp_path / "r"))
    assert res.stages[0].status == "skipped" and "random_weights" in res.stages[0].detail
    if importlib.util.find_spec("vllm") is None:
        assert any("simulated engine stood in" in u for u in res.unchecked)
        assert "simulated engine" in res.stages[1].detail
        assert not any("some/shape" in r for r in res.reduced)  # never loaded: not claimed


@pytest.mark.parametrize("command", ["probe", "tune"])
def test_smoke_flag_is_the_smoke_command(command, tmp_path):
    out = CliRunner().invoke(app, [command, "nqm", "--smoke", "-r", str(tmp_path / "r"), "--json"])
    assert out.exit_code == 0, out.output
    assert [s["name"] for s in json.loads(out.stdout)["stages"]] == ["probe", "profile-gen", "recommend"]


@pytest.mark.slow  # three tiny pre-training runs (~3 s on 2 cores)
def test_smoke_tiny_pretrain(tmp_path):
    res = workflow_smoke.smoke("tiny-pretrain", [], str(tmp_path / "r"))
    assert res.ok and [s.status for s in res.stages] == ["ok", "skipped", "skipped"]


def test_smoke_of_an_off_policy_sweep_runs_one_cell_of_each_kind_not_the_whole_sweep():
    """`batchtune smoke recipes/tiny-grpo-async.toml` ran every (k, u) cell of its sweep at both
    batches, 12 two-process runs (104 s on the 2-core box), and the seed top-up on top. It now keeps
    on-policy plus the least k > 0 at the least u, and says so; a u-only sweep keeps its next u."""
    from batchtune.recipe.load import load_recipe
    from batchtune.recipe.smoke import smoke_recipe

    plan = smoke_recipe(load_recipe("tiny-grpo-async"), "r")
    probe, budget = plan.recipe.probe, plan.recipe.budget
    assert (probe.staleness, probe.updates_per_batch, budget.async_top_up_seeds) == ([0, 1], [1], 0)
    said = "off-policy sweep: staleness [0, 1, 2] -> [0, 1], updates per batch [1, 2] -> [1]"
    assert any(r.startswith(said) for r in plan.reduced), plan.reduced
    plan = smoke_recipe(load_recipe("tiny-grpo-async", ["probe.staleness=[0]"]), "r")
    assert (plan.recipe.probe.staleness, plan.recipe.probe.updates_per_batch) == ([0], [1, 2])


def test_smoke_of_an_async_recipe_probes_in_one_process_and_runs_one_two_process_run():
    """`batchtune smoke recipes/tiny-grpo-async.toml` ran its 4 runs as two processes each, every
    rollout process importing torch and transformers again and taking seconds to exit: 42 s on an
    idle 2-core box, 90-100 s loaded, against 2-12 s for the other shipped smokes. The probe now
    runs in one process and a two-process stage runs one run of the smallest batch at k = 1."""
    from batchtune.recipe.load import load_recipe
    from batchtune.recipe.smoke import smoke_recipe

    plan = smoke_recipe(load_recipe("tiny-grpo-async"), "r")
    assert plan.recipe.algorithm.mode == "sync"
    assert plan.two_process is not None and plan.two_process.algorithm.mode == "async"
    assert plan.two_process.probe == plan.recipe.probe  # the same cells, the k = 1 one run in two
    assert any(r.startswith("algorithm.mode = async: the probe's runs in one process") for r in plan.reduced)
    assert smoke_recipe(load_recipe("tiny-grpo"), "r").two_process is None


@pytest.mark.slow  # one tiny sync probe and one two-process run (~20 s on a loaded 2-core box)
def test_smoke_of_an_async_recipe_runs_its_two_process_stage(tmp_path):
    res = workflow_smoke.smoke("tiny-grpo-async", [], str(tmp_path / "r"))
    stages = {s.name: s for s in res.stages}
    assert res.ok and stages["probe"].status == stages["two-process"].status == "ok", res.stages
    assert stages["two-process"].detail.startswith("P2xG8-k1u1-s0 (staleness 1): 4 step(s) from a rollout")


def test_smoke_of_an_async_nqm_recipe_has_no_two_process_stage(tmp_path):
    """`batchtune smoke recipes/nqm.toml --set algorithm.mode=async` exited 1 ("failed two-process
    ... did not finish"): that stage wants the torch backend's rollout-worker timers, which the nqm
    backend never writes. Only a torch recipe gets that stage; another runs its probe as written."""
    args = ["smoke", "recipes/nqm.toml", "--set", "algorithm.mode=async", "--set", "probe.staleness=[0,1]"]
    out = CliRunner().invoke(app, [*args, "-r", str(tmp_path / "r")])
    assert out.exit_code == 0, out.output
    assert "two-process" not in out.output.replace("no two-process stage", "")
    assert "probe's runs as the nqm backend runs them" in out.output
    assert "P2xG8-k1u1" in out.output  # the async cell ran as the recipe has it


@pytest.mark.slow  # the probe refused, then profile-gen (~10 s)
def test_smoke_of_an_async_recipe_still_checks_it_as_async_before_any_run(tmp_path):
    """The probe runs the sync copy; the recipe's async checks (preflight) must still refuse it."""
    res = workflow_smoke.smoke("tiny-grpo-async", ["algorithm.sync_every=3"], str(tmp_path / "r"))
    stages = {s.name: s for s in res.stages}
    assert stages["probe"].status == "failed" and "sync_every = 3" in stages["probe"].detail
    assert stages["two-process"].status == "skipped"
