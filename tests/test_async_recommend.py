"""`batchtune recommend` on async / off-policy probes (issue 30 item 5), on a tiny results directory built
here: the table and --json rank over (mode, P, G, k, u, split, in-flight cap) with intervals and say
whether async pays; a recipe without such knobs never reaches the async machinery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.recipe.load import load_recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import RunRecord, StepRecord

ROOT = Path(__file__).resolve().parents[1]
ASYNC = ROOT / "recipes" / "tiny-grpo-async.toml"
SYNC_SET = ["algorithm.mode=sync", "probe.staleness=[0]", "probe.updates_per_batch=[]"]

# label -> (P, k, u, crossing samples per seed, gen_s, train_s, sync_s per step)
ASYNC_RUNS = {
    "P2xG8": (2, 0, 1, (160, 224), 0.10, 0.05, 0.01),
    "P4xG8": (4, 0, 1, (224, 320), 0.18, 0.08, 0.01),
    "P2xG8-k0u2": (2, 0, 2, (128, 160), 0.10, 0.10, 0.01),
    "P2xG8-k1u1": (2, 1, 1, (192, 256), 0.12, 0.06, 0.01),
    "P4xG8-k1u1": (4, 1, 1, (256, 352), 0.20, 0.09, 0.01),
}


def _store(root: Path, overrides: list[str], runs: dict) -> Path:
    cfg = load_recipe(str(ASYNC), overrides)
    store = ResultsStore(root)
    store.write_manifest({"recipe": cfg.to_dict(), "source": str(ASYNC), "created": 0.0})
    for label, (p, k, u, cross, gen, train, sync) in runs.items():
        b = p * 8
        lr = cfg.optimizer.lr * (b / 16) ** 0.5
        for seed, at in enumerate(cross):
            rid = f"{label}-s{seed}"
            steps = []
            for i in range(0, 40):
                m = {"eval_reward": 0.5 + 0.45 * min(1.0, i * b / at)}
                m.update({"sync_s": sync} if i and sync else {})
                g, t = (gen, train) if i else (0.0, 0.0)
                steps.append(StepRecord(rid, i, i * b, 0, lr, p, 8, seed, m, gen_s=g, train_s=t))
            rec = RunRecord(
                rid, label, p, 8, seed, lr, "sqrt", cfg.optimizer.lr, 16, "completed", steps=39,
                samples=39 * b, staleness=k, updates_per_batch=u, parallel_runs=1,
            )  # fmt: skip
            store.add_finished_run(rec, steps)
    return root


def _recommend(results: Path, *extra: str) -> object:
    out = CliRunner().invoke(app, ["recommend", "-r", str(results), "--throughput", "probe", *extra])
    assert out.exit_code == 0, out.output
    return out


def test_recommend_ranks_async_and_offpolicy_candidates(tmp_path: Path) -> None:
    results = _store(tmp_path / "r", [], ASYNC_RUNS)
    data = json.loads(_recommend(results, "--json").stdout)
    joint = data["async_decision"]
    rows = joint["candidates"]
    assert {(r["staleness"], r["updates_per_batch"]) for r in rows} == {(0, 1), (0, 2), (1, 1)}
    assert {r["mode"] for r in rows} == {"sync", "async"}
    for r in rows:
        lo, hi = r["time_to_target_ci_s"]
        assert lo <= r["time_to_target_s"] <= hi and lo < hi  # two seeds: a real interval
        assert (r["mode"] == "sync") == (r["staleness"] == 0)
    times = [r["time_to_target_s"] for r in rows]
    assert times == sorted(times)  # best first
    assert joint["status"] in ("pays", "does not pay", "not decided")
    assert joint["verdict"] == joint["reasons"][-1]
    run_as = data["recommended"]["run_as"]
    assert run_as["name"] == data["recommended"]["name"]
    assert run_as["mode"] == next(r["mode"] for r in rows if r["name"] == run_as["name"])
    text = _recommend(results).stdout
    assert "Sync or async" in text and "Verdict:" in text and joint["verdict"].split(":")[0] in text


def test_async_pays_or_not_follows_the_samples(tmp_path: Path) -> None:
    # k = 1 needs 3x the samples: no throughput gain on one device makes that up
    slow = dict(ASYNC_RUNS)
    slow["P2xG8-k1u1"] = (2, 1, 1, (480, 672), 0.12, 0.06, 0.01)
    slow["P4xG8-k1u1"] = (4, 1, 1, (672, 960), 0.20, 0.09, 0.01)
    results = _store(tmp_path / "r", [], slow)
    data = json.loads(_recommend(results, "--json").stdout)
    assert data["async_decision"]["verdict"] == "async does not pay: R grows faster than throughput"
    assert data["recommended"]["run_as"]["mode"] == "sync"
    out = CliRunner().invoke(app, ["report", str(results), "--out", str(tmp_path / "rep")])
    assert out.exit_code == 0, out.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Sync or async" in md and "Verdict: async does not pay" in md


def test_a_sync_recipe_never_reaches_the_async_machinery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = {k: v for k, v in ASYNC_RUNS.items() if "-k" not in k}
    results = _store(tmp_path / "r", SYNC_SET, {k: (*v[:6], 0.0) for k, v in main.items()})

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sync path called the async machinery")

    import batchtune.analysis.decide.async_joint as aj
    import batchtune.workflow.joint as wj

    monkeypatch.setattr(wj, "joint_for", boom)
    monkeypatch.setattr(aj, "joint_decision", boom)
    data = json.loads(_recommend(results, "--json").stdout)
    assert "async_decision" not in data and "run_as" not in data["recommended"]
    assert "Sync or async" not in _recommend(results).stdout


def test_the_split_of_the_cluster_is_ranked_and_said_to_be_modelled(tmp_path: Path) -> None:
    results = _store(tmp_path / "r", [], ASYNC_RUNS)
    data = json.loads(_recommend(results, "--json", "--gpus", "8").stdout)
    split = data["async_decision"]["gpu_split"]
    assert split["total_gpus"] == 8 and split["modelled"] is True
    assert any("modelled, not measured" in n for n in split["notes"])
    rows = split["rows"]
    assert {r["rollout_gpus"] for r in rows if r["mode"] == "async"} == {2, 4, 6}
    assert all(r["reason"] for r in rows)
    times = [r["time_to_target_s"] for r in rows]
    assert times == sorted(times)
    run_as = data["recommended"]["run_as"]
    if run_as["mode"] == "async":  # the pick runs at its best modelled split of the 8 GPUs
        best = next(r for r in rows if r["name"] == run_as["name"])
        assert (run_as["rollout_gpus"], run_as["total_gpus"]) == (best["rollout_gpus"], 8)
    text = _recommend(results, "--gpus", "8").stdout
    assert "GPU split of 8 GPUs" in text and "modelled, not measured" in text
    one = json.loads(_recommend(results, "--json", "--gpus", "1").stdout)
    assert one["async_decision"]["gpu_split"] is None


def test_the_json_says_shared_colocated_or_a_split_as_the_table_does(tmp_path: Path) -> None:
    # one convention (docs/async.md, JSON): rollout_gpus is a number only for a real rollout:train
    # split; a shared-device async row and a colocated sync row carry null, and "split" says which in
    # the table's words, so a script never reads a shared row as a 1-GPU rollout
    results = _store(tmp_path / "r", [], ASYNC_RUNS)
    data = json.loads(_recommend(results, "--json", "--gpus", "8").stdout)
    joint = data["async_decision"]
    assert joint["total_gpus"] == 1  # the main ranking: the probe's one device
    for r in joint["candidates"]:
        assert r["rollout_gpus"] is None, r
        assert r["split"] == ("shared" if r["mode"] == "async" else "colocated")
    for r in joint["gpu_split"]["rows"]:  # the 8 GPUs, modelled: a real split, or colocated sync
        g = r["rollout_gpus"]
        assert r["split"] == ("colocated" if g is None else f"{g}:{8 - g}")
        assert (g is None) == (r["mode"] == "sync")
    run_as = data["recommended"]["run_as"]
    assert run_as == joint["pick"] and run_as["mode"] == "async"
    assert run_as["split"] == f"{run_as['rollout_gpus']}:{run_as['train_gpus']}"
    table = _recommend(results, "--gpus", "8").stdout
    shown = [line for line in table.splitlines() if "│ async" in line and "P4xG8-k1u1" in line]
    assert shown and "shared" in shown[0]
    one = json.loads(_recommend(results, "--json", "--gpus", "1").stdout)["recommended"]["run_as"]
    shared = (one["mode"], one["rollout_gpus"], one["train_gpus"], one["split"])
    assert shared == ("async", None, None, "shared")
    # an emitter splits the 8 GPUs as the modelled split says, never 1:7 from a shared row
    emitted = json.loads(_recommend(results, "--json", "--gpus", "8", "--emit", "verl").stdout)["emitted"]
    assert emitted["values"]["actor_rollout_ref.rollout.n_gpus_per_node"] == run_as["rollout_gpus"]


def test_run_as_and_the_rows_count_the_in_flight_cap_alike(tmp_path: Path) -> None:
    # one convention (docs/async.md, JSON): in_flight_cap is algorithm.in_flight_cap, 0 where no cap
    # binds (the staleness bound alone); the pick here is k = 1, where a queue of 1 is the bound itself
    results = _store(tmp_path / "r", [], ASYNC_RUNS)
    data = json.loads(_recommend(results, "--json", "--gpus", "8").stdout)
    run_as, joint = data["recommended"]["run_as"], data["async_decision"]
    assert (run_as["mode"], run_as["staleness"]) == ("async", 1)
    mine = next(r for r in joint["candidates"] if r["name"] == run_as["name"])
    split = next(
        r for r in joint["gpu_split"]["rows"]
        if (r["name"], r["rollout_gpus"]) == (run_as["name"], run_as["rollout_gpus"])
    )  # fmt: skip
    assert run_as["in_flight_cap"] == mine["in_flight_cap"] == split["in_flight_cap"] == 0
    k = {r["name"]: r["staleness"] for r in joint["candidates"]}
    for r in joint["candidates"] + joint["gpu_split"]["rows"]:  # a cap reported is one that binds
        assert r["in_flight_cap"] == 0 or r["in_flight_cap"] < k[r["name"]]
    text = _recommend(results, "--gpus", "8").stdout
    assert "the staleness bound alone (1 finished batch(es) queued)" in text


def test_recommend_plays_the_sweeps_timed_steps_and_says_so(tmp_path: Path) -> None:
    results = _store(tmp_path / "r", [], ASYNC_RUNS)
    before = json.loads(_recommend(results, "--json").stdout)["async_decision"]
    cells = {
        lab: {"staleness": k, "updates_per_batch": u, "step_time_s": 0.1, "kept": True, "reason": ""}
        for lab, (_, k, u, *_rest) in ASYNC_RUNS.items()
        if "-k" in lab
    }
    sweep = {
        "cells": cells, "times": {"P2xG8": [0.1, 0.05]}, "source": "timed here",
        "traces": {"P2xG8": {"gen": [0.05, 0.05, 0.05, 0.25], "train": [0.05] * 4}},
    }  # fmt: skip
    (results / "async_sweep.json").write_text(json.dumps(sweep))
    after = json.loads(_recommend(results, "--json").stdout)["async_decision"]

    def row(d: dict, name: str) -> dict:
        return next(r for r in d["candidates"] if r["name"] == name and r["in_flight_batches"] is None)

    assert row(before, "P2xG8-k1u1")["step_times"] == "mean"
    traced = row(after, "P2xG8-k1u1")
    assert traced["step_times"] == "trace"
    assert traced["responses_per_s"] < row(before, "P2xG8-k1u1")["responses_per_s"]  # a slow batch stalls
    assert row(after, "P4xG8-k1u1")["step_times"] == "mean"  # no timed steps at B = 32
    assert row(after, "P2xG8")["time_to_target_s"] == row(before, "P2xG8")["time_to_target_s"]
    assert any("timed steps' own times" in n for n in after["notes"])


def test_check_prices_an_async_config_at_its_own_candidate(tmp_path: Path) -> None:
    """`check` on the emitted pick (P4xG8 at k = 1) said time_to_target 3.98 s, the sync P4xG8's,
    beside a batch row naming the pick at 3.45 s: the on-policy curve priced the async config. It
    now takes the probe's own candidate at the config's batch, k and u (P4xG8-k1u1)."""
    results = _store(tmp_path / "r", [], ASYNC_RUNS)
    t = {
        c["name"]: c["time_to_target_s"]
        for c in json.loads(_recommend(results, "--json").stdout)["candidates"]
    }
    assert t["P4xG8-k1u1"] != pytest.approx(t["P4xG8"])
    lines = [
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.optim.lr=3e-4",
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.num_warmup_batches=1",
    ]
    cfg = tmp_path / "verl.sh"
    cfg.write_text("python3 -m verl.trainer.main_ppo \\\n" + "".join(f"    {x} \\\n" for x in lines) + "\n")
    out = CliRunner().invoke(app, ["check", str(cfg), "-r", str(results), "--format", "verl", "--json"])
    got = json.loads(out.stdout)["predicted_time_to_target"]["value"]
    assert got == pytest.approx(t["P4xG8-k1u1"]), out.stdout


@pytest.mark.parametrize("pick", ["async", "sync"])
def test_check_reads_back_the_file_recommend_emitted(tmp_path: Path, pick: str) -> None:
    """`recommend --emit X -o FILE` then `check FILE`, as written: the TRL AsyncGRPOConfig file was
    read as one process's batch (num_processes absent, and AsyncGRPOConfig(**yaml) refuses the key),
    4 completions, not the pick's 16 (a TypeError-free file that check refused as half a group)."""
    if pick == "async":
        results = _store(tmp_path / "r", [], ASYNC_RUNS)
    else:
        main = {k: v for k, v in ASYNC_RUNS.items() if "-k" not in k}
        results = _store(tmp_path / "r", SYNC_SET, {k: (*v[:6], 0.0) for k, v in main.items()})
    rec = json.loads(_recommend(results, "--json", "--gpus", "8").stdout)["recommended"]
    want = rec["prompts"] * rec["group_size"]
    assert rec.get("run_as", {}).get("mode", "sync") == pick
    for trainer in ("trl", "verl", "openrlhf"):
        out = tmp_path / f"{trainer}.cfg"
        _recommend(results, "--gpus", "8", "--emit", trainer, "-o", str(out))
        res = CliRunner().invoke(app, ["check", str(out), "-r", str(results), "--format", trainer, "--json"])
        assert res.exit_code == 0, (trainer, res.output)
        data = json.loads(res.stdout)
        assert data["config"]["batch_responses"] == want, (trainer, data["config"])
        checks = {c["name"]: c for c in data["checks"]}
        assert checks["batch"]["status"] == "pass" and "own pick" in checks["batch"]["message"], trainer
        if trainer == "trl":  # the process count comes from the file's own launch comment
            assert not any("1 process assumed" in n for n in data["notes"]), data["notes"]


def test_check_matches_the_config_s_own_shape_at_a_shared_batch() -> None:
    """P4xG8-k1u1 and P8xG4-k1u1 are both 32 responses: matching the batch and -k1u1 alone priced a
    P8xG4 config at whichever came first."""
    from types import SimpleNamespace as NS

    from batchtune.workflow.ci import _offpolicy_price

    def cand(label, p, g):
        return NS(label=label, family="offpolicy", batch_responses=32, prompts=p, group_size=g)

    rec = NS(
        efficiency=NS(candidates=[cand("P4xG8-k1u1", 4, 8), cand("P8xG4-k1u1", 8, 4)]),
        ranking=NS(
            candidates=[
                NS(name="P4xG8-k1u1", time_to_target_s=3.0),
                NS(name="P8xG4-k1u1", time_to_target_s=5.0),
            ]
        ),
    )

    def config(p, g):
        return NS(
            prompts=p, group_size=g, staleness=1, updates_per_batch=1, own_units=None, batch_responses=32
        )

    assert _offpolicy_price(rec, config(8, 4), 1, "s").time == 5.0
    missed = _offpolicy_price(rec, config(16, 2), 1, "s")  # the on-policy curve, said in one line
    assert missed.on_curve and len(missed.notes) == 1 and "P16xG2-k1u1" in missed.notes[0]


# an async probe of 2 mini-batches per rollout batch: its off-policy candidates are u = 2
U2_SET = ["algorithm.mini_batches=2", "probe.staleness=[0, 1]", "probe.updates_per_batch=[2]"]
U2_RUNS = {
    "P2xG8": (2, 0, 2, (160, 224), 0.10, 0.05, 0.01),
    "P4xG8": (4, 0, 2, (224, 320), 0.18, 0.08, 0.01),
    "P2xG8-k1u2": (2, 1, 2, (192, 256), 0.12, 0.06, 0.01),
    "P4xG8-k1u2": (4, 1, 2, (200, 280), 0.20, 0.09, 0.01),
}


def _check_json(cfg: Path, results: Path) -> dict:
    out = CliRunner().invoke(app, ["check", str(cfg), "-r", str(results), "--format", "trl", "--json"])
    assert out.exit_code in (0, 1, 3), out.output
    return json.loads(out.stdout)


def _trl_async(path: Path, per_device: int, max_staleness: int, weight_sync_steps: int) -> Path:
    path.write_text(
        "# accelerate launch --num_processes 1\n"
        f"per_device_train_batch_size: {per_device}\nnum_generations: 8\nlearning_rate: 0.0002\n"
        f"max_staleness: {max_staleness}\nweight_sync_steps: {weight_sync_steps}\n"
    )
    return path


def test_check_reads_an_emitted_trl_async_pick_of_two_updates_in_rollout_batches(tmp_path: Path) -> None:
    """The pick P4xG8-k1u2 emitted as an AsyncGRPOConfig (16 completions per optimiser step,
    weight_sync_steps 2, max_staleness 1) was read back as 16 responses at staleness 2, u 1: no
    candidate is labelled so, and check priced it on the on-policy curve at P2xG8 (2.28 s, not the
    pick's 1.83 s), and failed its LR (set for 32). It now reads B = 2 x 16, k = 1, u = 2."""
    results = _store(tmp_path / "r", U2_SET, U2_RUNS)
    data = json.loads(_recommend(results, "--json", "--gpus", "8").stdout)
    assert data["recommended"]["run_as"]["name"] == "P4xG8-k1u2"
    t = {c["name"]: c["time_to_target_s"] for c in data["candidates"]}
    out = tmp_path / "trl.yaml"
    _recommend(results, "--gpus", "8", "--emit", "trl", "-o", str(out))
    got = _check_json(out, results)
    assert got["config"]["batch_responses"] == 32, got["config"]
    assert got["predicted_time_to_target"]["value"] == pytest.approx(t["P4xG8-k1u2"])
    checks = {c["name"]: c["status"] for c in got["checks"]}
    assert checks["batch"] == checks["lr"] == "pass", got["checks"]
    assert any("priced at the probe's P4xG8-k1u2" in n for n in got["notes"]), got["notes"]
    assert not any("evidence's pick is" in n for n in got["notes"]), got["notes"]  # k and u are the pick's


def test_check_says_which_candidate_a_trl_async_config_missed(tmp_path: Path) -> None:
    """weight_sync_steps 4 is u = 4 at B = 32: the probe has no P4xG8-k1u4, and check says so in one
    line and what it priced instead (the on-policy curve at N = 32)."""
    results = _store(tmp_path / "r", U2_SET, U2_RUNS)
    t = {
        c["name"]: c["time_to_target_s"]
        for c in json.loads(_recommend(results, "--json").stdout)["candidates"]
    }
    got = _check_json(_trl_async(tmp_path / "a.yaml", 8, 1, 4), results)
    assert got["config"]["batch_responses"] == 32
    said = [n for n in got["notes"] if "P4xG8-k1u4" in n]
    assert len(said) == 1 and "on-policy curve's at N = 32" in said[0], got["notes"]
    assert got["predicted_time_to_target"]["value"] == pytest.approx(t["P4xG8"])


def test_check_prices_no_trl_async_config_it_cannot_place(tmp_path: Path) -> None:
    """Weights synced every 2 rollout batches: max_staleness 1 is k = 1 or 2, both measured
    (ambiguous); weight_sync_steps 3 is no whole number of steps per batch. Neither is priced."""
    runs = {
        "P2xG8": (2, 0, 1, (160, 224), 0.10, 0.05, 0.01),
        "P4xG8": (4, 0, 1, (224, 320), 0.18, 0.08, 0.01),
        "P2xG8-k1u1": (2, 1, 1, (192, 256), 0.12, 0.06, 0.01),
        "P2xG8-k2u1": (2, 2, 1, (200, 272), 0.12, 0.06, 0.01),
    }
    sync2 = ["algorithm.sync_every=2", "probe.staleness=[0, 1, 2]", "probe.updates_per_batch=[1]"]
    results = _store(tmp_path / "r", sync2, runs)
    both = _check_json(_trl_async(tmp_path / "a.yaml", 16, 1, 2), results)
    assert both["predicted_time_to_target"]["value"] is None
    said = [n for n in both["notes"] if "P2xG8-k1u1 and P2xG8-k2u1" in n]
    assert len(said) == 1 and "no time-to-target is priced" in said[0], both["notes"]
    odd = _check_json(_trl_async(tmp_path / "b.yaml", 16, 1, 3), results)
    assert odd["predicted_time_to_target"]["value"] is None
    said = [n for n in odd["notes"] if "weight_sync_steps=3" in n]
    assert len(said) == 1 and "no time-to-target is priced" in said[0], odd["notes"]


def test_run_as_names_the_split_emitted_when_the_trainer_cannot_take_the_best(tmp_path: Path) -> None:
    """Here the split model ranks 12:4 of 16 GPUs first for P2xG8-k1u1 (generation scales worse than
    training over the measured batches), which verl cannot lay out on nodes of 8, so `--emit verl`
    writes 8:8. `recommended.run_as` and the "Run it" line still said 12:4, against the file the user
    was handed; they now name 8:8 and say why the model's best was not taken. Without --emit: 12:4."""
    runs = {**ASYNC_RUNS, "P4xG8": (4, 0, 1, (224, 320), 0.16, 0.10, 0.01)}
    runs["P4xG8-k1u1"] = (4, 1, 1, (256, 352), 0.18, 0.11, 0.01)
    results = _store(tmp_path / "r", [], runs)
    plain = json.loads(_recommend(results, "--json", "--gpus", "16").stdout)
    mine = [r for r in plain["async_decision"]["gpu_split"]["rows"] if r["name"] == "P2xG8-k1u1"]
    assert [r["split"] for r in mine] == ["12:4", "8:8", "4:12"]  # the model's order, and so the case
    modelled = plain["recommended"]["run_as"]
    assert modelled["split"] == "12:4" and "split_note" not in modelled
    data = json.loads(_recommend(results, "--json", "--gpus", "16", "--emit", "verl").stdout)
    run_as, values = data["recommended"]["run_as"], data["emitted"]["values"]
    assert (values["actor_rollout_ref.rollout.n_gpus_per_node"], values["trainer.n_gpus_per_node"]) == (8, 8)
    assert (run_as["rollout_gpus"], run_as["train_gpus"], run_as["split"]) == (8, 8, "8:8")
    assert "modelled best split 12:4" in run_as["split_note"] and "nodes of 8" in run_as["split_note"]
    assert run_as == data["async_decision"]["pick"]
    assert data["async_decision"]["gpu_split"]["rows"] == plain["async_decision"]["gpu_split"]["rows"]
    text = " ".join(_recommend(results, "--gpus", "16", "--emit", "verl").stdout.split())
    run_it = text[text.index("Run it async") :].split(" stage times:")[0]
    assert "8 rollout GPU(s) : 8 training GPU(s)" in run_it and "12 rollout GPU(s)" not in run_it
    assert "The modelled best split 12:4 (rollout:train) cannot be emitted for verl" in run_it


def test_an_off_policy_probe_whose_reference_never_reaches_the_target_shows_its_tables(tmp_path):
    """An off-policy probe whose reference never reached the target stopped at once with "no ratio
    to it exists" (exit 3, no table): its k >= 1 candidates asked for a ratio to R0 = inf. They are
    now inconclusive, as the main sweep's batches are, and the probe shows its tables, then exits 3
    as a sync probe does (README, exit codes); `smoke` of the async recipe says its probe ran."""
    sets = ["--set", "probe.staleness=[0, 1]", "--set", "budget.max_samples=2048"]
    out = CliRunner().invoke(app, ["probe", "nqm", "--results", str(tmp_path / "r"), *sets])
    assert out.exit_code == 3, out.output
    text = " ".join(out.output.split())
    assert "Sample efficiency" in text and "no ratio to it exists" not in text
    assert "critical training batch not estimated: reference batch 8 never reached the target" in text
