"""Probes on Ray (measure/ray_executor.py), on a local Ray cluster this module starts once: in-process
trainers as Ray tasks, the command backend as Ray Jobs, and kill -9 of the driver followed by a resume.
Every comparison is against the local executor on the same recipe: the same answer, run for run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.recipe.load import shipped_recipes
from batchtune.records.store import ResultsStore

NQM = str(shipped_recipes()["nqm"])
# a small NQM probe for the fast test: 2 batches x 2 seeds to an early target (~200 steps each)
SMALL = ["--set", "candidates.prompts=[1,4]", "--set", "budget.seeds=[0,1]"]
SMALL += ["--set", "target.value=2.0", "--set", "budget.max_samples=8192"]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module: 2 CPUs, with its dashboard (it serves the job API)."""
    ray.init(num_cpus=2, include_dashboard=True, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def local_nqm(tmp_path_factory) -> tuple[Path, dict]:
    """The shipped NQM probe on the local executor, the answer Ray must give (read-only)."""
    results = tmp_path_factory.mktemp("local-nqm") / "r"
    return results, _probe(results, NQM)


def _probe(results: Path, recipe: str, *extra: str) -> dict:
    out = CliRunner().invoke(app, ["probe", recipe, "-r", str(results), "--json", *extra])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def _summary(data: dict) -> dict:
    return {c["name"]: (c["status"], c["per_seed_samples_to_target"]) for c in data["candidates"]}


def _runs(results: Path) -> dict[str, tuple]:
    """Each run's outcome and its whole curve: what a run on Ray must reproduce exactly."""
    store = ResultsStore(results)
    return {
        r.run_id: (
            r.status,
            r.reason,
            r.steps,
            r.samples,
            [(s.samples, s.metrics) for s in store.steps(r.run_id)],
        )
        for r in store.runs()
    }


def _finished_tasks(names: set[str]) -> set[str]:
    """Which of ``names`` (run ids: ray_executor names each task by its run) Ray saw finish as tasks."""
    from ray.util.state import list_tasks

    deadline = time.monotonic() + 20  # task events reach Ray's state API a little after the fact
    while True:
        ran = {t.name for t in list_tasks(limit=10000) if t.state == "FINISHED" and t.name in names}
        if len(ran) >= len(names) or time.monotonic() > deadline:
            return ran
        time.sleep(0.5)


@pytest.mark.slow  # a local Ray cluster starts for the module: 10 s, then seconds a test
def test_nqm_probe_on_ray_tasks_matches_local(tmp_path, local_ray):
    local = _probe(tmp_path / "local", NQM, *SMALL)
    on_ray = _probe(tmp_path / "ray", NQM, *SMALL, "--set", "run.executor=ray", "--set", "run.workers=2")
    assert _summary(on_ray) == _summary(local)
    assert on_ray["critical_training_batch"] == local["critical_training_batch"]
    assert _runs(tmp_path / "ray") == _runs(tmp_path / "local") and len(_runs(tmp_path / "local")) == 4
    ran = _finished_tasks(set(_runs(tmp_path / "ray")))
    assert len(ran) >= 4  # they ran as Ray tasks (named by their run ids), not in this process
    assert not list((tmp_path / "ray" / "runs").glob("*/ray-job.*"))  # tasks, not jobs


# A trainer the command backend runs: standard library only, one JSON line per step; P=2 crashes
# at its start with exit code 3 (a crash mid-run would leave a curve cut where the log was last polled).
TRAIN = textwrap.dedent(
    """
    import json, math, os, random, sys
    prompts, group, seed, steps = (int(v) for v in sys.argv[1:5])
    lr, out = float(sys.argv[5]), sys.argv[6]
    rng = random.Random(seed)
    if prompts == 2:
        print("boom: the trainer crashed", file=sys.stderr)
        sys.exit(3)
    print("training", prompts, group, seed, "ray address:", os.environ.get("RAY_ADDRESS", "none"))
    with open(os.path.join(out, "log.jsonl"), "w") as log:
        for step in range(1, steps + 1):
            n = step * prompts * group
            reward = 1 - math.exp(-lr * n / 4) + rng.gauss(0, 0.01)
            log.write(json.dumps({"step": step, "samples": n, "prompts": prompts, "group_size": group,
                                  "lr": lr, "seed": seed, "reward": reward}) + "\\n")
            log.flush()
    """
)


def _command_recipe(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    recipe = tmp_path / "command.toml"
    argv = [
        sys.executable,
        str(script),
        "{prompts}",
        "{group_size}",
        "{seed}",
        "{max_steps}",
        "{lr}",
        "{output_dir}",
    ]
    recipe.write_text(
        textwrap.dedent(
            f"""
            [backend]
            training = "command"
            command = {json.dumps(argv)}
            command_log = "log.jsonl"
            [optimizer]
            lr = 0.05
            [candidates]
            prompts = [1, 2, 4]
            group_size = 4
            [target]
            metric = "reward"
            value = 0.5
            [budget]
            max_samples = 256
            seeds = [0, 1]
            stop_outside_band = false
            """
        )
    )
    return recipe


@pytest.mark.slow
def test_command_candidates_run_as_ray_jobs_like_local_runs(tmp_path, local_ray):
    recipe = str(_command_recipe(tmp_path))
    local = _probe(tmp_path / "local", recipe)
    on_ray = _probe(tmp_path / "ray", recipe, "--set", "run.executor=ray", "--set", "run.workers=2")
    assert _summary(on_ray) == _summary(local)
    runs = _runs(tmp_path / "ray")
    assert runs == _runs(tmp_path / "local") and len(runs) == 6
    failed = {rid: r for rid, r in runs.items() if r[0] == "failed"}
    assert set(failed) == {"P2xG4-s0", "P2xG4-s1"}  # the exit status came back as a local run's
    assert all("exited with code 3" in r[1] and "boom" in r[1] for r in failed.values())
    run_dir = tmp_path / "ray" / "runs" / "P1xG4-s0"
    assert "ray address: none" not in (run_dir / "command.stdout").read_text()  # ran inside a Ray Job
    assert "batchtune: P1xG4-s0: reached_target" in (run_dir / "ray-job.log").read_text()


def _steps_strictly_increase(results: Path) -> bool:
    store = ResultsStore(results)
    return all(
        all(a.step < b.step for a, b in zip(steps, steps[1:], strict=False))
        for steps in (store.steps(r.run_id) for r in store.runs())
    )


@pytest.mark.slow
def test_nqm_recipe_on_ray_gives_the_local_answer(tmp_path, local_ray, local_nqm):
    """`batchtune probe recipes/nqm.toml --set run.executor=ray`: the local executor's answer."""
    on_ray = _probe(tmp_path / "ray", NQM, "--set", "run.executor=ray")
    assert _summary(on_ray) == _summary(local_nqm[1])
    assert on_ray["critical_training_batch"] == local_nqm[1]["critical_training_batch"]
    assert _runs(tmp_path / "ray") == _runs(local_nqm[0])


@pytest.mark.slow
def test_kill_9_of_the_driver_on_ray_then_resume_gives_the_local_answer(tmp_path, local_ray, local_nqm):
    local_dir, local = local_nqm
    total = len(_runs(local_dir))  # 24, and extra seeds where the probe adds them
    results = tmp_path / "ray"
    argv = [sys.executable, "-m", "batchtune", "probe", NQM, "-r", str(results), "--json"]
    argv += ["--set", "run.executor=ray", "--set", "run.workers=2"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    driver = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while len(list(results.glob("runs/*/run.json"))) < 5:  # the reference done, others going
            assert driver.poll() is None and time.monotonic() < deadline, "the probe ended before the kill"
            time.sleep(0.2)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        time.sleep(1.0)  # Ray's processes die with the driver that started them; stragglers too:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    before = {r.run_id: r.finished_at for r in ResultsStore(results).runs()}
    assert 5 <= len(before) < total

    resumed = _probe(results, NQM, "--set", "run.executor=ray", "--set", "run.workers=2")
    assert _summary(resumed) == _summary(local)
    after = {r.run_id: r.finished_at for r in ResultsStore(results).runs()}
    assert resumed["runs_reused"] == len(before) and resumed["runs_done"] == len(after) - len(before)
    assert {rid: after[rid] for rid in before} == before  # no finished run redone
    assert _steps_strictly_increase(results)  # no run written by two processes at once
    ray_runs, local_runs = _runs(results), _runs(local_dir)
    assert {rid: ray_runs[rid] for rid in local_runs if rid in ray_runs} == {
        rid: local_runs[rid] for rid in local_runs if rid in ray_runs
    }
    assert len(set(ray_runs) & set(local_runs)) >= 24  # every planned run, run for run the same


# a branched NQM probe small enough for the default suite: 2 checkpoints, 4 batches, 2 seeds
BRANCHED = ["--set", "probe.mode=branched", "--set", "branch.trunk_samples=1024"]
BRANCHED += ["--set", "branch.window_samples=512", "--set", "branch.checkpoints=[0.5, 1.0]"]
BRANCHED += ["--set", "candidates.prompts=[1, 8, 32, 64, 128]", "--set", "budget.seeds=[0, 1]"]


def _branched_answer(data: dict) -> dict:
    """The probe's JSON without its wall-clock seconds (the one thing that differs run to run)."""

    def drop_wall(v):
        if isinstance(v, dict):
            return {k: drop_wall(x) for k, x in v.items() if "wall" not in k}
        return [drop_wall(x) for x in v] if isinstance(v, list) else v

    return drop_wall(
        {k: data[k] for k in ("critical_training_batch", "probe_cost", "candidates", "branched")}
    )


@pytest.mark.slow  # a local Ray cluster starts for the module: 10 s, then seconds a test
def test_a_branched_probe_on_ray_tasks_matches_local(tmp_path, local_ray):
    """Trunk, controls and branches run as Ray tasks (a round's seeds at once): the same runs and
    curves, run for run, and the same answer as on the local executor."""
    local = _probe(tmp_path / "local", NQM, *BRANCHED)
    on_ray = _probe(tmp_path / "ray", NQM, *BRANCHED, "--set", "run.executor=ray", "--set", "run.workers=2")
    assert _branched_answer(on_ray) == _branched_answer(local)
    runs = _runs(tmp_path / "ray" / "branched")
    assert runs == _runs(tmp_path / "local" / "branched") and len(runs) > 10
    ran = _finished_tasks(set(runs))
    assert len(ran) >= len(runs)  # every run of the probe ran as a Ray task, not in this process


@pytest.mark.slow
def test_a_branched_probe_of_the_users_trainer_runs_as_ray_jobs_like_local(tmp_path, local_ray):
    """The command backend's trunk, controls and branches as Ray Jobs: their checkpoint settings
    travel as JSON and resume the same checkpoints; the same runs and answer as locally."""
    from tests.backends.test_command_checkpoints import _backend_sets

    sets = [*_backend_sets(tmp_path), "probe.mode=branched", "candidates.prompts=[1, 2, 4, 8]"]
    sets += ["candidates.group_size=4", "optimizer.lr=0.05", "target.metric=reward", "target.value=0.5"]
    sets += ["budget.max_samples=4096", "budget.seeds=[0, 1]", "branch.trunk_samples=64"]
    sets += ["branch.checkpoints=[0.5, 1.0]", "branch.window_samples=64"]
    args = [a for s in sets for a in ("--set", s)]
    local = _probe(tmp_path / "local", "tiny-grpo", *args)
    on_ray = _probe(
        tmp_path / "ray", "tiny-grpo", *args, "--set", "run.executor=ray", "--set", "run.workers=2"
    )
    assert _branched_answer(on_ray) == _branched_answer(local)
    ray_runs, local_runs = _runs(tmp_path / "ray" / "branched"), _runs(tmp_path / "local" / "branched")
    assert ray_runs == local_runs and any(rid.startswith("c") for rid in ray_runs)
    jobs = list((tmp_path / "ray" / "branched" / "runs").glob("c*/ray-job.log"))
    assert jobs and all("batchtune: c" in p.read_text() for p in jobs)  # branches ran inside Ray Jobs


@pytest.mark.slow  # a local Ray cluster starts for the module: 10 s, then seconds a test
def test_a_branched_runs_checkpoint_paths_reach_ray_absolute(monkeypatch, local_ray):
    """A task or job may start in another directory than the driver: the trunk's checkpoints and a
    branch's resume path go to Ray absolute, as the results directory does."""
    from batchtune.measure import ray_executor
    from batchtune.measure.one_run import execute_run
    from batchtune.recipe.load import load_recipe

    seen: list = []
    monkeypatch.setattr(ray_executor, "_run_tasks", lambda ray, fn, args, *rest: seen.extend(args) or 0)
    recipe = load_recipe(NQM, [])
    extra = {"resume_from": Path("bt-results/x/branched/checkpoints/ckpt-8"), "save_at_samples": (16,)}
    extra["checkpoint_dir"] = Path("bt-results/x/branched/checkpoints/c8-control-s0")
    args = (recipe, "bt-results/x/branched", None, 0, 0.03, 8, None, "c8-P1xG8-s0", extra)
    ray_executor.run_on_ray(execute_run, [args], None)
    (a,) = seen
    assert Path(a[1]).is_absolute() and a[7] == "c8-P1xG8-s0"
    assert a[8]["resume_from"] == Path.cwd() / extra["resume_from"]
    assert a[8]["checkpoint_dir"].is_absolute() and a[8]["save_at_samples"] == (16,)


def _ray_task_pids(names: set[str]) -> dict[int, str]:
    """Live processes Ray titles ``ray::<task name>`` for a task in ``names`` (ray_executor names
    each task by its run id): the worker running that run now."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            title = cmdline.read_bytes().split(b"\0")[0].decode()
        except (OSError, UnicodeDecodeError):
            continue
        if title.startswith("ray::") and title[5:] in names:
            found[int(cmdline.parent.name)] = title[5:]
    return found


@pytest.mark.slow  # two small NQM probes and a Ray task rerun: 15-30 s on 2 cores
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds Ray's workers in /proc")
def test_a_ray_worker_killed_mid_run_is_rerun_to_the_local_answer(tmp_path, local_ray):
    """Issue 33 item 16, the drill on a local cluster: kill -9 of the Ray worker running a probe run,
    mid-run. Ray reruns the task (run.ray_max_retries), the run is claimed again and rewritten from
    its start, and the probe ends with the local executor's answer, run for run; the killed worker
    is gone and no worker is left running a run of the probe."""
    local = _probe(tmp_path / "local", NQM, *SMALL)
    names = set(_runs(tmp_path / "local"))
    killed: dict[int, str] = {}
    done = threading.Event()

    def kill_one() -> None:
        while not done.is_set() and not killed:
            for pid, name in _ray_task_pids(names).items():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed[pid] = name
                break
            time.sleep(0.01)

    killer = threading.Thread(target=kill_one, daemon=True)
    killer.start()
    try:
        argv = ["probe", NQM, "-r", str(tmp_path / "ray"), "--json", *SMALL]
        out = CliRunner().invoke(app, [*argv, "--set", "run.executor=ray", "--set", "run.workers=2"])
    finally:
        done.set()
        killer.join(5)
    assert killed, "no Ray worker was caught running a run"
    assert out.exit_code == 0, out.output
    # Ray's "(raylet) A worker died or was killed ..." goes to stderr: stdout is the JSON alone
    on_ray = json.loads(out.stdout)
    assert _summary(on_ray) == _summary(local)
    assert on_ray["critical_training_batch"] == local["critical_training_batch"]
    assert _runs(tmp_path / "ray") == _runs(tmp_path / "local")  # the killed run too, step for step
    assert _steps_strictly_increase(tmp_path / "ray")
    (pid,) = killed
    assert not Path(f"/proc/{pid}").exists()
    deadline = time.monotonic() + 10
    while _ray_task_pids(names) and time.monotonic() < deadline:  # a finished task's title resets
        time.sleep(0.2)
    assert _ray_task_pids(names) == {}  # no orphan still running a run of the probe
