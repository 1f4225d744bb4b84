"""Reliability drills kept as tests: kill -9 and SIGTERM leave no live child, a resume after a kill gives
the identical answer, and a probe never acts on a run another live process holds.

The long versions (many random kills) are in benchmarks/drills.py; docs/reliability.md has the counts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from batchtune.measure.plan import plan_candidates, run_id
from batchtune.measure.probe import reference_band, run_probe
from batchtune.recipe.load import load_recipe, shipped_recipes
from batchtune.records.store import ResultsStore
from tests.drill_kit import (
    alive,
    kill_mid_probe,
    probe_cmd,
    sigint_as_a_terminal_sends_it,
    summary,
    trainer_pids,
    wait_dead,
    write_command_recipe,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="drills read /proc")

NQM = str(shipped_recipes()["nqm"])
NQM_SMALL = ["nqm.dim=200", "candidates.prompts=[1, 4]", "budget.seeds=[0, 1]"]


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _start_and_wait_for_trainer(cmd: list[str], results: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not trainer_pids(results) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert trainer_pids(results), "no trainer started"
    return proc


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_kill_minus_nine_leaves_no_live_child(tmp_path, workers):
    """Main process -> (pool worker ->) guard -> sh -> trainer: kill -9 at the top ends every one."""
    recipe = write_command_recipe(tmp_path, sleep_s=0.05, workers=workers)
    results = tmp_path / "r"
    proc = _start_and_wait_for_trainer(probe_cmd(recipe, results), results)
    below = _descendants(proc.pid)
    assert len(below) >= 3 + (workers > 1)  # guard, sh, trainer (+ workers, resource tracker)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_dead(below + trainer_pids(results), timeout_s=10) == []


def test_sigterm_stops_children_and_exits_143(tmp_path):
    recipe = write_command_recipe(tmp_path, sleep_s=0.05)
    results = tmp_path / "r"
    proc = _start_and_wait_for_trainer(probe_cmd(recipe, results), results)
    below = _descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert b"terminated by signal 15" in err and len(err.decode().strip().splitlines()) == 1
    assert not any(alive(p) for p in below + trainer_pids(results))
    assert not list(results.glob("runs/*/run.json")), "an interrupted run must not be sealed"


@pytest.mark.slow
def test_ctrl_c_with_two_workers_stops_the_probe_and_a_rerun_resumes(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once the runs after the
    reference are under way: exit 130 with the one-line message, the runs under way stopped and not
    sealed, the queued ones never started, no child left; the rerun reuses the reference's runs.
    With 2 workers it used to say 'interrupted' and go on starting the queued runs, and could hang
    in the interpreter's exit for good (benchmarks/drills.py has no such drill: it kills with -9)."""
    recipe = write_command_recipe(tmp_path, sleep_s=0.1, workers=2)  # after the reference: 4 runs
    results = tmp_path / "r"
    cmd = [*probe_cmd(recipe, results), "--set", "budget.max_extra_seeds=0"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=sigint_as_a_terminal_sends_it,  # not ignored, as in a run started with `&`
    )
    try:
        deadline = time.monotonic() + 120
        while len(trainer_pids(results)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # the 2 reference runs, then the first run of the next batch
        assert len(trainer_pids(results)) >= 3 and proc.poll() is None, "the probe did not get there"
        below = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # the 4 runs take ~8 s: this waits for none of them
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.decode().strip().splitlines() == [
        "interrupted: rerun the same command to resume; finished runs are kept"
    ]  # no worker's traceback
    ref = plan_candidates(load_recipe(recipe)).reference
    started = {p.parts[-3] for p in results.glob("runs/*/output*/pid")}
    sealed = {p.parent.name for p in results.glob("runs/*/run.json")}
    reference_runs = {f"{ref}-s0", f"{ref}-s1"}
    assert len(started - reference_runs) <= 2, f"a queued run started after Ctrl-C: {sorted(started)}"
    assert sealed == reference_runs, "a run under way at Ctrl-C must not be sealed"
    assert wait_dead(below + trainer_pids(results)) == []
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    data = json.loads(resumed.stdout)
    assert (data["runs_reused"], data["runs_done"]) == (2, 4)


@pytest.mark.slow
def test_random_kills_then_resume_give_the_identical_answer(tmp_path):
    recipe = write_command_recipe(tmp_path)
    whole = subprocess.run(probe_cmd(recipe, tmp_path / "whole"), capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    rng = random.Random(0)
    results = tmp_path / "killed"
    for _ in range(3):
        kill_mid_probe(probe_cmd(recipe, results), results, after_runs=0, extra_delay_s=rng.uniform(0, 2))
        assert wait_dead(trainer_pids(results)) == []
    resumed = subprocess.run(probe_cmd(recipe, results), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert summary(json.loads(resumed.stdout)) == summary(json.loads(whole.stdout))


def _hold(path: Path, seconds: float, held: threading.Event) -> None:
    """Hold ``path``'s flock for ``seconds``, like another live probe holding that run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    held.set()
    time.sleep(seconds)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def test_a_run_held_elsewhere_is_waited_for_and_the_band_never_uses_a_partial_reference(tmp_path):
    recipe = load_recipe(NQM, NQM_SMALL)
    plan = plan_candidates(recipe)
    ref = plan.by_label()[plan.reference]
    store = ResultsStore(tmp_path / "r")
    held_id = run_id(ref, 1)
    held = threading.Event()
    holder = threading.Thread(target=_hold, args=(store.run_dir(held_id) / ".lock", 2.0, held))
    holder.start()
    held.wait()
    events: list[tuple[str, dict]] = []
    bands: list[float] = []

    def spy_band(*args):
        band = reference_band(*args)
        bands.append(band[0])
        return band

    import batchtune.measure.probe as probe_mod

    probe_mod.reference_band = spy_band
    at_store = recipe.with_results_dir(store.root)
    try:
        result = run_probe(at_store, lambda kind, info: events.append((kind, info)))
    finally:
        probe_mod.reference_band = reference_band
        holder.join()
    waits = [info for kind, info in events if kind == "wait"]
    assert waits and waits[0]["run_ids"] == [held_id]
    assert "still running elsewhere: " + held_id in waits[0]["message"]
    # the holder released it unfinished (as a dead holder would): this probe then ran it itself
    assert store.is_finished(held_id) and len(store.runs()) == len(plan.candidates) * 2
    assert bands and math.isfinite(bands[0])  # computed after the wait, from both seeds
    assert result.runs_done == len(plan.candidates) * 2


def test_no_band_from_a_partial_reference(tmp_path):
    recipe = load_recipe(NQM, NQM_SMALL)
    plan = plan_candidates(recipe)
    store = ResultsStore(tmp_path / "r")
    run_probe(recipe.with_results_dir(store.root))
    assert math.isfinite(reference_band(store, recipe, plan)[0])
    ref = plan.by_label()[plan.reference]
    (store.run_dir(run_id(ref, 1)) / "run.json").unlink()  # one reference seed unfinished
    assert reference_band(store, recipe, plan) == (math.inf, math.inf)


@pytest.mark.slow
def test_sigterm_stops_a_branched_probe_in_order_and_a_rerun_finishes_it(tmp_path):
    """SIGTERM (a scheduler's preemption, `timeout`) while a branched probe's first round runs on 2
    workers: exit 143 with the one-line message, no child left; the rerun finishes the probe. The
    branched probe used to die of the signal itself (its workers with it, through PDEATHSIG), with
    no message, where the grid unwound in order."""
    results = tmp_path / "r"
    sets = ["probe.mode=branched", "run.workers=2", "nqm.dim=20000", *NQM_SMALL[1:]]
    cmd = [sys.executable, "-m", "batchtune", "probe", NQM, "-r", str(results), "--json"]
    cmd += [a for s in sets for a in ("--set", s)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    runs_dir = results / "branched" / "runs"
    try:
        deadline = time.monotonic() + 120
        while not list(runs_dir.glob("c*/steps.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.01)  # the trunk is done: a round of controls is under way in the pool
        assert list(runs_dir.glob("c*/steps.jsonl")), "no branch started within 120 s"
        assert proc.poll() is None, "the probe finished before the signal: make it longer"
        below = _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    assert err.decode().strip().splitlines()[-1] == (
        "terminated by signal 15: rerun the same command to resume; finished runs are kept"
    )
    stopped = [p.parent.name for p in runs_dir.glob("c*/steps.jsonl") if not (p.parent / "run.json").exists()]
    assert stopped, "the runs under way at the signal are stopped and left unsealed (redone on rerun)"
    assert wait_dead(below) == []
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["runs_done"] > 0


def _probe_beside_a_held_lock(store: ResultsStore, folder: Path) -> list[tuple[str, dict]]:
    """A probe of NQM_SMALL on ``store`` while another process holds the rounds lock in ``folder``
    for 1.5 s: the probe's events."""
    from batchtune.measure.probe import ROUNDS_LOCK

    held = threading.Event()
    holder = threading.Thread(target=_hold, args=(folder / ROUNDS_LOCK, 1.5, held))
    holder.start()
    held.wait()
    events: list[tuple[str, dict]] = []
    try:
        recipe = load_recipe(NQM, NQM_SMALL).with_results_dir(store.root)
        run_probe(recipe, lambda kind, info: events.append((kind, info)))
    finally:
        holder.join()
    return events


def test_a_probe_waits_while_another_process_decides_the_rounds(tmp_path):
    """The rounds after the planned runs are decided by one process at a time (measure/probe.py's
    ROUNDS_LOCK): a probe that finds them held says so and waits; its planned runs go on before."""
    store = ResultsStore(tmp_path / "r")
    events = _probe_beside_a_held_lock(store, store.runs_dir)
    kinds = [kind for kind, _ in events]
    assert "wait" in kinds, "a probe decided rounds while another process held them"
    info = events[kinds.index("wait")][1]
    assert "another batchtune process is adding seeds or rounds in " + str(store.root) in info["message"]
    assert "start" in kinds[: kinds.index("wait")]  # the planned runs are not held up


def test_a_probe_waits_while_an_older_version_holds_the_rounds_lock_in_the_root(tmp_path):
    """Versions up to 89d660e took the rounds lock as <results>/.rounds.lock alone. One of them
    deciding the rounds while a newer probe runs on the same directory (a cluster job on the old
    version, a user on the new) must still exclude it: the newer probe took runs/.rounds.lock only,
    and decided its rounds at once beside the old one (finished in 0.2 s); it now takes the root's
    lock too, and waits."""
    store = ResultsStore(tmp_path / "r")
    events = _probe_beside_a_held_lock(store, store.root)
    waits = [info["message"] for kind, info in events if kind == "wait"]
    assert waits, "a probe decided rounds while an older version held them in the root"
    assert len(waits) == 1 and "adding seeds or rounds in " + str(store.root) in waits[0]


def test_a_probe_that_may_write_its_runs_but_not_its_root_still_takes_the_rounds_lock(tmp_path, monkeypatch):
    """A results directory whose runs/ this user may write but not its root (EACCES creating a file
    there; faked, as root's chmod blocks nothing): the rounds lock in the root could not be made,
    so a probe went on unlocked (2f976a9) and ran extra seeds beside another probe deciding them.
    The other probe here holds the lock wherever a probe of this directory could make it; the probe
    used to decide its rounds at once, and now waits for it (the lock lives in runs/)."""
    import errno

    from batchtune.records import files

    recipe = load_recipe(NQM, NQM_SMALL)
    store = ResultsStore(tmp_path / "r")
    store.runs_dir.mkdir(parents=True)
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if Path(path).parent == store.root and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(files.os, "open", open_)  # the os module: every os.open in the process
    held, done = threading.Event(), threading.Event()

    def other_probe() -> None:
        with contextlib.ExitStack() as stack:
            for place in (store.root, store.runs_dir):  # the root's cannot be made: not held
                stack.enter_context(files.locked(place / ".rounds.lock"))
            held.set()
            done.wait(1.5)

    holder = threading.Thread(target=other_probe)
    holder.start()
    held.wait()
    events: list[tuple[str, dict]] = []
    try:
        run_probe(recipe.with_results_dir(store.root), lambda kind, info: events.append((kind, info)))
    finally:
        done.set()
        holder.join()
    assert not (store.root / ".rounds.lock").exists()
    assert "wait" in [kind for kind, _ in events], "the probe decided its rounds while another held them"


KILL_AFTER_SAVE = """
import os, signal, sys
import batchtune.measure.async_topup as m
real, when = m.save_top_up, sys.argv.pop(1)
def save(store, rec):
    real(store, rec)
    save.calls = getattr(save, "calls", 0) + 1
    if (rec.end is not None) if when == "end" else len(rec.rounds) == int(when):
        print(f"killed after save {save.calls}: rounds={len(rec.rounds)} end={rec.end}", file=sys.stderr)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
m.save_top_up = save
from batchtune.cli import main
sys.argv[0] = "batchtune"
main()
"""


def _async_probe(results: Path, kill_after: str = "") -> list[str]:
    """The async NQM probe of tests/measure/test_async_topup.py (70 runs, 5 top-up rounds, ~10 s);
    ``kill_after``: it kills itself (SIGKILL) just after the first write of the top-up record that
    holds that many rounds ("2") or that sets its end ("end"), whatever the writes before it."""
    from tests.measure.test_async_topup import NQM_SETS

    sets = [a for s in NQM_SETS for a in ("--set", s)]
    if kill_after:
        script = results.parent / "kill_after_save.py"
        script.write_text(KILL_AFTER_SAVE)
        return [sys.executable, str(script), kill_after, *probe_cmd(Path(NQM), results)[3:], *sets]
    return [*probe_cmd(Path(NQM), results), *sets]


def _async_answer(results: Path) -> tuple[dict, dict]:
    """The top-up record and `recommend --json` (less its wall seconds) of an async probe's results."""
    from tests.measure.test_async_topup import NQM_SETS

    cmd = [sys.executable, "-m", "batchtune", "recommend", NQM, "-r", str(results), "--json"]
    out = subprocess.run([*cmd, *(a for s in NQM_SETS for a in ("--set", s))], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.replace(str(results), "R"))
    rec.pop("probe_cost")  # its wall seconds
    for c in rec["candidates"]:
        c.pop("probe_wall_s")
    return json.loads((results / "async_topup.json").read_text()), rec


@pytest.mark.slow
def test_kill_9_between_a_recorded_top_up_round_and_its_runs_resumes_to_the_same_answer(tmp_path):
    """SIGKILL just after the seed top-up wrote its 2nd round (before any of its runs started) and
    just after it wrote its end: the rerun redoes no finished run and ends with the record (its end
    included) and recommendation of an uninterrupted probe."""
    whole = subprocess.run(_async_probe(tmp_path / "whole"), capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    expected = _async_answer(tmp_path / "whole")
    for when in ("2", "end"):  # keyed on the record, not on a count of writes (clears write it too)
        results = tmp_path / f"killed_{when}"
        killed = subprocess.run(_async_probe(results, when), capture_output=True, text=True)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        said = killed.stderr.splitlines()[-1]  # where it was killed, as the kill script says
        where = " rounds=2 end=None" if when == "2" else " end=TopUpEnd("
        assert said.startswith("killed after save ") and where in said, killed.stderr
        sealed = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in results.glob("runs/*/run.json")}
        resumed = subprocess.run(_async_probe(results), capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stderr
        assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sealed} == sealed, "a finished run redone"
        assert json.loads(resumed.stdout)["runs_done"] == 70 - len(sealed)
        assert _async_answer(results) == expected


@pytest.mark.slow
def test_two_async_probes_at_once_give_the_answer_of_one(tmp_path):
    """Two probes started on one results directory at once share its runs (each run's lock) and end
    with the seed top-up record, runs and recommendation of one uninterrupted probe. They used to
    decide top-up rounds each from the other's half-finished ones and overwrite each other's record
    (a round lost, intervals from another state)."""
    whole = subprocess.run(_async_probe(tmp_path / "whole"), capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr
    both = tmp_path / "both"
    first = subprocess.Popen(_async_probe(both), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    second = subprocess.Popen(_async_probe(both), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = [p.communicate(timeout=300) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], [err for _, err in outs]
    assert sum(json.loads(out)["runs_done"] for out, _ in outs) == len(list(both.glob("runs/*/run.json")))
    assert not list(both.glob("runs/*/steps.stale-*")), "a run was started twice"
    assert _async_answer(both) == _async_answer(tmp_path / "whole")
