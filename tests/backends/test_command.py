"""The command backend: the user's own trainer as a subprocess, its log read back as StepRecords."""

from __future__ import annotations

import dataclasses
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from batchtune.backends.command import CommandBackend
from batchtune.backends.command_args import placeholders
from batchtune.backends.spec import Candidate, OutOfMemory, RunFailed, RunSpec
from batchtune.errors import RecipeError
from batchtune.recipe.load import load_recipe, shipped_recipes

# A real (tiny) training script: a linear model fit with Adam, one JSON line per optimiser step in
# the generic format; the batch, LR and seed come from the placeholders.
TRAIN = textwrap.dedent(
    """
    import argparse, json, os, time
    import torch
    p = argparse.ArgumentParser()
    for name in ("prompts", "group_size", "seed", "max_steps"):
        p.add_argument("--" + name, type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--out")
    p.add_argument("--sleep", type=float, default=0.0)
    a = p.parse_args()
    open(os.path.join(a.out, "pid"), "w").write(str(os.getpid()))
    torch.manual_seed(a.seed)
    w_true = torch.randn(8)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    n = a.prompts * a.group_size
    with open(os.path.join(a.out, "log.jsonl"), "w") as log:
        for step in range(1, a.max_steps + 1):
            x = torch.randn(n, 8)
            loss = ((model(x).squeeze(-1) - x @ w_true) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item()
            opt.step()
            row = {"step": step, "samples": step * n, "prompts": a.prompts, "group_size": a.group_size,
                   "lr": a.lr, "seed": a.seed, "reward": 1 / (1 + loss.item()), "loss": loss.item(),
                   "grad_norm": gn}
            log.write(json.dumps(row) + "\\n")
            log.flush()
            time.sleep(a.sleep)
    """
)

# The same trainer in plain Python (SGD on one weight), for the tests of how its process and log are
# handled rather than of what it trains: a subprocess that imports torch costs seconds of CPU.
PLAIN = textwrap.dedent(
    """
    import argparse, json, os, random, time
    p = argparse.ArgumentParser()
    for name in ("prompts", "group_size", "seed", "max_steps"):
        p.add_argument("--" + name, type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--out")
    p.add_argument("--sleep", type=float, default=0.0)
    a = p.parse_args()
    open(os.path.join(a.out, "pid"), "w").write(str(os.getpid()))
    rng = random.Random(a.seed)
    w, n = 0.0, a.prompts * a.group_size
    with open(os.path.join(a.out, "log.jsonl"), "w") as log:
        for step in range(1, a.max_steps + 1):
            xs = [rng.gauss(0, 1) for _ in range(n)]
            loss = sum(((w - 2.0) * x) ** 2 for x in xs) / n
            grad = sum(2 * (w - 2.0) * x * x for x in xs) / n
            w -= a.lr * grad
            row = {"step": step, "samples": step * n, "prompts": a.prompts, "group_size": a.group_size,
                   "lr": a.lr, "seed": a.seed, "reward": 1 / (1 + loss), "loss": loss, "grad_norm": abs(grad)}
            log.write(json.dumps(row) + "\\n")
            log.flush()
            time.sleep(a.sleep)
    """
)


def make_spec(
    tmp_path: Path, command: list[str], *overrides: str, prompts: int = 2, trainer: str = TRAIN, **backend
) -> RunSpec:
    """A RunSpec for P x 4 at lr 0.01, seed 3; "PY" and "SCRIPT" in the command are this Python and
    ``trainer`` (the torch script above by default); ``backend`` replaces fields of recipe.backend."""
    script = tmp_path / "train.py"
    script.write_text(trainer)
    argv = [sys.executable if a == "PY" else str(script) if a == "SCRIPT" else a for a in command]
    recipe = load_recipe(None, ["budget.max_samples=40", "candidates.group_size=4", *overrides])
    fields = {"training": "command", "command": argv, "command_log": "log.jsonl", **backend}
    recipe = dataclasses.replace(recipe, backend=dataclasses.replace(recipe.backend, **fields))
    cand = Candidate(f"P{prompts}xG4", prompts, 4, 0.01, "sqrt")
    return RunSpec(f"P{prompts}xG4-s3", cand, 3, recipe, tmp_path / "runs" / f"P{prompts}xG4-s3", 0.01, 8)


TRAIN_ARGV = [
    "PY", "SCRIPT", "--prompts", "{prompts}", "--group_size", "{group_size}", "--lr", "{lr}",
    "--seed", "{seed}", "--max_steps", "{max_steps}", "--out", "{output_dir}",
]  # fmt: skip


def test_runs_a_real_training_script(tmp_path):
    spec = make_spec(tmp_path, TRAIN_ARGV)
    steps = list(CommandBackend().train(spec))
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]  # ceil(40 / 8) steps
    assert [s.samples for s in steps] == [8, 16, 24, 32, 40]
    assert all(s.run_id == spec.run_id and s.seed == 3 and s.lr == 0.01 for s in steps)
    assert all(s.grad_norm is not None and 0 < s.metrics["reward"] <= 1 for s in steps)
    assert (spec.run_dir / "output" / "log.jsonl").exists()


def test_streams_while_running_and_close_stops_it(tmp_path):
    spec = make_spec(tmp_path, [*TRAIN_ARGV, "--sleep", "0.5"], "budget.max_samples=400", trainer=PLAIN)
    gen = CommandBackend().train(spec)
    first = next(gen)
    pid = int((spec.run_dir / "output" / "pid").read_text())
    assert first.step == 1
    os.kill(pid, 0)  # still training: the step came from the live log
    gen.close()
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_timeout(tmp_path):
    spec = make_spec(tmp_path, ["PY", "-c", "import time; time.sleep(60)"], timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as err:
        list(CommandBackend().train(spec))
    assert err.value.status == "timeout" and time.monotonic() - t0 < 20


def test_failing_command(tmp_path):
    code = (
        "import sys; print('loading', file=sys.stderr); print('boom: bad config', file=sys.stderr); exit(3)"
    )
    spec = make_spec(tmp_path, ["PY", "-c", code])
    with pytest.raises(RunFailed) as err:
        list(CommandBackend().train(spec))
    assert err.value.status == "failed"
    assert "exited with code 3" in err.value.message and "boom: bad config" in err.value.message


def test_out_of_memory_and_missing_log(tmp_path):
    code = "import sys; print('torch.OutOfMemoryError: CUDA out of memory', file=sys.stderr); sys.exit(1)"
    with pytest.raises(OutOfMemory):
        list(CommandBackend().train(make_spec(tmp_path, ["PY", "-c", code])))
    with pytest.raises(RunFailed, match="cannot read the command's log"):
        list(CommandBackend().train(make_spec(tmp_path, ["PY", "-c", "pass"])))
    with pytest.raises(RunFailed, match="cannot start"):
        list(CommandBackend().train(make_spec(tmp_path, ["/no/such/trainer"])))


def test_verl_format_through_command_env(tmp_path):
    """A stand-in that writes verl's file-logger format where VERL_FILE_LOGGER_PATH says."""
    code = (
        "import json, os\n"
        "with open(os.environ['VERL_FILE_LOGGER_PATH'], 'w') as f:\n"
        "    for i in range(1, 4):\n"
        "        d = {{'critic/score/mean': 0.1 * i, 'actor/grad_norm': 1.0, 'actor/lr': 0.01}}\n"
        "        f.write(json.dumps({{'step': i, 'data': d}}) + '\\n')\n"
    )  # braces doubled: argv items are str.format templates
    spec = make_spec(
        tmp_path,
        ["PY", "-c", code],
        command_log_format="verl",
        command_log="metrics.jsonl",
        command_env={"VERL_FILE_LOGGER_PATH": "{output_dir}/metrics.jsonl"},
    )
    steps = list(CommandBackend().train(spec))
    assert [s.samples for s in steps] == [8, 16, 24]
    assert [s.metrics["reward"] for s in steps] == pytest.approx([0.1, 0.2, 0.3])


def test_placeholder_errors(tmp_path):
    with pytest.raises(RecipeError, match=r"unknown placeholder \{batch\}"):
        list(CommandBackend().train(make_spec(tmp_path, ["PY", "{batch}"])))
    with pytest.raises(RunFailed, match=r"\{mini_batch_prompts\} is not a whole number"):
        spec = make_spec(tmp_path, ["PY", "{mini_batch_prompts}"], "algorithm.mini_batches=4", prompts=2)
        list(CommandBackend().train(spec))


def test_shipped_command_recipes_fill(tmp_path):
    """Every placeholder of the shipped trainer recipes is known and fills for their candidates."""
    from batchtune.backends.command_args import fill
    from batchtune.measure.plan import plan_candidates

    names = ("verl-grpo", "trl-grpo", "openrlhf-ppo")
    recipes = shipped_recipes()
    for name in names:
        recipe = load_recipe(recipes[name])
        for cand in plan_candidates(recipe).candidates:
            spec = RunSpec("r", cand, 0, recipe, tmp_path / "r", recipe.optimizer.lr, 8)
            values = placeholders(spec)
            argv = [fill(a, values, name) for a in recipe.backend.command]
            assert not any("{" in a and "}" in a and "[" not in a for a in argv), argv
            assert fill(recipe.backend.command_log, values, name)
    verl = load_recipe(recipes["verl-grpo"])
    cand = plan_candidates(verl).candidates[0]
    argv = [
        fill(a, placeholders(RunSpec("r", cand, 1, verl, tmp_path, 1e-6, 512)), "v")
        for a in verl.backend.command
    ]
    assert "data.train_batch_size=64" in argv and "actor_rollout_ref.rollout.n=8" in argv
    assert "trainer.logger=['console','file']" in argv and "++data.seed=1" in argv


def test_a_stale_log_from_an_interrupted_attempt_is_never_read(tmp_path):
    spec = make_spec(tmp_path, TRAIN_ARGV, trainer=PLAIN)
    out = spec.run_dir / "output"
    out.mkdir(parents=True)
    (out / "log.jsonl").write_text(
        "".join(
            f'{{"step": {i}, "samples": {8 * i}, "prompts": 2, "group_size": 4, "lr": 0.01, "seed": 3, '
            f'"reward": 0.999}}\n'
            for i in range(1, 9)
        )
    )
    steps = list(CommandBackend().train(spec))
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    assert all(s.metrics["reward"] < 0.999 for s in steps)
    assert list(spec.run_dir.glob("output.stale-*/log.jsonl"))  # kept aside, not deleted


def test_children_left_behind_are_stopped(tmp_path):
    script = tmp_path / "spawn.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os, subprocess, sys
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            open(os.path.join(sys.argv[1], "child"), "w").write(str(p.pid))
            row = {"step": 1, "samples": 8, "prompts": 2, "group_size": 4, "lr": 0.01, "reward": 0.5}
            open(os.path.join(sys.argv[1], "log.jsonl"), "w").write(json.dumps(row) + "\\n")
            """
        )
    )
    spec = make_spec(tmp_path, ["PY", str(script), "{output_dir}"])
    list(CommandBackend().train(spec))
    child = int((spec.run_dir / "output" / "child").read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(child, 0)
            time.sleep(0.1)
