"""Branching the user's own trainer: the command backend's checkpoint contract (save args, where the
checkpoint lies, resume args, the samples axis of a resumed run) and a branched probe through it."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path

import pytest

from batchtune.backends.command import CommandBackend
from batchtune.backends.command_args import placeholders
from batchtune.backends.command_checkpoints import CHECKPOINT_META
from batchtune.backends.spec import Candidate, RunFailed, RunSpec
from batchtune.errors import RecipeError
from batchtune.recipe.load import load_recipe

# A real (tiny) trainer in numpy: linear regression by Adam on fresh Gaussian data each step, one
# JSON line per step (its own step count, samples as it sees them: step x batch, and reward =
# 1 / (1 + the held-out error of its weights)). With
# --save_every K it saves weights, Adam moments, its RNG and the step to <ckpt_dir>/step_<k>.json;
# with --resume PATH it loads them and goes on counting steps from there, as verl/TRL/OpenRLHF do.
TRAIN = textwrap.dedent(
    """
    import argparse, json, os, time
    import numpy as np
    p = argparse.ArgumentParser()
    for name in ("prompts", "group_size", "seed", "max_steps", "save_every"):
        p.add_argument("--" + name, type=int, default=0)
    p.add_argument("--lr", type=float)
    p.add_argument("--out")
    p.add_argument("--ckpt_dir", default="")
    p.add_argument("--resume", default="")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--restore_lr", action="store_true")  # as a restored LR scheduler does
    a = p.parse_args()
    n = a.prompts * a.group_size
    w_true = np.random.default_rng(1234).normal(size=8)
    x_eval = np.random.default_rng(99).normal(size=(256, 8))
    rng = np.random.default_rng(a.seed)
    w, m, v, step = np.zeros(8), np.zeros(8), np.zeros(8), 0
    if a.resume:
        st = json.load(open(a.resume))
        w, m, v, step = np.array(st["w"]), np.array(st["m"]), np.array(st["v"]), st["step"]
        if a.restore_lr:
            a.lr = st["lr"]
        if st["seed"] == a.seed:
            rng.bit_generator.state = st["rng"]
        else:
            rng = np.random.default_rng([a.seed, step])
    with open(os.path.join(a.out, "log.jsonl"), "w") as log:
        while step < a.max_steps:
            step += 1
            x = rng.normal(size=(n, 8))
            y = x @ w_true + rng.normal(size=n)
            err = x @ w - y
            loss = float((err ** 2).mean())
            g = 2 * x.T @ err / n
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            w = w - a.lr * (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-8)
            eval_loss = float(((x_eval @ (w - w_true)) ** 2).mean())  # held out, noise-free
            row = {"step": step, "samples": step * n, "prompts": a.prompts, "group_size": a.group_size,
                   "lr": a.lr, "seed": a.seed, "reward": 1 / (1 + eval_loss), "loss": loss}
            if a.save_every and step % a.save_every == 0:
                os.makedirs(a.ckpt_dir, exist_ok=True)
                st = {"w": w.tolist(), "m": m.tolist(), "v": v.tolist(), "step": step, "seed": a.seed,
                      "rng": rng.bit_generator.state, "lr": a.lr}
                json.dump(st, open(os.path.join(a.ckpt_dir, f"step_{step}.json"), "w"))
            log.write(json.dumps(row) + "\\n")  # after the save, as verl and TRL log after saving
            log.flush()
            time.sleep(a.sleep)
    """
)

ARGV = [
    "PY", "SCRIPT", "--prompts", "{prompts}", "--group_size", "{group_size}", "--lr", "{lr}",
    "--seed", "{seed}", "--max_steps", "{max_steps}", "--out", "{output_dir}",
]  # fmt: skip
CHECKPOINTS = {
    "checkpoint_path": "{output_dir}/ckpts/step_{step}.json",
    "command_save_args": ["--save_every", "{save_every_steps}", "--ckpt_dir", "{output_dir}/ckpts"],
    "command_resume_args": ["--resume", "{resume_from}"],
}


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    return script


def _backend_sets(tmp_path: Path, **backend) -> list[str]:
    script = _script(tmp_path)
    argv = [sys.executable if a == "PY" else str(script) if a == "SCRIPT" else a for a in ARGV]
    fields = {"command": argv, "command_log": "log.jsonl", **CHECKPOINTS, **backend}
    return ["backend.training=command", *(f"backend.{k}={json.dumps(v)}" for k, v in fields.items())]


def make_spec(
    tmp_path: Path, prompts: int, seed: int, max_samples: int, lr: float = 0.05, backend=None, **extra
) -> RunSpec:
    sets = _backend_sets(tmp_path, **(backend or {}))
    recipe = load_recipe(None, [f"budget.max_samples={max_samples}", *sets])
    cand = Candidate(f"P{prompts}xG4", prompts, 4, lr, "sqrt")
    rid = f"{cand.label}-s{seed}-{len(list(tmp_path.glob('runs/*')))}"
    return RunSpec(rid, cand, seed, recipe, tmp_path / "runs" / rid, 0.05, 8, **extra)


def run(spec: RunSpec) -> list:
    return list(CommandBackend().train(spec))


def test_trunk_saves_and_a_branch_resumes_on_the_cumulative_samples_axis(tmp_path):
    ckpts = tmp_path / "ckpts"
    trunk = run(make_spec(tmp_path, 2, 3, 48, save_at_samples=(16, 32), checkpoint_dir=ckpts))
    assert [(s.step, s.samples) for s in trunk] == [(k, 8 * k) for k in range(1, 7)]
    meta = json.loads((ckpts / "ckpt-16" / CHECKPOINT_META).read_text())
    assert (meta["samples"], meta["step"]) == (16, 2) and Path(meta["path"]).name == "step_2.json"
    assert json.loads((ckpts / "ckpt-32" / CHECKPOINT_META).read_text())["step"] == 4

    # the same seed and batch from the checkpoint at 16 samples repeats the trunk's steps 3-6
    same = run(make_spec(tmp_path, 2, 3, 48, resume_from=ckpts / "ckpt-16"))
    assert [(s.step, s.samples) for s in same] == [(k, 8 * k) for k in range(3, 7)]
    assert [s.metrics["reward"] for s in same] == pytest.approx([s.metrics["reward"] for s in trunk[2:]])

    # a branch at twice the batch: 16 samples a step counted from the checkpoint, not from zero
    spec = make_spec(tmp_path, 4, 3, 64, resume_from=ckpts / "ckpt-16")
    assert placeholders(spec)["max_steps"] == 2 + 3  # the trainer's step count goes on from 2
    wide = run(spec)
    assert [(s.step, s.samples) for s in wide] == [(3, 32), (4, 48), (5, 64)]
    # another seed: the same weights, its own data
    other = run(make_spec(tmp_path, 2, 4, 48, resume_from=ckpts / "ckpt-16"))
    assert [s.samples for s in other] == [24, 32, 40, 48]
    assert [s.metrics["reward"] for s in other] != pytest.approx([s.metrics["reward"] for s in same])


def test_a_resumed_run_at_the_checkpoints_lr_instead_of_its_own_fails_saying_why(tmp_path):
    """verl (its 'extra' content), TRL (scheduler.pt) and OpenRLHF (DeepSpeed) restore the LR
    scheduler with the checkpoint: a branch at 2x the batch then trains at the trunk's LR, and its
    ratio measures something else. A log that says so fails the run; the control (same LR) and a
    trainer that takes the new LR pass."""
    ckpts = tmp_path / "ckpts"
    run(make_spec(tmp_path, 2, 3, 48, save_at_samples=(16,), checkpoint_dir=ckpts))
    assert json.loads((ckpts / "ckpt-16" / CHECKPOINT_META).read_text())["lr"] == 0.05
    restores = {"command_resume_args": ["--resume", "{resume_from}", "--restore_lr"]}
    wide = make_spec(tmp_path, 4, 3, 64, lr=0.0707, backend=restores, resume_from=ckpts / "ckpt-16")
    with pytest.raises(
        RunFailed, match=r"logs lr 0.05 after resuming, the checkpoint's, not this run's 0.0707"
    ):
        run(wide)
    same = run(make_spec(tmp_path, 2, 3, 48, backend=restores, resume_from=ckpts / "ckpt-16"))
    assert len(same) == 4
    own = run(make_spec(tmp_path, 4, 3, 64, lr=0.0707, resume_from=ckpts / "ckpt-16"))
    assert [s.lr for s in own] == [0.0707] * 3


def test_missing_pieces_are_clear_errors(tmp_path):
    ckpts = tmp_path / "ckpts"
    spec = make_spec(tmp_path, 2, 3, 48, save_at_samples=(16,), checkpoint_dir=ckpts)
    bare = dataclasses.replace(spec.recipe.backend, command_resume_args=[])
    with pytest.raises(RecipeError, match="backend.command_resume_args"):
        run(dataclasses.replace(spec, recipe=dataclasses.replace(spec.recipe, backend=bare)))
    wrong = dataclasses.replace(spec.recipe.backend, checkpoint_path="{output_dir}/nowhere/{step}")
    with pytest.raises(RunFailed, match=r"no checkpoint at its step 2 \(16 samples\).*nowhere/2"):
        run(dataclasses.replace(spec, recipe=dataclasses.replace(spec.recipe, backend=wrong)))
    with pytest.raises(RunFailed, match="cannot read the checkpoint record"):
        run(make_spec(tmp_path, 2, 3, 48, resume_from=tmp_path / "no-such-ckpt"))
    inside = make_spec(tmp_path, 2, 3, 48, save_at_samples=(12,), checkpoint_dir=ckpts)  # 1.5 steps
    with pytest.raises(RunFailed, match="save_every_steps"):
        run(inside)


@pytest.mark.slow  # 9 s at load 4; the trunk-save and resume tests beside it stay by default
def test_a_branched_probe_runs_through_the_users_trainer(tmp_path):
    from batchtune.measure.branched import run_branched_probe

    recipe = load_recipe(
        None,
        [
            *_backend_sets(tmp_path),
            f"run.results_dir={tmp_path / 'results'}",
            "run.name=cmd-branched",
            "probe.mode=branched",
            "candidates.prompts=[1, 2, 4, 8]",
            "candidates.group_size=4",
            "optimizer.lr=0.05",
            "target.metric=reward",
            "target.value=0.5",
            "budget.max_samples=4096",
            "budget.seeds=[0, 1]",
            "branch.trunk_samples=64",
            "branch.checkpoints=[0.5, 1.0]",
            "branch.window_samples=64",
        ],
    )
    result = run_branched_probe(recipe)
    sm = result.summary
    assert [lc.checkpoint_samples for lc in sm.locals] == [32.0, 64.0]
    # the control at the trunk's seed is the trunk's own continuation through the user's trainer
    assert all(lc.ratios[4.0][0] == 1.0 for lc in sm.locals)
    assert result.efficiency.total_samples == sm.probe_samples > 0


def test_preflight_names_a_bad_placeholder_in_the_checkpoint_args(tmp_path):
    from batchtune.measure.preflight import problems

    good = load_recipe(None, _backend_sets(tmp_path))
    assert problems(good) == []
    bad = load_recipe(None, _backend_sets(tmp_path, command_resume_args=["--resume", "{resume_path}"]))
    assert any("command_resume_args[1]" in p and "{resume_path}" in p for p in problems(bad))
    wrong = load_recipe(None, _backend_sets(tmp_path, checkpoint_path="{output_dir}/{stepp}"))
    assert any("checkpoint_path" in p and "{stepp}" in p for p in problems(wrong))


def test_a_resumed_run_that_saves_gets_absolute_save_steps(tmp_path):
    """A schedule's second stage: resumed at step 2 (16 samples), asked to save at 40 samples (its step
    5); trainers save when their step count is a multiple of save_every, so that must be 5, not 3."""
    ckpts = tmp_path / "ckpts"
    run(make_spec(tmp_path, 2, 3, 16, save_at_samples=(16,), checkpoint_dir=ckpts))
    start = ckpts / "ckpt-16"
    spec = make_spec(tmp_path, 2, 3, 48, resume_from=start, save_at_samples=(40,), checkpoint_dir=ckpts)
    assert placeholders(spec)["save_every_steps"] == 5
    run(spec)
    assert json.loads((ckpts / "ckpt-40" / CHECKPOINT_META).read_text())["step"] == 5
    # saves at or before the checkpoint: nothing to save, no save args
    quiet = make_spec(tmp_path, 2, 3, 48, resume_from=start, save_at_samples=(16,), checkpoint_dir=ckpts)
    assert [s.samples for s in run(quiet)] == [24, 32, 40, 48]


def test_a_trunk_stopped_early_still_records_the_checkpoints_it_passed(tmp_path):
    """The caller closes the run at its budget while the trainer is still going: the checkpoint at
    16 samples, saved before the steps already streamed, must be recorded for the branches."""
    ckpts = tmp_path / "ckpts"
    spec = make_spec(tmp_path, 2, 3, 400, save_at_samples=(16,), checkpoint_dir=ckpts)
    argv = [*spec.recipe.backend.command, "--sleep", "0.2"]
    backend = dataclasses.replace(spec.recipe.backend, command=argv)
    spec = dataclasses.replace(spec, recipe=dataclasses.replace(spec.recipe, backend=backend))
    gen = CommandBackend().train(spec)
    for step in gen:
        if step.samples >= 32:
            break
    gen.close()
    assert json.loads((ckpts / "ckpt-16" / CHECKPOINT_META).read_text())["step"] == 2


def test_a_trunk_whose_trainer_cannot_start_stops_the_branched_probe_with_exit_4(tmp_path):
    """As the grid's reference: a trunk that failed before its first training step (here a trainer
    that is not installed) stops with its reason, exit 4, and is run again next time; it used to
    read "the trunk ... did not reach its last checkpoint" (exit 3)."""
    from typer.testing import CliRunner

    from batchtune.cli import app

    missing = [sys.executable, "-c", "import sys; sys.exit(\"ModuleNotFoundError: No module named 'verl'\")"]
    sets = [
        *_backend_sets(tmp_path, command=[*missing, "{output_dir}"]),
        "probe.mode=branched",
        "candidates.prompts=[1, 2, 4]",
        "candidates.group_size=4",
        "target.metric=reward",
        "target.value=0.5",
        "budget.seeds=[0, 1]",
        "branch.trunk_samples=64",
        "branch.window_samples=64",
    ]
    args = [a for s in sets for a in ("--set", s)]
    out = CliRunner().invoke(app, ["probe", "-r", str(tmp_path / "r"), *args])
    assert out.exit_code == 4, out.output
    assert "failed before its first training step" in out.output and "No module named 'verl'" in out.output


def test_smoke_of_a_branched_recipe_checks_that_its_trainer_saves_and_resumes(tmp_path):
    """smoke of a branched recipe ran only the grid (and then failed at recommend): the checkpoint
    path, the user's save and resume arguments were first exercised by the real probe. A stage of
    its own now runs a one-step trunk and resumes every batch from its checkpoint."""
    from batchtune.workflow import smoke as workflow_smoke

    sets = [*_backend_sets(tmp_path), "probe.mode=branched", "candidates.prompts=[1, 2]"]
    sets += ["target.metric=reward"]
    good = workflow_smoke.smoke(None, sets, str(tmp_path / "good"))
    stage = {s.name: s for s in good.stages}["branches"]
    assert stage.status == "ok" and "resumed from it" in stage.detail, stage
    assert any("ignores them passes this smoke" in u for u in good.unchecked)


@pytest.mark.slow  # ~8 s: two more smokes through the trainer script
def test_smoke_of_a_branched_recipe_fails_on_a_missing_checkpoint_or_a_restored_lr(tmp_path):
    from batchtune.workflow import smoke as workflow_smoke

    sets = [*_backend_sets(tmp_path), "probe.mode=branched", "candidates.prompts=[1, 2]"]
    sets += ["target.metric=reward"]
    # a checkpoint template that names no file the trainer writes: the branches stage fails, saying so
    bad_path = [*sets, 'backend.checkpoint_path="{output_dir}/ckpts/nope_{step}.json"']
    bad = workflow_smoke.smoke(None, bad_path, str(tmp_path / "bad"))
    stage = {s.name: s for s in bad.stages}["branches"]
    assert not bad.ok and stage.status == "failed" and "nope_" in stage.detail, stage
    # resume arguments that bring back the trunk's LR: the larger batch's step fails the stage
    restores = [*sets, 'backend.command_resume_args=["--resume", "{resume_from}", "--restore_lr"]']
    lr_back = workflow_smoke.smoke(None, restores, str(tmp_path / "lr"))
    stage = {s.name: s for s in lr_back.stages}["branches"]
    assert stage.status == "failed" and "the checkpoint restored its LR scheduler" in stage.detail, stage


def test_the_resumed_lr_check_fails_only_a_run_at_the_checkpoints_lr_throughout():
    """A fresh warmup under the linear rule passes the trunk's LR on its way up: one step at it is
    not a restored scheduler; every step at it is."""
    from batchtune.backends.command_checkpoints import Origin, check_resumed_lr

    start = Origin(16, 2, "ckpt", lr=0.05)
    check_resumed_lr([0.025, 0.05, 0.075, 0.1], 0.1, start)  # warming up to its own 0.1
    check_resumed_lr([0.05], 0.0505, start)  # within 1% of the trunk's: the control, say
    check_resumed_lr([0.1, 0.1], 0.1, Origin(16, 2, "ckpt"))  # an old record without its LR
    with pytest.raises(RunFailed, match="logs lr 0.05 after resuming"):
        check_resumed_lr([0.05, 0.05, 0.05], 0.1, start)
