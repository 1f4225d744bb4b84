"""The two-process async run (backends/torch_rl/async_run.py): staleness bound, records, cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from batchtune.backends.spec import Candidate, RunFailed, RunSpec
from batchtune.backends.torch_rl import TorchRLBackend
from batchtune.backends.torch_rl.async_run import check_async, sync_interval
from batchtune.recipe.load import load_recipe
from tests.drill_kit import sigint_as_a_terminal_sends_it

BASE = [
    "model.pretrain_steps=20",
    'task.name="reverse"',
    "task.difficulty=4",
    "task.eval_size=0",
    'target.metric="reward"',
    "hardware.threads=1",
    "generation.max_new_tokens=6",
    'hardware.device="cpu"',
    'algorithm.mode="async"',
]
KEYS = {"staleness", "wall_s", "queue_wait_s", "sync_s", "load_s", "worker_wait_s", "reward", "loss"}
KEYS |= {"gen_cpu_s", "train_cpu_s", "bound_wait_s", "put_wait_s", "pack_s", "unpack_s", "outside_s"}


pytestmark = pytest.mark.usefixtures("restore_torch_threads")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("async")


def make_spec(root: Path, *extra: str, k: int = 1, samples: int = 96) -> RunSpec:
    recipe = load_recipe(None, [*BASE, f"budget.max_samples={samples}", *extra])
    cand = Candidate("P2xG8", 2, 8, 3e-4, "sqrt", staleness=k)
    return RunSpec("P2xG8-s0", cand, 0, recipe, root / "runs" / "x", 3e-4, 16)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.slow  # each spawn imports torch and transformers afresh: 14 s at load 4
@pytest.mark.parametrize(("k", "sync_every"), [(0, 1), (0, 2), (2, 3)])
def test_rollouts_stay_within_the_staleness_bound(root, k, sync_every):
    recs = list(TorchRLBackend().train(make_spec(root, f"algorithm.sync_every={sync_every}", k=k)))
    assert [r.samples for r in recs] == [16 * i for i in range(1, 7)]
    assert all(set(r.metrics) >= KEYS for r in recs)
    lags = [r.metrics["staleness"] for r in recs]
    assert max(lags) <= k and lags[0] == 0.0
    assert all(r.gen_s > 0 and r.train_s > 0 and r.metrics["wall_s"] > 0 for r in recs)
    assert not mp.active_children()  # the worker was joined


@pytest.mark.slow
def test_closing_the_run_early_stops_the_worker(root):
    run = TorchRLBackend().train(make_spec(root, k=1, samples=100_000))
    next(run)
    (worker,) = mp.active_children()
    run.close()
    assert not worker.is_alive() and not mp.active_children()


def test_sync_every_beyond_the_bound_is_refused(root):
    with pytest.raises(RunFailed, match="sync_every = 3 exceeds staleness"):
        list(TorchRLBackend().train(make_spec(root, "algorithm.sync_every=3", k=1)))


def test_the_on_policy_reference_syncs_every_step(root):
    """k = 0 (the probe's reference of every async probe) syncs every step whatever sync_every says:
    refusing it failed every probe with sync_every > 1 at its reference."""
    spec = make_spec(root, "algorithm.sync_every=3", k=0)
    check_async(spec)  # not refused
    assert sync_interval(spec) == 1
    assert sync_interval(make_spec(root, "algorithm.sync_every=3", k=2)) == 3


SCRIPT = """
import faulthandler, signal, sys, torch.multiprocessing as mp
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's stack dump if SIGINT hangs
sys.path.insert(0, {tests!r})
from test_async_run import TorchRLBackend, make_spec
from pathlib import Path
if __name__ == "__main__":
    run = TorchRLBackend().train(make_spec(Path({root!r}), k=1, samples=100_000))
    next(run)
    print(mp.active_children()[0].pid, flush=True)
    for _ in run:
        pass
"""


@pytest.mark.slow
def test_sigint_leaves_no_orphan_worker(root):
    script = SCRIPT.format(tests=str(Path(__file__).parent), root=str(root))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    err = (root / "stderr.txt").open("wb")  # a file, not a pipe: the child never blocks on it
    cmd = [sys.executable, "-c", textwrap.dedent(script)]
    # not ignored, as in a suite started with `&` (SIGINT then never raises in the child)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=err, env=env, preexec_fn=sigint_as_a_terminal_sends_it
    )
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        assert alive(pid)
        proc.send_signal(signal.SIGINT)
        try:
            assert proc.wait(timeout=30) != 0  # KeyboardInterrupt
        except subprocess.TimeoutExpired:  # say where it hung
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            proc.kill()
            threads = (root / "stderr.txt").read_text(errors="replace")[-6000:]
            pytest.fail(f"no exit 30 s after SIGINT; its threads:\n{threads}")
        deadline = time.time() + 10
        while alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        assert not alive(pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()


def test_a_worker_dying_at_start_up_is_a_clear_error_not_a_hang(root, monkeypatch):
    """The child exits before it reads anything (its interpreter is /bin/false): starting it must
    not block on the pipe of its arguments (the initial weights are larger than its buffer), and
    the trainer's wait for the first batch ends in a clear error."""
    import multiprocessing.resource_tracker
    import multiprocessing.spawn
    import threading

    from batchtune.backends.torch_rl.async_run import _Pipe

    multiprocessing.resource_tracker.ensure_running()  # spawned with the real interpreter
    monkeypatch.setattr(multiprocessing.spawn, "_python_exe", b"/bin/false")
    got: list[BaseException] = []
    dirs: list[Path] = []

    def run() -> None:
        pipe = _Pipe(make_spec(root, k=1), {"w": torch.zeros(1 << 20)}, 1)  # 4 MiB of weights
        dirs.append(pipe.dir)
        try:
            pipe.next_batch()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            got.append(exc)
        finally:
            pipe.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=8)
    assert not thread.is_alive(), "the trainer hung starting a worker that died"
    (exc,) = got
    assert isinstance(exc, RunFailed) and exc.message == "the rollout worker exited at start-up (code 1)"
    assert not mp.active_children()
    assert dirs and not dirs[0].exists(), "the weights' files were left behind"


def test_a_batch_sent_just_before_the_worker_exits_is_still_read(tmp_path: Path) -> None:
    """The trainer's wait: poll the batches pipe, and between polls see whether the worker lives. A
    worker that sent its last batch and exited between a poll that timed out and that check was taken
    for one that died ("exited after N batches (code 0)"), the batch waiting in the pipe. The check
    now looks at the pipe once more first."""
    from batchtune.backends.torch_rl.async_run import _Pipe, _write, to_bytes

    path = _write(tmp_path / "batch-0.pt", to_bytes({"rewards": [1.0]}))

    class Batches:  # the first poll times out; the batch arrives before the liveness check
        polls = 0

        def poll(self, timeout: float = 0.0) -> bool:
            self.polls += 1
            return self.polls > 1

        def recv(self) -> tuple[str, str]:
            return ("batch", path)

    class Gone:
        exitcode = 0

        def is_alive(self) -> bool:
            return False

        def join(self, timeout: float | None = None) -> None:
            pass

    class Slots:
        def release(self) -> None:
            pass

    pipe = object.__new__(_Pipe)
    pipe.batches, pipe.proc, pipe.slots, pipe.received = Batches(), Gone(), Slots(), 0
    made = pipe.next_batch()
    assert made["rewards"] == [1.0] and pipe.received == 1
