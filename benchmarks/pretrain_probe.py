"""Benchmark: the whole pre-training probe of recipes/tiny-pretrain.toml, timed, with the machine's load.

    python benchmarks/pretrain_probe.py > benchmarks/out/tiny_pretrain_probe.txt

Runs `batchtune probe recipes/tiny-pretrain.toml` from scratch into a temporary results directory
(the CLI's own tables, 100 columns), copies the B_opt/B_min plot to
docs/img/tiny-pretrain-bopt-bmin.png, and prints the load average before and after and one JSON
line (wall_s, runs, steps, B_opt per target). Extra arguments are passed to the probe (`--set ...`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.records.store import ResultsStore

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "tiny-pretrain.toml"
PNG = ROOT / "docs" / "img" / "tiny-pretrain-bopt-bmin.png"


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(extra: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "tiny-pretrain"
        args = ["probe", str(RECIPE), "--set", f"run.results_dir={results}", *extra]
        load_before = _load()
        t0 = time.perf_counter()
        out = CliRunner(env={"COLUMNS": "100"}).invoke(app, args, catch_exceptions=False)
        wall_s = time.perf_counter() - t0
        load_after = _load()
        if out.exit_code != 0:
            sys.stderr.write(out.output)
            raise SystemExit(out.exit_code)
        store = ResultsStore(results)
        steps = sum(len(store.steps(r.run_id)) for r in store.runs())
        runs = len(store.runs())
        shutil.copyfile(store.plots_dir / "bopt_bmin.png", PNG)
        as_json = CliRunner().invoke(app, [*args, "--json"], catch_exceptions=False)  # resumes: no runs
    progress = re.compile(r"^\s+B\d+-s\d+: |runs \(|results in ")  # per-run lines, the bar, tmp paths
    text = "\n".join(line for line in out.output.splitlines() if not progress.search(line))
    cmd = "batchtune probe recipes/tiny-pretrain.toml"
    print(f"$ {cmd}   (cpus: {os.cpu_count()}, load average before: {load_before})")
    print(text.rstrip())
    print(f"load average after: {load_after}")
    est = json.loads(as_json.stdout)["analysis"]["estimates"]
    summary = {
        "wall_s": round(wall_s, 1),
        "runs": runs,
        "optimizer_steps": steps,
        "load_avg_1m_before": float(load_before.split()[0]),
        "b_opt_tokens_by_target": {f"{e['target_loss']:g}": e["b_opt_tokens"] for e in est},
        "b_opt_ci_by_target": {f"{e['target_loss']:g}": e["b_opt_ci"] for e in est},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
