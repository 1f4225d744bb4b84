"""Render a `batchtune report` page in a real headless browser and save a screenshot.

    python benchmarks/report_screenshot.py                       # NQM probe + report, then screenshot
    python benchmarks/report_screenshot.py --results DIR         # an existing results directory

Needs Chromium from the OS packages (`apt-get install chromium`). The browser runs with the network
and every background service off, so the page must render from itself alone (plots are embedded):
a missing image or style would show in the PNG. Output: docs/img/report.png and one JSON line with
the sizes (bytes) and the browser's wall time (s).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
NQM_SETTINGS = (
    "candidates.prompts=[1,2,4,8,16,32,64]",
    "budget.seeds=[0,1,2]",
    "budget.max_samples=16384",
    "target.value=2.0",
)


def _batchtune(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "batchtune", *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL
    )


def make_results(where: Path) -> Path:
    """A small NQM probe (seconds): the report has curves, a ranking and a winner to show."""
    results = where / "nqm-report"
    sets = [x for s in NQM_SETTINGS for x in ("--set", s)]
    _batchtune("probe", "nqm", "-r", str(results), *sets, "--json")
    _batchtune("recommend", "-r", str(results), "--throughput", "probe", "--json")
    return results


def screenshot(page: Path, png: Path, width: int = 1100, height: int = 2400) -> float:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("chromium not found: apt-get install chromium")
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        t0 = time.perf_counter()
        subprocess.run(
            [
                browser,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--screenshot={png}",
                page.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, help="an existing results directory (default: a new NQM probe)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "report.png")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = args.results or make_results(Path(tmp))
        _batchtune("report", str(results), "--out", tmp)
        page = Path(tmp) / "report.html"
        wall_s = screenshot(page, args.out)
        html_bytes = page.stat().st_size
    print(f"screenshot of {page.name} ({html_bytes:,} bytes) -> {args.out}")
    print(
        json.dumps({"html_bytes": html_bytes, "png_bytes": args.out.stat().st_size, "browser_wall_s": wall_s})
    )


if __name__ == "__main__":
    main()
