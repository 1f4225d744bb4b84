"""Does the default pick hold when the machine is busy? (issue 32: the pick flipped with load)

    python benchmarks/pick_stability.py > benchmarks/out/pick_stability.txt

`batchtune tune` is probe -> profile-gen -> recommend. The probe's sample-efficiency table is the same
digit for digit from run to run (fixed seeds), so what load can move is the throughput profile. This
script probes the default recipe once (resumable, in a cache directory), then repeats profile-gen +
recommend `--runs` times, alternating as-is runs with runs where it starts one spinner per core (plain
busy loops outside batchtune's process tree, which the contention meter counts). Each row: the load,
the profile's contention reading, whether the output warned, the pick and the two lowest E[T]/T0.

Acceptance (issue 32): the same pick in >= 9 of 10 runs, or a warning on every run whose profile was
contended. "as-is" is only as quiet as the machine was: the load column says how quiet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path


def _spin() -> None:  # pragma: no cover - runs in a child process
    while True:
        pass


def _batchtune(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "batchtune", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _one(results: Path, loaded: bool, transient: float = 0.0) -> dict[str, object]:
    """profile-gen + recommend; ``loaded``: one spinner per core, for the whole profile-gen, or for
    only its first ``transient`` seconds (a load that goes away, as another job ending)."""
    spinners = [mp.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)] if loaded else []
    for s in spinners:
        s.start()
    try:
        time.sleep(1.0 if loaded else 0.0)
        load = float(Path("/proc/loadavg").read_text().split()[0])
        cmd = [sys.executable, "-m", "batchtune", "profile-gen", "--results", str(results), "--json"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if transient > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=transient)
            for s in spinners:
                s.terminate()
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"profile-gen failed: {err.strip()[-300:]}")
    finally:
        for s in spinners:
            s.terminate()
    retimed = str(json.loads(out).get("retimed", "")) if out.strip().startswith("{") else ""
    rec = _batchtune("recommend", "--results", str(results), "--json")
    if rec.returncode != 0:
        raise SystemExit(f"recommend failed: {rec.stderr.strip()[-300:]}")
    data = json.loads(rec.stdout)
    pick = data["recommended"]
    ranked = sorted(
        (c for c in data["candidates"] if c.get("expected_time_ratio") is not None),
        key=lambda c: c["expected_time_ratio"],
    )
    warned = any("ontended" in e for e in pick["evidence"]) or "contended" in str(data["throughput_source"])
    return {
        "mode": "loaded" if loaded else "as-is",
        "load": load,
        "source": data["throughput_source"],
        "warned": warned,
        "pick": pick["name"],
        "top2": [(c["name"], c["expected_time_ratio"]) for c in ranked[:2]],
        "retimed": retimed,
        "noise": pick.get("throughput_noise"),
    }


def _retimed_words(note: str) -> str:
    """The re-timing in a few words: "no", "off", or the readings and which was kept."""
    if not note:
        return "no"
    if note.startswith("not re-timed"):
        return "off"
    readings = note.split("each: ")[1].split(" of ")[0] if "each: " in note else "?"
    kept = note.split("kept timing ")[1].split(",")[0] if "kept timing " in note else "?"
    return f"{readings} cores, kept {kept}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--transient", type=float, default=0.0, help="stop the spinners after S s of profile-gen")
    ap.add_argument("--results", default=str(Path.home() / ".cache" / "batchtune-bench" / "pick_stability"))
    args = ap.parse_args()
    results = Path(args.results)
    t0 = time.time()
    probe = _batchtune("probe", "--results", str(results))  # resumes finished runs
    if probe.returncode != 0:
        raise SystemExit(f"probe failed: {probe.stderr.strip()[-300:]}")
    took = time.time() - t0
    print(f"# default recipe (tiny-grpo), {os.cpu_count()} cores; probe {took:.0f} s (resumed if cached)")
    if args.transient:
        print(f"# loaded runs: the spinners stop {args.transient:g} s into profile-gen (a passing load)")
    rows = [_one(results, loaded=i % 2 == 1, transient=args.transient) for i in range(args.runs)]
    head = "| run | machine | load | throughput source | warned | pick | lowest E[T]/T0 | second |"
    print(head + " re-timed | holds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows, 1):
        (n1, t1), (n2, t2) = r["top2"]  # type: ignore[misc]
        noise = r["noise"]
        holds = f"{noise['holds']:.0%}" if isinstance(noise, dict) else "-"
        retimed = _retimed_words(str(r["retimed"]))
        print(
            f"| {i} | {r['mode']} | {r['load']:.1f} | {r['source']} | {'yes' if r['warned'] else 'no'} "
            f"| {r['pick']} | {n1} {t1:.3f} | {n2} {t2:.3f} | {retimed} | {holds} |"
        )
    picks = Counter(str(r["pick"]) for r in rows)
    top, n_top = picks.most_common(1)[0]
    contended = [r for r in rows if "contended" in str(r["source"])]
    warned = sum(1 for r in contended if r["warned"])
    print(f"same pick ({top}) in {n_top} of {len(rows)} runs; picks: {dict(picks)}")
    print(f"contended profiles: {len(contended)} of {len(rows)}; warned on {warned} of them")
    ok = n_top >= 0.9 * len(rows) or warned == len(contended)
    verdict = "met" if ok else "NOT met"
    print(f"acceptance (same pick in >= 90%, or a warning on every contended run): {verdict}")


if __name__ == "__main__":
    main()
