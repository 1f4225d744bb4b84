"""Imported runs at k = 0 and their updates per rollout batch u, per batch shape (P, G): with verl's
fixed ``ppo_mini_batch_size`` u grows with the batch (P4 at u = 1, P16 at u = 4 in an ordinary batch
sweep), so each shape's on-policy runs are the reference for that shape alone
(records/types.on_policy_updates, integrations/convert.label_apart)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.integrations.common import RunInfo
from batchtune.integrations.readers import import_runs, read_log
from batchtune.integrations.trainer_configs import read_trainer_config
from batchtune.records.store import ResultsStore
from tests.integrations.test_async_logs import _verl_log

U = {4: 1, 16: 4}  # verl at ppo_mini_batch_size = 4 prompts: u = P / 4


def _csv(tmp_path: Path, p: int, seed: int) -> Path:
    """A log of P{p}xG8: reward 0.5 -> 0.95, P16 in fewer responses per step than 4x P4's."""
    slope = (0.021 if p == 4 else 0.036) * (1 + 0.01 * seed)
    rows = "".join(f"{s},{8 * p * s},{min(0.5 + slope * s, 0.95):.4f},0.6,1e-6\n" for s in range(40))
    path = tmp_path / f"p{p}s{seed}.csv"
    path.write_text("step,samples,reward,step_s,lr\n" + rows)
    return path


def _sweep(tmp_path: Path) -> str:
    """P4xG8 at u = 1 and P16xG8 at u = 4, two seeds each, imported one file at a time."""
    from batchtune.workflow.imports import import_logs

    res = str(tmp_path / "res")
    for p, u in U.items():
        for seed in (0, 1):
            info = RunInfo(prompts=p, group_size=8, seed=seed, updates_per_batch=u)
            import_logs([_csv(tmp_path, p, seed)], "csv", res, info, metric="reward", target=0.7)
    return res


def test_a_batch_sweep_at_a_fixed_mini_batch_keeps_every_batch_on_policy(tmp_path):
    """The directory's one on-policy u (P4's, 1) relabelled P16xG8 at u = 4 P16xG8-k0u4: it dropped
    out of the on-policy curve and recommend said "critical batch not estimated". Each shape's own
    on-policy runs are now its reference: P4xG8 and P16xG8, and a critical batch is estimated. The
    emitted config of the winner trains at the u of its own runs."""
    res = _sweep(tmp_path)
    assert {r.candidate: r.updates_per_batch for r in ResultsStore(res).runs()} == {"P4xG8": 1, "P16xG8": 4}
    out = CliRunner().invoke(app, ["recommend", "-r", res, "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    assert [c["name"] for c in got["candidates"]] == ["P4xG8", "P16xG8"]
    assert got["critical_training_batch"] is not None
    winner = got["recommended"]["name"]
    cfg = tmp_path / "verl.yaml"
    out = CliRunner().invoke(app, ["recommend", "-r", res, "--emit", "verl", "-o", str(cfg)])
    assert out.exit_code == 0, out.output
    assert read_trainer_config(cfg, "verl").updates_per_batch == U[int(winner[1:].split("x")[0])]


def test_one_import_of_several_shapes_keeps_each_shapes_smallest_u(tmp_path):
    """One batch of runs (import_runs): a shape's on-policy reference is the smallest u of its own
    runs at k = 0; a run of that shape at another u is P{p}xG{g}-k0u{u}, whatever the other shapes
    ran at."""
    runs = [
        *read_log(_csv(tmp_path, 4, 0), "csv", RunInfo(prompts=4, group_size=8, run_id="a")),
        *read_log(_csv(tmp_path, 16, 0), "csv", RunInfo(prompts=16, group_size=8, updates_per_batch=4)),
        *read_log(_csv(tmp_path, 16, 1), "csv", RunInfo(prompts=16, group_size=8, updates_per_batch=8)),
    ]
    store = ResultsStore(tmp_path / "res")
    import_runs(store, runs)
    assert {r.run_id: r.candidate for r in store.runs()} == {
        "a": "P4xG8",
        "p16s0": "P16xG8",
        "p16s1": "P16xG8-k0u8",
    }


def test_async_runs_of_a_shape_rank_against_that_shapes_on_policy_u(tmp_path):
    """verl logs: P4xG8 on-policy at u = 1, P16xG8 on-policy at u = 4 and async at k = 1, u = 4. The
    joint decision took one u for the directory (1), so P16 had no sync row and its async runs were
    not ranked; each shape's async rows are now set against its own on-policy runs."""
    from batchtune.workflow.imports import import_logs

    res = str(tmp_path / "res")
    for p, k in ((4, 0), (16, 0), (16, 1)):
        for seed in (0, 1):
            path = tmp_path / f"p{p}k{k}s{seed}.jsonl"
            path.write_text(_verl_log(tmp_path, fully_async=k == 1).read_text())
            info = RunInfo(prompts=p, group_size=8, seed=seed, staleness=k, updates_per_batch=U[p])
            import_logs([path], "verl", res, info, metric="reward", target=0.3)
    assert {r.candidate for r in ResultsStore(res).runs()} == {"P4xG8", "P16xG8", "P16xG8-k1u4"}
    out = CliRunner().invoke(app, ["recommend", "--results", res, "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["async_decision"]["candidates"]
    rows = {(r["name"], r["mode"], r["updates_per_batch"]) for r in rows}
    assert {("P4xG8", "sync", 1), ("P16xG8", "sync", 4), ("P16xG8-k1u4", "async", 4)} <= rows


# a probe at 2 mini-batches, label: (P, k, u, samples to target per seed, gen s, train s, sync s)
PROBE_RUNS = {
    "P2xG8": (2, 0, 2, (160, 224), 0.10, 0.05, 0.01),
    "P4xG8": (4, 0, 2, (224, 320), 0.18, 0.08, 0.01),
    "P2xG8-k1u2": (2, 1, 2, (192, 256), 0.12, 0.06, 0.01),
    "P4xG8-k1u2": (4, 1, 2, (200, 280), 0.20, 0.09, 0.01),
}


@pytest.mark.parametrize("old_id", ["oldimport", "0-oldimport"])  # after the probe's run ids, before
def test_a_log_imported_at_u1_beside_a_probe_leaves_the_probes_u(tmp_path, old_id):
    """A probe at algorithm.mini_batches = 2 and one on-policy log imported at u = 1 under the plain
    P2xG8 (as import-logs did before it split other u apart). The on-policy u was the smallest of
    every plain run's, 1, so no probe run matched it: recommend exited 3, "no on-policy candidate with
    an estimate and timings to rank async runs against". The probe's u is the reference where its
    runs are; a new import at u = 1 is P2xG8-k0u1."""
    from tests.test_async_recommend import _store

    sets = ["algorithm.mini_batches=2", "probe.staleness=[0, 1]", "probe.updates_per_batch=[2]"]
    store = ResultsStore(_store(tmp_path / "res", sets, PROBE_RUNS))
    rec, steps = store.run("P2xG8-s0"), store.steps("P2xG8-s0")
    old = dataclasses.replace(rec, run_id=old_id, seed=7, updates_per_batch=1, source="old.jsonl")
    store.add_finished_run(old, [dataclasses.replace(s, run_id=old_id, seed=7) for s in steps])
    out = CliRunner().invoke(app, ["recommend", "-r", str(store.root), "--throughput", "probe", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["async_decision"]["candidates"]
    rows = {(r["name"], r["mode"], r["updates_per_batch"]) for r in rows}
    assert {("P2xG8", "sync", 2), ("P4xG8", "sync", 2)} <= rows
    (new,) = read_log(_csv(tmp_path, 2, 3), "csv", RunInfo(prompts=2, group_size=8, seed=3))
    import_runs(store, [new])
    assert store.run("p2s3").candidate == "P2xG8-k0u1"
