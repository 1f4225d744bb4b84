"""Probe runs on Ray (``run.executor = "ray"``, docs/distributed.md): two placements, per backend.

- **Ray tasks** for in-process trainers (torch GRPO/PPO, TRL, NQM): the run function is a task asking
  for ``run.ray_num_cpus`` CPUs and ``run.ray_num_gpus`` GPUs; Ray reruns it up to
  ``run.ray_max_retries`` times when its worker or node is lost.
- **Ray Jobs** (``JobSubmissionClient.submit_job``) for the command backend: trainers such as verl or
  OpenRLHF call ``ray.init`` themselves, and a Ray task cannot host another Ray driver. The job's
  entrypoint is ``python -m batchtune.measure.ray_executor runs/<id>/ray-job.json``: the same run
  function the local executor calls, so the command's log, stdout, stderr and exit status reach the
  results store exactly as in a local run. The trainer's own ``ray.init()`` joins the cluster
  (Ray sets RAY_ADDRESS in a job's environment). The job's log is kept as ``runs/<id>/ray-job.log``.

Either way the run is claimed, written and sealed by the process that runs it, through the results
store's locks and atomic ``run.json``, on storage every node sees. A lost job is resubmitted up to
``run.ray_max_retries`` times; a run lost more often is sealed ``failed`` with Ray's reason, never
left half-sealed. At most ``run.workers`` runs are in flight at once (and no more than the cluster's
resources fit). A driver killed with ``kill -9`` leaves nothing behind on a local Ray it started
(Ray's processes die with it); on a cluster its tasks die with it and its jobs go on: a rerun adopts
a live job of the same run (matched by the job's metadata) instead of submitting another.

Ray is imported only in this module, and only when a probe runs on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchtune import codec
from batchtune.errors import BackendError, BatchtuneError, InputError
from batchtune.events import ProbeEvents
from batchtune.measure.plan import run_id, run_record
from batchtune.recipe.schema import Recipe, RunConfig
from batchtune.records.files import atomic_write_text
from batchtune.records.store import ResultsStore
from batchtune.records.types import RunRecord

JOB_BACKENDS = frozenset({"command"})  # trainers that may start Ray themselves: Ray Jobs, not tasks
POLL_S = 0.5  # how often in-flight tasks and jobs are checked
EXIT_TAKEN = 75  # a job's exit code when its run was finished or held by another process (EX_TEMPFAIL)
SUBMIT_WAIT_S = 30.0  # how long a job submission is retried while the cluster's job agent starts
JOB_PAYLOAD = "ray-job.json"  # the job's arguments, beside the run it makes
JOB_LOG = "ray-job.log"  # the job's output as Ray kept it
JOB_ERROR = "ray-job.error.json"  # written by a job whose run function raised outside the run

# The run function's positional arguments, as the local executor passes them:
# (recipe, results_dir, candidate, seed, base_lr, reference_batch, policy), and for a branched probe's
# run its run id and its checkpoint settings after them (measure.one_run.execute_run's rid, spec_extra)
RunArgs = tuple[Any, ...]
RunFn = Callable[..., "RunRecord | None"]


def args_run_id(a: RunArgs) -> str:
    """The id of the run ``a`` makes: a branched run's own, else candidate and seed's."""
    return str(a[7]) if len(a) > 7 else run_id(a[2], a[3])


def placement(training_backend: str) -> str:
    """``job`` for trainers that may call ``ray.init`` themselves, ``task`` for in-process ones."""
    return "job" if training_backend in JOB_BACKENDS else "task"


def gpus_per_run(recipe: Recipe, where: str) -> float:
    """``run.ray_num_gpus``; when negative (auto): the recipe's GPUs for a task on CUDA, else 0.

    A job's entrypoint gets none in auto: its trainer asks Ray for its own GPUs."""
    if recipe.run.ray_num_gpus >= 0:
        return recipe.run.ray_num_gpus
    if where == "task" and recipe.hardware.device == "cuda":
        return float(recipe.hardware.num_gpus)
    return 0.0


def run_on_ray(run_fn: RunFn, args: list[RunArgs], progress: ProbeEvents | None) -> int:
    """Run each of ``args`` once with ``run_fn`` on Ray; returns the number of runs done by this call.

    A run another process holds is left to it (the caller waits for it, as for the local executor)."""
    if not args:
        return 0
    recipe: Recipe = args[0][0]
    args = [tuple(_absolute(v) for v in (a[0], str(Path(a[1]).resolve()), *a[2:])) for a in args]
    where = placement(recipe.backend.training)
    try:
        import ray
    except ImportError:
        raise InputError("run.executor = 'ray' needs Ray: pip install 'batchtune[ray]'") from None
    _cluster_errors_to_stderr(ray)
    address = recipe.run.ray_address or os.environ.get("RAY_ADDRESS", "")
    if not ray.is_initialized() and (where == "task" or not address):
        # kept until this process exits (Ray shuts it down then): the probe calls here more than once
        ctx = ray.init(
            address=address or None,
            include_dashboard=where == "job",  # the job API lives in the dashboard
            log_to_driver=False,  # workers' output stays in Ray's logs, not in the --json stdout
            logging_level=logging.WARNING,
        )
        if where == "job":
            address = f"http://{ctx.dashboard_url}"
    if where == "job" and not address:
        address = ray.get_runtime_context().gcs_address
    if where == "task":
        return _run_tasks(ray, run_fn, args, recipe.run, gpus_per_run(recipe, "task"), progress)
    return _run_jobs(address, run_fn, args, recipe.run, gpus_per_run(recipe, "job"), progress)


def _cluster_errors_to_stderr(ray: Any) -> None:
    """Ray's driver prints the cluster's error messages ("(raylet) A worker died or was killed ...")
    on stdout, in its thread that listens for them (ray._private.worker.listen_error_messages calls
    print_to_stdstream with is_err False), ahead of the document `probe --json` prints there. Mark
    them as errors so they go to stderr. Ray's own module, so a Ray without that function is left as
    it is."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker, "print_to_stdstream", None)
    if original is None or getattr(original, "batchtune_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True} if data.get("pid") == "raylet" else data, ignore_prefix)

    to_stderr.batchtune_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr  # type: ignore[union-attr]


def _absolute(value: Any) -> Any:
    """Paths every node can resolve: a branched run's checkpoint settings (a dict of Paths) made
    absolute, as the results directory is (a task or job may start in another directory)."""
    if isinstance(value, dict):
        return {k: v.resolve() if isinstance(v, Path) else v for k, v in value.items()}
    return value


def _start(progress: ProbeEvents | None, a: RunArgs) -> None:
    if progress is not None:
        progress("start", {"run_id": args_run_id(a), "label": a[2].label, "seed": a[3]})


def _end(progress: ProbeEvents | None, rec: RunRecord) -> None:
    if progress is not None:
        progress("end", {"run_id": rec.run_id, "status": rec.status, "reason": rec.reason})


def seal_lost(a: RunArgs, status: str, reason: str) -> RunRecord | None:
    """Seal a run that Ray lost for good as ``status`` (failed or oom): data, like any failed run.

    None if the run was finished meanwhile or is held by a live process."""
    recipe, results_dir, cand, seed, base_lr, reference_batch = a[:6]
    store = ResultsStore(results_dir)
    rid = args_run_id(a)
    with store.claim(rid) as writer:
        if writer is None:
            return None
        record = run_record(
            cand, seed, base_lr, reference_batch, status, reason, rid=rid, backend=recipe.backend.training
        )
        writer.finish(record)
        return record


def _run_tasks(
    ray: Any, run_fn: RunFn, args: list[RunArgs], cfg: RunConfig, gpus: float, progress: ProbeEvents | None
) -> int:
    options: dict[str, Any] = {"num_cpus": cfg.ray_num_cpus, "num_gpus": gpus}
    options["max_retries"] = cfg.ray_max_retries  # reruns when the worker or its node is lost
    if cfg.ray_env:
        options["runtime_env"] = {"env_vars": dict(cfg.ray_env)}
    remote = ray.remote(**options)(run_fn)
    queue = list(args)
    inflight: dict[Any, RunArgs] = {}
    done = 0
    try:
        while queue or inflight:
            while queue and len(inflight) < cfg.workers:
                a = queue.pop(0)
                inflight[remote.options(name=args_run_id(a)).remote(*a)] = a  # named by run in Ray's views
                _start(progress, a)
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=POLL_S)
            for ref in ready:
                a = inflight.pop(ref)
                rec = _task_result(ray, ref, a, cfg.ray_max_retries)
                if rec is not None:
                    done += 1
                    _end(progress, rec)
    finally:
        for ref in inflight:  # Ctrl-C, SIGTERM or an error: stop the runs still going
            ray.cancel(ref, force=True)
    return done


def _task_result(ray: Any, ref: Any, a: RunArgs, retries: int) -> RunRecord | None:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:  # the run function raised outside the run (not data)
        cause = exc.cause if isinstance(exc.cause, BaseException) else None
        if isinstance(cause, BatchtuneError):
            raise cause from None
        raise BackendError(f"run {args_run_id(a)} raised on Ray: {cause or exc}") from None
    except ray.exceptions.OutOfMemoryError as exc:  # Ray's memory monitor killed the worker
        return seal_lost(a, "oom", f"killed by Ray's memory monitor: {_first_line(exc)}")
    except ray.exceptions.RayError as exc:  # worker or node lost, after Ray's own retries
        lost = f"lost on Ray after {retries} retries: {type(exc).__name__}: {_first_line(exc)}"
        return seal_lost(a, "failed", lost)


def _first_line(exc: BaseException | str) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _job_payload(run_fn: RunFn, a: RunArgs) -> str:
    """The job's arguments as JSON: each dataclass with its type, so the entrypoint rebuilds it."""

    def encode(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            kind = type(value)
            return {"__type__": f"{kind.__module__}:{kind.__qualname__}", "value": codec.to_jsonable(value)}
        return codec.to_jsonable(value)

    return codec.dumps(
        {"run": f"{run_fn.__module__}:{run_fn.__qualname__}", "args": [encode(v) for v in a]}, indent=1
    )


def _resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _decode_payload(text: str, where: str) -> tuple[RunFn, list[Any]]:
    data = codec.loads(text, where)
    args = [
        codec.from_dict(_resolve(v["__type__"]), v["value"], where)
        if isinstance(v, dict) and "__type__" in v
        else v  # plain values, and plain dicts (a branched run's checkpoint settings)
        for v in data["args"]
    ]
    return _resolve(data["run"]), args


def _run_jobs(
    address: str,
    run_fn: RunFn,
    args: list[RunArgs],
    cfg: RunConfig,
    gpus: float,
    progress: ProbeEvents | None,
) -> int:
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    root = args[0][1]
    live: dict[str, str] = {  # this results directory's jobs still running: a rerun after kill -9 adopts them
        (job.metadata or {}).get("batchtune_run", ""): str(job.submission_id)
        for job in client.list_jobs()
        if (job.metadata or {}).get("batchtune_results") == root and not job.status.is_terminal()
    }
    python = cfg.ray_python or sys.executable
    queue = list(args)
    attempts: dict[str, int] = {}
    inflight: dict[str, RunArgs] = {}  # submission id -> args
    done = 0
    try:
        while queue or inflight:
            while queue and len(inflight) < cfg.workers:
                a = queue.pop(0)
                rid = args_run_id(a)
                if rid in live:
                    inflight[live.pop(rid)] = a
                    continue
                inflight[_submit(client, python, run_fn, a, cfg, gpus)] = a
                attempts[rid] = attempts.get(rid, 0) + 1
                _start(progress, a)
            time.sleep(POLL_S)
            for sid, a in list(inflight.items()):
                status = client.get_job_status(sid)
                if not status.is_terminal():
                    continue
                del inflight[sid]
                rid = args_run_id(a)
                store = ResultsStore(a[1])
                info = client.get_job_info(sid)
                atomic_write_text(store.run_dir(rid) / JOB_LOG, client.get_job_logs(sid))
                if store.is_finished(rid):
                    if status == JobStatus.SUCCEEDED:
                        done += 1
                        _end(progress, store_run(store, rid))
                    continue
                if info.driver_exit_code == EXIT_TAKEN:
                    continue  # held by another live process: the caller waits for it
                _raise_job_error(store, rid)
                if attempts.get(rid, 0) <= cfg.ray_max_retries:
                    queue.insert(0, a)  # lost (node, runtime env, supervisor): resubmit
                    continue
                reason = f"Ray job {sid} {status}: {_first_line(info.message or '')}"
                rec = seal_lost(a, "failed", reason)
                if rec is not None:
                    done += 1
                    _end(progress, rec)
    finally:
        for sid in inflight:  # Ctrl-C or SIGTERM: stop the trainers (a kill -9 leaves them to a rerun)
            with contextlib.suppress(Exception):  # the cluster may be gone too
                client.stop_job(sid)
    return done


def _submit(client: Any, python: str, run_fn: RunFn, a: RunArgs, cfg: RunConfig, gpus: float) -> str:
    rid = args_run_id(a)
    store = ResultsStore(a[1])
    payload = store.run_dir(rid) / JOB_PAYLOAD
    atomic_write_text(payload, _job_payload(run_fn, a) + "\n")
    (store.run_dir(rid) / JOB_ERROR).unlink(missing_ok=True)
    entrypoint = f"{shlex.quote(python)} -m batchtune.measure.ray_executor {shlex.quote(str(payload))}"
    deadline = time.monotonic() + SUBMIT_WAIT_S
    while True:
        try:
            return client.submit_job(
                entrypoint=entrypoint,
                submission_id=f"batchtune-{rid}-{uuid.uuid4().hex[:8]}",
                runtime_env={"env_vars": {"PYTHONUNBUFFERED": "1", **cfg.ray_env}},
                metadata={"batchtune_results": a[1], "batchtune_run": rid},
                entrypoint_num_cpus=cfg.ray_num_cpus,
                entrypoint_num_gpus=gpus,
            )
        except RuntimeError as exc:  # a cluster just started has no job agent for a few seconds
            if "try again" not in str(exc) or time.monotonic() > deadline:
                hint = (
                    " (is another Ray on this machine holding the job agent's port 52365? start one with "
                    "`ray start --head` and set run.ray_address)"
                    if "agent" in str(exc)
                    else ""
                )
                raise BackendError(
                    f"Ray did not take the job of run {rid}: {_first_line(exc)}{hint}"
                ) from None
            time.sleep(1.0)


def store_run(store: ResultsStore, rid: str) -> RunRecord:
    path = store.run_dir(rid) / "run.json"
    return codec.from_dict(RunRecord, codec.loads(path.read_text(encoding="utf-8"), str(path)), str(path))


def _raise_job_error(store: ResultsStore, rid: str) -> None:
    """Re-raise, in the driver, an error the job's run function raised (a wrong recipe: not data)."""
    path = store.run_dir(rid) / JOB_ERROR
    if not path.exists():
        return
    data = codec.loads(path.read_text(encoding="utf-8"), str(path))
    try:
        kind = _resolve(data["type"])
        error = kind(data["message"]) if issubclass(kind, BatchtuneError) else None
    except (ImportError, AttributeError, TypeError, ValueError):
        error = None
    raise error or BackendError(f"run {rid} raised on Ray: {data['message']}")


def main(argv: list[str]) -> int:
    """A Ray Job's entrypoint: run one probe run from its payload file; the exit code says how it went."""
    if len(argv) != 1:
        print("usage: python -m batchtune.measure.ray_executor RUN_DIR/ray-job.json", file=sys.stderr)
        return 2

    def on_term(signum: int, frame: Any) -> None:  # `ray job stop`: unwind so the trainer is stopped
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    payload = Path(argv[0])
    run_fn, args = _decode_payload(payload.read_text(encoding="utf-8"), str(payload))
    try:
        record = run_fn(*args)
    except BatchtuneError as exc:
        kind = type(exc)
        atomic_write_text(
            payload.with_name(JOB_ERROR),
            codec.dumps({"type": f"{kind.__module__}:{kind.__qualname__}", "message": str(exc)}) + "\n",
        )
        print(f"batchtune: {exc}", file=sys.stderr)
        return 1
    if record is None:
        print("batchtune: this run is finished or held by another process", file=sys.stderr)
        return EXIT_TAKEN
    print(f"batchtune: {record.run_id}: {record.status} {record.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
