"""Wall time of `batchtune smoke` on every shipped recipe (target: <= 10 s each on 2 CPU cores).

    python benchmarks/smoke_times.py > benchmarks/out/smoke_times.txt

Each recipe runs as CI runs it: `batchtune smoke NAME --json` in a fresh process, so the interpreter
start and the torch/transformers imports a recipe needs are counted. Prints, per recipe, the wall
time, the exit code and each stage's status (ok / failed / skipped), then the first failed stage's
reason, the load average before and after, and one JSON line with units in its keys.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

from batchtune import codec
from batchtune.recipe.load import shipped_recipes

SKIP = {"hunyuan-grpo-measurements": "a measurements file, not a recipe"}
ABBREV = {"ok": "ok", "failed": "FAIL", "skipped": "skip"}


def timed(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """The finished process, its wall seconds and its CPU seconds (user + system, children included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall_s, cpu_s


def smoke_once(name: str) -> dict[str, object]:
    proc, wall_s, cpu_s = timed([sys.executable, "-m", "batchtune", "smoke", name, "--json"])
    row: dict[str, object] = {"recipe": name, "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
                              "exit": proc.returncode, "probe_s": 0.0, "stages": "-", "note": ""}  # fmt: skip
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        err = proc.stderr.strip().splitlines()
        return {**row, "note": (err[-1] if err else "no output")[:120]}
    failed = [s for s in result["stages"] if s["status"] == "failed"]
    note = f"{failed[0]['name']}: {failed[0]['detail']}" if failed else ""
    note = note.replace(os.path.dirname(sys.executable) + "/", "").replace("command exited with code", "exit")
    return {
        **row,
        "probe_s": round(result["stages"][0]["wall_s"], 1),
        "stages": " ".join(f"{s['name']}:{ABBREV[s['status']]}" for s in result["stages"]),
        "note": note[:120],
    }


def main() -> None:
    load_before = os.getloadavg()[0]
    imports = "import batchtune.workflow, torch, transformers.models.llama.modeling_llama"
    _, import_wall_s, import_cpu_s = timed([sys.executable, "-c", imports])
    rows = [smoke_once(name) for name in sorted(shipped_recipes()) if name not in SKIP]
    load_after = os.getloadavg()[0]
    print(f"{'recipe':22} {'wall s':>6} {'cpu s':>6} {'probe s':>7} {'exit':>4}  stages")
    for r in rows:
        times = f"{r['wall_s']:6.1f} {r['cpu_s']:6.1f} {r['probe_s']:7.1f}"
        print(f"{r['recipe']:22} {times} {r['exit']:4}  {r['stages']}")
    print("\nwhy a stage failed (the run's own reason, shortened):")
    for r in rows:
        if r["note"]:
            print(f"  {r['recipe']}: {r['note']}")
    print(
        f"\nwall s: the whole `batchtune smoke NAME` process; cpu s: its user + system CPU seconds; "
        f"probe s: the probe stage\n(a command recipe's probe is its trainer starting and failing here). "
        f"Importing batchtune, torch and\ntransformers' Llama alone: {import_wall_s:.1f} s wall, "
        f"{import_cpu_s:.1f} s CPU. {os.cpu_count()} CPU cores shared; 1-min load average "
        f"{load_before:.1f} before, {load_after:.1f} after."
    )
    print(codec.dumps({"smoke_wall_s": {r["recipe"]: r["wall_s"] for r in rows},
                       "smoke_cpu_s": {r["recipe"]: r["cpu_s"] for r in rows},
                       "smoke_exit": {r["recipe"]: r["exit"] for r in rows},
                       "import_wall_s": round(import_wall_s, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
