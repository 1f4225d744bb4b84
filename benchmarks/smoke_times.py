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
import subprocess
import sys
import time

from batchtune import codec
from batchtune.recipe.load import shipped_recipes

SKIP = {"hunyuan-grpo-measurements": "a measurements file, not a recipe"}
ABBREV = {"ok": "ok", "failed": "FAIL", "skipped": "skip"}


def smoke_once(name: str) -> dict[str, object]:
    argv = [sys.executable, "-m", "batchtune", "smoke", name, "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - t0
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        err = proc.stderr.strip().splitlines()
        return {"recipe": name, "wall_s": round(wall_s, 1), "exit": proc.returncode, "stages": "-",
                "note": (err[-1] if err else "no output")[:110]}  # fmt: skip
    stages = " ".join(f"{s['name']}:{ABBREV[s['status']]}" for s in result["stages"])
    failed = [s for s in result["stages"] if s["status"] == "failed"]
    note = f"{failed[0]['name']}: {failed[0]['detail']}" if failed else ""
    return {"recipe": name, "wall_s": round(wall_s, 1), "exit": proc.returncode, "stages": stages,
            "note": note[:110]}  # fmt: skip


def main() -> None:
    load_before = os.getloadavg()[0]
    rows = [smoke_once(name) for name in sorted(shipped_recipes()) if name not in SKIP]
    load_after = os.getloadavg()[0]
    print(f"{'recipe':22} {'wall s':>6} {'exit':>4}  stages")
    for r in rows:
        print(f"{r['recipe']:22} {r['wall_s']:6.1f} {r['exit']:4}  {r['stages']}")
    print("\nwhy a stage failed (the run's own reason, shortened):")
    for r in rows:
        if r["note"]:
            print(f"  {r['recipe']}: {r['note']}")
    print(f"\n{os.cpu_count()} CPU cores; 1-min load average {load_before:.1f} before, {load_after:.1f} after")
    print(codec.dumps({"smoke_wall_s": {r["recipe"]: r["wall_s"] for r in rows},
                       "smoke_exit": {r["recipe"]: r["exit"] for r in rows}}))  # fmt: skip


if __name__ == "__main__":
    main()
