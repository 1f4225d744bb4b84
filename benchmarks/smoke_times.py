"""Wall time of `batchtune smoke` on every shipped recipe (target: <= 10 s each on 2 CPU cores).

    python benchmarks/smoke_times.py > benchmarks/smoke_times.txt

In process (no interpreter start counted), one run per recipe after a warm-up import; prints a table
and one JSON line with units in its keys.
"""

from __future__ import annotations

import time

from batchtune import codec, workflow_ci
from batchtune.errors import BatchtuneError
from batchtune.recipe.load import shipped_recipes

SKIP = {"hunyuan-grpo-measurements": "a measurements file, not a recipe"}


def main() -> None:
    rows = []
    for name, path in sorted(shipped_recipes().items()):
        if name in SKIP:
            continue
        t0 = time.perf_counter()
        try:
            res = workflow_ci.smoke(str(path), [], None)
            status = (
                "ok"
                if res.ok
                else "failed: " + "; ".join(s.detail for s in res.stages if s.status == "failed")
            )
        except BatchtuneError as exc:
            status = f"error: {exc}"
        rows.append({"recipe": name, "wall_s": round(time.perf_counter() - t0, 2), "status": status[:100]})
    print(f"{'recipe':28} {'wall s':>7}  status")
    for r in rows:
        print(f"{r['recipe']:28} {r['wall_s']:7.2f}  {r['status']}")
    print(codec.dumps({"smoke_wall_s": {r["recipe"]: r["wall_s"] for r in rows}}))


if __name__ == "__main__":
    main()
