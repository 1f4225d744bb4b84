"""`recommend --emit` of an async pick, then `check` of the file it wrote, against the same async probe:
the config is read back at the pick's own candidate (batch, LR, staleness k, updates u) and priced at
its time-to-target, for each trainer's async form and probes whose weights sync every 1 or 2 rollout
batches (``algorithm.sync_every``) with 1 or 2 mini-batches (u)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from tests.test_async_recommend import _recommend, _store


def _probe(root: Path, sync_every: int, u: int) -> Path:
    """An async probe whose pick is P4xG8-k1u{u}: k = 1 keeps sync_every <= k + 1."""
    sets = [
        f"algorithm.sync_every={sync_every}",
        f"algorithm.mini_batches={u}",
        "probe.staleness=[0, 1]",
        f"probe.updates_per_batch=[{u}]",
    ]
    runs = {
        "P2xG8": (2, 0, u, (160, 224), 0.10, 0.05, 0.01),
        "P4xG8": (4, 0, u, (224, 320), 0.18, 0.08, 0.01),
        f"P2xG8-k1u{u}": (2, 1, u, (192, 256), 0.12, 0.06, 0.01),
        f"P4xG8-k1u{u}": (4, 1, u, (200, 280), 0.20, 0.09, 0.01),
    }
    return _store(root, sets, runs)


def _emit_fully_async(results: Path, out: Path) -> None:
    """verl's fully_async trainer, which `recommend --emit verl` names in a note (by API here)."""
    from batchtune.integrations.emit import emit_for_recommendation
    from batchtune.workflow.loading import load
    from batchtune.workflow.recommend import recommend_from_args, write_emitted

    rec, _, _ = recommend_from_args(results=str(results), throughput="probe", gpus=8, plot=False)
    cfg = load(None, [], str(results), stored=True)
    e = emit_for_recommendation(rec, "verl", 8, cfg, async_trainer="fully_async")
    write_emitted("verl", e.text, e.values, out)


@pytest.mark.parametrize("trainer", ["verl", "verl-fully_async", "openrlhf"])
@pytest.mark.parametrize(("sync_every", "u"), [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_an_emitted_async_pick_checks_back_at_its_own_candidate(
    tmp_path: Path, trainer: str, sync_every: int, u: int
) -> None:
    """verl fully_async counts a sync interval (sync_every batches) as its batch and its k and u per
    interval: read so, the pick P4xG8-k1u1 of a probe syncing every 2 batches came back as 64 responses
    at staleness 0, u 2: its batch and LR failed, and on the on-policy curve beyond the measured
    batches it had no time-to-target. Each form now checks back at P4xG8-k1u{u}: batch and LR pass,
    time-to-target the pick's, no note that k or u differ. V1 and OpenRLHF sync weights after every
    step: against a probe that synced every 2 batches, one note says that difference is not priced
    (check said nothing of it)."""
    results = _probe(tmp_path / "r", sync_every, u)
    data = json.loads(_recommend(results, "--json", "--gpus", "8").stdout)
    pick = data["recommended"]["run_as"]["name"]
    assert pick == f"P4xG8-k1u{u}"
    t = {c["name"]: c["time_to_target_s"] for c in data["candidates"]}
    out, fmt = tmp_path / "emitted.yaml", trainer.split("-")[0]
    if trainer == "verl-fully_async":
        _emit_fully_async(results, out)
    else:
        _recommend(results, "--gpus", "8", "--emit", fmt, "-o", str(out))
    run = CliRunner().invoke(app, ["check", str(out), "-r", str(results), "--format", fmt, "--json"])
    assert run.exit_code == 0, run.output
    got = json.loads(run.stdout)
    assert got["config"]["batch_responses"] == 32, got["config"]
    checks = {c["name"]: c["status"] for c in got["checks"]}
    assert checks["batch"] == checks["lr"] == "pass", got["checks"]
    assert got["predicted_time_to_target"]["value"] == pytest.approx(t[pick])
    assert any(f"priced at the probe's {pick}" in n for n in got["notes"]), got["notes"]
    assert not any("evidence's pick is" in n for n in got["notes"]), got["notes"]  # k and u are the pick's
    every_step = [n for n in got["notes"] if "syncs weights after every step" in n]  # V1 and OpenRLHF do
    assert len(every_step) == (sync_every > 1 and trainer != "verl-fully_async"), got["notes"]
    assert all(f"the probe's {pick} synced every {sync_every}" in n for n in every_step), every_step


def test_check_prices_no_fully_async_config_it_cannot_place(tmp_path: Path) -> None:
    """Weights synced every 2 rollout batches: a fully_async interval of 3 updates is no whole number
    of batches. check says so in one line and prices no time-to-target."""
    results = _probe(tmp_path / "r", 2, 1)
    cfg = tmp_path / "fa.txt"
    cfg.write_text(
        "data.train_batch_size=0\nactor_rollout_ref.rollout.n=8\nactor_rollout_ref.actor.optim.lr=0.0002\n"
        "actor_rollout_ref.actor.ppo_mini_batch_size=4\nasync_training.trigger_parameter_sync_step=3\n"
        "async_training.require_batches=1\nasync_training.staleness_threshold=0\n"
    )
    run = CliRunner().invoke(app, ["check", str(cfg), "-r", str(results), "--format", "verl", "--json"])
    assert run.exit_code in (0, 1, 3), run.output
    got = json.loads(run.stdout)
    assert got["predicted_time_to_target"]["value"] is None
    said = [n for n in got["notes"] if "verl fully_async has no reading" in n]
    assert len(said) == 1 and "3 updates" in said[0], got["notes"]
    assert "no time-to-target is priced" in said[0]


def _profiled(root: Path, sync_every: int) -> Path:
    """The probe with the shipped NQM generation profile (knee 256), so check's concurrency check runs."""
    results = _probe(root, sync_every, 1)
    evidence = Path(__file__).resolve().parents[1] / "examples/ci/evidence/nqm"
    shutil.copy(evidence / "throughput.jsonl", results / "throughput.jsonl")
    shutil.copytree(evidence / "profiles", results / "profiles")
    return results


@pytest.mark.parametrize("sync_every", [1, 2])
def test_fully_async_concurrency_is_what_its_rollouter_keeps_in_flight(
    tmp_path: Path, sync_every: int
) -> None:
    """verl fully_async streams prompts: its rollouter keeps min(engines x concurrent_samples_per_replica,
    (1 + staleness_threshold) x sync interval) prompts in flight, here 8 of 8 responses over 3 engines
    (22 per engine) for the pick P4xG8-k1u1 synced every 1 (t = 1) or 2 (t = 0) batches. check capped
    the knee at a step's share, 11 per engine, and said nothing when max_num_seqs = 16 held each engine
    below what it is sent; its note said 22 with sync_every 2 and 11 with 1."""
    results = _profiled(tmp_path / "r", sync_every)
    out = tmp_path / "fa.txt"
    _emit_fully_async(results, out)
    text = out.read_text()
    assert f"staleness_threshold={2 - sync_every:g}.0" in text and "max_num_seqs" not in text
    out.write_text(text + "actor_rollout_ref.rollout.max_num_seqs=16\n")
    run = CliRunner().invoke(app, ["check", str(out), "-r", str(results), "--format", "verl", "--json"])
    assert run.exit_code == 0, run.output
    got = json.loads(run.stdout)
    conc = next(c for c in got["checks"] if c["name"] == "generation_concurrency")
    assert conc["status"] == "warn" and conc["configured"] == "16", conc
    assert conc["expected"].startswith(">= 22 (the 22 responses of an engine's share of what the"), conc
    said = [n for n in got["notes"] if "in flight per engine" in n]
    assert len(said) == 1 and "= 8 prompts, 64 responses, in flight over 3 engines" in said[0], said
    assert "at most 22 in flight per engine" in said[0], said


FULLY_ASYNC = (
    "data.train_batch_size=0\nactor_rollout_ref.rollout.n=8\nactor_rollout_ref.actor.optim.lr=0.0002\n"
    "actor_rollout_ref.actor.ppo_mini_batch_size=4\nasync_training.trigger_parameter_sync_step=2\n"
    "async_training.require_batches=1\nasync_training.staleness_threshold=0\n"
)
TRL_ASYNC = (
    "# accelerate launch --num_processes 1\nper_device_train_batch_size: 16\ngradient_accumulation_steps: 1\n"
    "num_generations: 8\nlearning_rate: 0.0002\nmax_staleness: 1\nweight_sync_steps: 2\n"
)
TRL_GEN = (
    "generation_batch_size: 32\nnum_generations: 8\nper_device_train_batch_size: 16\nlearning_rate: 0.0002\n"
)


BAD_COUNTS = [
    ("verl", FULLY_ASYNC, "async_training.trigger_parameter_sync_step", "0"),
    ("verl", FULLY_ASYNC, "async_training.require_batches", "0"),
    ("verl", FULLY_ASYNC, "async_training.trigger_parameter_sync_step", "-2"),
    ("verl", FULLY_ASYNC, "async_training.require_batches", "1.5"),
    ("verl", FULLY_ASYNC, "actor_rollout_ref.actor.ppo_epochs", "0"),
    ("trl", TRL_ASYNC, "weight_sync_steps", "0"),
    ("trl", TRL_ASYNC, "weight_sync_steps", "-2"),
    ("trl", TRL_ASYNC, "gradient_accumulation_steps", "0"),
    ("trl-gen", TRL_GEN, "gradient_accumulation_steps", "0"),
    ("trl-gen", TRL_GEN, "per_device_train_batch_size", "0"),
]


@pytest.mark.parametrize(
    ("fmt", "base", "key", "value"),
    [pytest.param(*case, id=f"{case[0]}-{case[2]}={case[3]}") for case in BAD_COUNTS],
)
def test_check_refuses_a_sync_interval_or_count_of_zero_naming_its_key(
    tmp_path: Path, fmt: str, base: str, key: str, value: str
) -> None:
    """A verl fully_async interval of trigger_parameter_sync_step x require_batches x
    ppo_mini_batch_size = 0 prompts crashed check ("internal error: ZeroDivisionError", exit 70), as
    did a GRPOConfig with gradient_accumulation_steps or per_device_train_batch_size 0 beside its
    generation_batch_size; an AsyncGRPOConfig's weight_sync_steps 0 and a ppo_epochs 0 were priced
    as settings. Each is bad input: one line naming the key and its line, exit 2."""
    results = _probe(tmp_path / "r", 2, 1)
    if fmt == "verl":
        lines = [ln for ln in base.splitlines() if not ln.startswith(key + "=")] + [f"{key}={value}"]
        cfg = tmp_path / "fa.txt"
    else:
        lines = [ln for ln in base.splitlines() if not ln.startswith(key + ":")] + [f"{key}: {value}"]
        cfg = tmp_path / "trl.yaml"
    cfg.write_text("\n".join(lines) + "\n")
    run = CliRunner().invoke(app, ["check", str(cfg), "-r", str(results), "--format", fmt.split("-")[0]])
    assert run.exit_code == 2, run.output
    shown = repr(value) if fmt == "verl" else value  # an override's text, a YAML number
    assert run.output.strip().splitlines() == [
        f"error: {cfg}:{len(lines)}: {key} = {shown} must be a positive whole number"
    ], run.output


V1_ASYNC = (
    "data.train_batch_size=4\nactor_rollout_ref.rollout.n=8\nactor_rollout_ref.actor.optim.lr=0.0002\n"
    "actor_rollout_ref.actor.ppo_mini_batch_size=4\ntrainer.v1.trainer_mode=separate_async\n"
    "trainer.v1.separate_async.num_warmup_batches=1\n"
)
OPENRLHF = (
    "python3 -m openrlhf.cli.train_ppo_ray \\\n --rollout.batch_size 4 \\\n"
    " --rollout.n_samples_per_prompt 8 \\\n"
    " --train.batch_size 32 \\\n --actor.adam.lr 0.0002 \\\n --train.async_enable \\\n"
)
WHOLE, AT_LEAST_0 = "a positive whole number", "a whole number >= 0"
BAD_SETTINGS = [
    ("openrlhf", OPENRLHF, "--train.max_epochs", "0", WHOLE),
    ("openrlhf", OPENRLHF, "--train.max_epochs", "-1", WHOLE),
    ("trl", TRL_ASYNC, "max_staleness", "-1", AT_LEAST_0),
    ("verl", FULLY_ASYNC, "async_training.staleness_threshold", "-0.5", "a number >= 0"),
    ("verl", FULLY_ASYNC, "async_training.concurrent_samples_per_replica", "0", WHOLE),
    ("verl", FULLY_ASYNC, "async_training.concurrent_samples_per_replica", "-4", WHOLE),
    ("verl", V1_ASYNC, "trainer.v1.separate_async.num_warmup_batches", "-1", AT_LEAST_0),
]


@pytest.mark.parametrize(
    ("fmt", "base", "key", "value", "what"),
    [pytest.param(*case, id=f"{case[0]}-{case[2]}={case[3]}") for case in BAD_SETTINGS],
)
def test_check_refuses_a_count_or_bound_below_its_least_naming_its_key(
    tmp_path: Path, fmt: str, base: str, key: str, value: str, what: str
) -> None:
    """An OpenRLHF --train.max_epochs of 0 or -1 was read as 0 (or -1) updates per batch and failed as
    a mismatch (exit 1); TRL's max_staleness -1 (every completion dropped as stale), a verl
    fully_async staleness_threshold below 0 or concurrent_samples_per_replica of 0 or less, and a V1
    num_warmup_batches below 0 were read and priced. Each is bad input: one line naming the key and
    its line, exit 2. (0 is a valid max_staleness, staleness_threshold and num_warmup_batches.)"""
    results = _probe(tmp_path / "r", 1, 1)
    if fmt == "verl":
        lines = [ln for ln in base.splitlines() if not ln.startswith(key + "=")] + [f"{key}={value}"]
    elif fmt == "trl":
        lines = [ln for ln in base.splitlines() if not ln.startswith(key + ":")] + [f"{key}: {value}"]
    else:
        lines = [*base.splitlines(), f" {key} {value}"]
    cfg = tmp_path / f"cfg.{'txt' if fmt == 'verl' else 'yaml' if fmt == 'trl' else 'sh'}"
    cfg.write_text("\n".join(lines) + "\n")
    run = CliRunner().invoke(app, ["check", str(cfg), "-r", str(results), "--format", fmt])
    assert run.exit_code == 2, run.output
    shown = value if fmt == "trl" else repr(value)  # a YAML number, an override's or flag's text
    assert run.output.strip().splitlines() == [f"error: {cfg}:{len(lines)}: {key} = {shown} must be {what}"]
    zero = {
        "max_staleness",
        "async_training.staleness_threshold",
        "trainer.v1.separate_async.num_warmup_batches",
    }
    if key in zero:  # 0 is read, not refused
        cfg.write_text("\n".join([*lines[:-1], lines[-1].replace(value, "0")]) + "\n")
        run = CliRunner().invoke(app, ["check", str(cfg), "-r", str(results), "--format", fmt])
        assert run.exit_code in (0, 1, 3), run.output


NULL_DEFAULTS = {  # TRL's GRPOConfig defaults steps_per_generation and generation_batch_size to None
    "spg": TRL_GEN + "steps_per_generation: null\n",
    "gen": "num_generations: 8\nper_device_train_batch_size: 16\nlearning_rate: 0.0002\n"
    "generation_batch_size: null\nsteps_per_generation: 2\n",
    "both": "num_generations: 8\nper_device_train_batch_size: 32\nlearning_rate: 0.0002\n"
    "generation_batch_size: null\nsteps_per_generation: null\n",
    "sync": TRL_ASYNC.replace("weight_sync_steps: 2", "weight_sync_steps: null"),
}


@pytest.mark.parametrize("case", sorted(NULL_DEFAULTS))
def test_check_reads_a_trl_null_as_the_default(tmp_path: Path, case: str) -> None:
    """A TRL config spelling a default as YAML null (`steps_per_generation: null`, `weight_sync_steps:
    null`, `generation_batch_size: null`) was refused: "... = None is not a number", exit 2. A null
    is now the setting left out: check reads the config as it reads it without that line."""
    results = _probe(tmp_path / "r", 2, 1)
    text = NULL_DEFAULTS[case]
    runs, omitted = [], "".join(ln for ln in text.splitlines(True) if "null" not in ln)
    for name, body in (("null", text), ("omitted", omitted)):
        cfg = tmp_path / name / "trl.yaml"
        cfg.parent.mkdir()
        cfg.write_text(body)
        run = CliRunner().invoke(app, ["check", str(cfg), "-r", str(results), "--format", "trl"])
        runs.append((run.exit_code, run.output.replace(str(cfg), "CFG")))
    assert runs[0][0] in (0, 1) and "None" not in runs[0][1], runs[0][1]
    assert runs[0] == runs[1]
