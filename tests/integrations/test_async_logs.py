"""import-logs reads the trainers' async timing keys (names from the installed sources: verl 0.9.1 V1
trainer_base.py and fully_async, trl 1.16 AsyncGRPOTrainer, OpenRLHF 0.11.2) under the names the
built-in async run records, so an imported async run feeds the joint decision
(measure/async_topup.run_knobs)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from batchtune.integrations.common import RunInfo
from batchtune.integrations.readers import import_runs, read_log
from batchtune.measure.async_topup import run_knobs
from batchtune.records.store import ResultsStore


def _verl_log(tmp_path, fully_async: bool):
    lines = []
    for i in range(1, 6):
        data = {
            "critic/score/mean": 0.1 * i,
            "actor/lr": 1e-6,
            "timing_s/gen": 0.5,
            "timing_s/update_actor": 1.0,
            "timing_s/step": 2.0,
        }
        if fully_async:
            data |= {
                "timing_s/param_sync": 0.25,
                "fully_async/trainer/idle_ratio": 0.25,
                "fully_async/rollouter/idle_ratio": 0.1,
                "timing_s/wait_for_enough_samples": 0.4,
            }
        else:
            data |= {"timing_s/update_weights": 0.3, "training/off_policy/trajectory_staleness/mean": 1.0}
        lines.append(json.dumps({"step": i, "data": data}))
    path = tmp_path / ("fa.jsonl" if fully_async else "v1.jsonl")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("fully_async", [False, True])
def test_verl_async_keys_feed_the_joint_decision(tmp_path, fully_async):
    info = RunInfo(prompts=4, group_size=8, staleness=1, updates_per_batch=2)
    (run,) = read_log(_verl_log(tmp_path, fully_async), "verl", info)
    m = run.steps[-1].metrics
    if fully_async:
        assert (m["sync_s"], m["trainer_idle_ratio"], m["rollout_idle_ratio"]) == (0.25, 0.25, 0.1)
        assert m["queue_wait_s"] == 0.4
    else:
        assert (m["sync_s"], m["staleness"]) == (0.3, 1.0)
    store = ResultsStore(tmp_path / "results")
    import_runs(store, [run])
    (rec,) = store.runs()
    assert (rec.staleness, rec.updates_per_batch) == (1, 2)
    knobs = run_knobs(store)[rec.candidate]
    assert (knobs.staleness, knobs.updates_per_batch) == (1, 2)
    assert knobs.sync_s == (0.25 if fully_async else 0.3)


def test_trl_async_grpo_keys(tmp_path):
    history = [
        {"step": i, "learning_rate": 1e-6, "reward": 0.1 * i, "sample/staleness_mean": 0.5,
         "perf/weight_sync_s": 0.2}
        for i in range(1, 4)
    ]  # fmt: skip
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    (run,) = read_log(tmp_path, "trl", RunInfo(prompts=8, group_size=8))
    assert (run.steps[-1].metrics["staleness"], run.steps[-1].metrics["sync_s"]) == (0.5, 0.2)


def test_import_logs_cli_stores_the_launch_settings(tmp_path):
    from typer.testing import CliRunner

    from batchtune.cli import app

    log = _verl_log(tmp_path, fully_async=False)
    out = tmp_path / "res"
    args = [
        "import-logs",
        str(log),
        "-f",
        "verl",
        "-r",
        str(out),
        "--prompts",
        "4",
        "--group-size",
        "8",
        "--metric",
        "reward",
    ]
    res = CliRunner().invoke(app, [*args, "--staleness", "2", "--updates-per-batch", "4"])
    assert res.exit_code == 0, res.output
    (rec,) = ResultsStore(out).runs()
    assert (rec.staleness, rec.updates_per_batch) == (2, 4)
    bad = CliRunner().invoke(app, [*args, "--updates-per-batch", "0"])
    assert bad.exit_code != 0 and "at least 1" in bad.output


def test_an_async_run_is_its_own_candidate_beside_the_sync_one(tmp_path):
    """The same batch and seed run sync and async (k = 1) are two candidates, as the probe labels
    them: before, both were P4xG8 at seed 0 and the import refused the pair as one seed twice (and
    at other seeds pooled the async run's R and times into the sync candidate)."""
    from batchtune.workflow.imports import import_logs

    sync_log = _verl_log(tmp_path, fully_async=False)
    async_log = tmp_path / "fa-run.jsonl"
    async_log.write_text(_verl_log(tmp_path, fully_async=True).read_text())
    res = str(tmp_path / "res")
    import_logs([sync_log], "verl", res, RunInfo(prompts=4, group_size=8), metric="reward")
    import_logs([async_log], "verl", res, RunInfo(prompts=4, group_size=8, staleness=1, updates_per_batch=2))
    by_id = {r.run_id: r for r in ResultsStore(res).runs()}
    assert by_id["v1"].candidate == "P4xG8"
    assert (by_id["fa-run"].candidate, by_id["fa-run"].staleness) == ("P4xG8-k1u2", 1)


def test_generic_logs_keep_the_launch_settings(tmp_path):
    """--staleness and --updates-per-batch reach the stored run for csv / jsonl logs too (they were
    dropped there: the run was stored on-policy)."""
    log = tmp_path / "run.csv"
    log.write_text("step,samples,score,lr\n" + "".join(f"{s},{64 * s},{0.1 * s},1e-6\n" for s in range(1, 6)))
    (run,) = read_log(log, "csv", RunInfo(prompts=8, group_size=8, staleness=2, updates_per_batch=4))
    assert (run.candidate, run.staleness, run.updates_per_batch) == ("P8xG8-k2u4", 2, 4)


def test_async_runs_beside_sync_ones_send_recommend_to_the_joint_decision(tmp_path):
    """Docs: an imported async run's sync_s enters the joint decision. The stored recipe had no async
    knob, so `recommend` never made one; with runs at k = 0 and k >= 1 in the directory it now has
    probe.staleness and algorithm.mode = "async" (the trainers' async runs generate and train apart)."""
    from batchtune.measure.async_topup import has_async_knobs
    from batchtune.workflow.imports import import_logs

    res = str(tmp_path / "res")
    async_log = tmp_path / "fa-run.jsonl"
    async_log.write_text(_verl_log(tmp_path, fully_async=True).read_text())
    alone = import_logs(
        [async_log], "verl", str(tmp_path / "alone"), RunInfo(4, 8, staleness=1), metric="reward"
    )
    assert not has_async_knobs(alone.recipe)  # nothing on-policy to rank it against: ranked as before
    first = import_logs(
        [_verl_log(tmp_path, False)], "verl", res, RunInfo(prompts=4, group_size=8), metric="reward"
    )
    assert not has_async_knobs(first.recipe)
    both = import_logs([async_log], "verl", res, RunInfo(prompts=4, group_size=8, staleness=1))
    assert has_async_knobs(both.recipe) and both.recipe.algorithm.mode == "async"
    assert list(both.recipe.probe.staleness) == [0, 1] and both.recipe.target.metric == "reward"
    assert ResultsStore(res).read_manifest()["recipe"]["algorithm"]["mode"] == "async"


def test_an_import_never_rewrites_a_probes_recipe(tmp_path):
    """A probe at probe.staleness = [0, 1] (sync mode: one process) holds runs at k = 0 and k = 1. An
    on-policy CSV imported beside them once rewrote its manifest to algorithm.mode = "async", so the
    same probe again was refused (exit 2, "changed: algorithm.mode"): the import leaves it as it was."""
    from typer.testing import CliRunner

    from batchtune.cli import app
    from batchtune.recipe.load import shipped_recipes

    res = tmp_path / "res"
    probe = ["probe", str(shipped_recipes()["nqm"]), "-r", str(res), "--json"]
    for s in ("candidates.prompts=[1,4]", "budget.seeds=[0]", "budget.max_samples=2048", "target.value=3.0"):
        probe += ["--set", s]
    probe += ["--set", "nqm.dim=100", "--set", "probe.staleness=[0,1]"]
    out = CliRunner().invoke(app, probe)
    assert out.exit_code == 0, out.output
    store = ResultsStore(res)
    assert {r.staleness for r in store.runs()} == {0, 1}
    before, n_runs = store.read_manifest(), len(store.runs())
    log = tmp_path / "mine.csv"
    rows = [f"{s},{16 * s},{3.7 - 0.1 * s:.2f},0.06\n" for s in range(0, 8)]
    log.write_text("step,samples,loss,lr\n" + "".join(rows))
    args = ["import-logs", str(log), "--format", "csv", "-r", str(res), "--prompts", "2", "--group-size", "8"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert store.read_manifest() == before
    assert len(store.runs()) == n_runs + 1
    out = CliRunner().invoke(app, probe)
    assert out.exit_code == 0, out.output


def test_an_import_made_recipe_keeps_what_it_says_of_its_runs(tmp_path):
    """An import-made recipe whose --set says how its runs ran (sync mode, k generated ahead) keeps it;
    one already async gets a new k added to probe.staleness."""
    from batchtune.workflow.imports import import_logs

    def log(name: str):
        path = tmp_path / f"{name}.csv"
        rows = "".join(f"{s},{32 * s},{0.1 * s},1e-6\n" for s in range(6))
        path.write_text("step,samples,reward,lr\n" + rows)
        return path

    sync_res, info = str(tmp_path / "sync"), RunInfo(prompts=4, group_size=8)
    kept = ["algorithm.mode=sync", "probe.staleness=[0,1]"]
    import_logs([log("a")], "csv", sync_res, info, metric="reward", overrides=kept)
    k1 = RunInfo(prompts=4, group_size=8, staleness=1)
    out = import_logs([log("b")], "csv", sync_res, k1)
    assert out.recipe.algorithm.mode == "sync" and list(out.recipe.probe.staleness) == [0, 1]
    res = str(tmp_path / "res")
    import_logs([log("c")], "csv", res, info, metric="reward")
    assert import_logs([log("d")], "csv", res, k1).recipe.algorithm.mode == "async"
    k2 = RunInfo(prompts=4, group_size=8, staleness=2)
    out = import_logs([log("e")], "csv", res, k2)
    assert out.recipe.algorithm.mode == "async" and list(out.recipe.probe.staleness) == [0, 1, 2]
    assert ResultsStore(res).read_manifest()["recipe"]["probe"]["staleness"] == [0, 1, 2]


def _csv(tmp_path, name: str, batch: int):
    path = tmp_path / f"{name}.csv"
    rows = "".join(f"{s},{batch * s},{0.1 * s},1e-6\n" for s in range(6))
    path.write_text("step,samples,reward,lr\n" + rows)
    return path


def test_on_policy_runs_of_other_updates_per_batch_are_their_own_candidate(tmp_path):
    """Runs at k = 0 with u = 4 (PPO: mini-batches x epochs) beside u = 1 runs of the same batch were
    pooled into P4xG8 as more seeds of one candidate, though they train differently. The directory's
    on-policy runs (P4xG8) keep the u they were stored with, else the smallest u imported at k = 0 is
    theirs; a run at k = 0 and another u is P4xG8-k0u{u}, as a probe names it."""
    from batchtune.workflow.imports import import_logs

    u1, u4 = RunInfo(prompts=4, group_size=8), RunInfo(prompts=4, group_size=8, updates_per_batch=4)
    labels: dict[str, str] = {}
    for name, first, then in (("a", u1, u4), ("b", u4, u1)):
        res = str(tmp_path / name)
        import_logs([_csv(tmp_path, f"{name}0", 32)], "csv", res, first, metric="reward")
        then = dataclasses.replace(then, seed=1)
        import_logs([_csv(tmp_path, f"{name}1", 32)], "csv", res, then)
        assert import_logs([tmp_path / f"{name}1.csv"], "csv", res, then).skipped == (f"{name}1",)  # again
        labels |= {r.run_id: r.candidate for r in ResultsStore(res).runs()}
    assert labels == {"a0": "P4xG8", "a1": "P4xG8-k0u4", "b0": "P4xG8", "b1": "P4xG8-k0u1"}
    runs = [*read_log(_csv(tmp_path, "c0", 32), "csv", u4), *read_log(_csv(tmp_path, "c1", 32), "csv", u1)]
    store = ResultsStore(tmp_path / "c")
    import_runs(store, runs)  # one batch of runs at two u: the smallest is the on-policy reference
    assert {r.run_id: r.candidate for r in store.runs()} == {"c0": "P4xG8-k0u4", "c1": "P4xG8"}
    assert {k: (v.staleness, v.updates_per_batch) for k, v in run_knobs(store).items()} == {
        "P4xG8": (0, 1),
        "P4xG8-k0u4": (0, 4),
    }


def test_a_ppo_only_import_keeps_its_on_policy_reference(tmp_path):
    """Every run at u = 4 (PPO always has u > 1): they are the on-policy candidates, P{p}xG{g}, and
    recommend ranks them as before."""
    from typer.testing import CliRunner

    from batchtune.cli import app
    from batchtune.workflow.imports import import_logs

    res = str(tmp_path / "res")
    for p in (4, 16):
        info = RunInfo(prompts=p, group_size=8, updates_per_batch=4)
        import_logs([_csv(tmp_path, f"p{p}", 8 * p)], "csv", res, info, metric="reward", target=0.3)
    assert {r.candidate for r in ResultsStore(res).runs()} == {"P4xG8", "P16xG8"}
    out = CliRunner().invoke(app, ["recommend", "--results", res])
    assert out.exit_code == 0, out.output


def test_a_ppo_import_ranks_its_async_runs_against_its_on_policy_ones(tmp_path):
    """PPO logs: on-policy runs at u = 4 (PPO mini-batches x epochs) and async runs at k = 1, u = 4
    imported into a fresh directory. The joint decision took the on-policy u as the recipe's
    algorithm.mini_batches (1 in an import's recipe), so recommend exited 3: "no on-policy candidate
    with an estimate and timings to rank async runs against". It now takes the u of the directory's
    on-policy runs (the P4xG8 ones, as label_apart kept them)."""
    from typer.testing import CliRunner

    from batchtune.cli import app
    from batchtune.workflow.imports import import_logs

    res = str(tmp_path / "res")
    for k in (0, 1):
        for seed in (0, 1):
            path = tmp_path / f"k{k}s{seed}.jsonl"
            path.write_text(_verl_log(tmp_path, fully_async=k == 1).read_text())
            info = RunInfo(prompts=4, group_size=8, seed=seed, staleness=k, updates_per_batch=4)
            import_logs([path], "verl", res, info, metric="reward", target=0.3)
    assert {r.candidate for r in ResultsStore(res).runs()} == {"P4xG8", "P4xG8-k1u4"}
    assert ResultsStore(res).read_manifest()["recipe"]["algorithm"]["mini_batches"] == 1  # as before
    out = CliRunner().invoke(app, ["recommend", "--results", res, "--json"])
    assert out.exit_code == 0, out.output
    rows = {
        (r["name"], r["mode"], r["updates_per_batch"]): r
        for r in json.loads(out.output)["async_decision"]["candidates"]
    }
    assert {("P4xG8", "sync", 4), ("P4xG8-k1u4", "async", 4)} <= set(rows)
    # a logged step: gen 0.5 s, update_actor 1 s for all 4 updates, 0.5 s else, a weight sync 0.3 s
    assert rows["P4xG8", "sync", 4]["responses_per_s"] == pytest.approx(32 / (0.5 + 1.0 + 0.5 + 0.3))
