"""Does the tool's own regret bound hold the truth, and does it flag the probes that picked wrong?

    python benchmarks/regret_bound.py > benchmarks/out/regret_bound.txt

`recommended.regret_high` in `tune --json` (analysis/decide/ranking.regret_bound): how much faster than the
pick another candidate could be, at the far end of each comparison's 90% interval. A pick with
regret_high near 1 is separated from every other batch; a large one says the evidence cannot tell
them apart; inf says the pick's own interval is open above.

Probes, all on recipes/nqm.toml (truth: the closed-form expected loss and the grid's throughput, as
benchmarks/branched_cost.py):
  - the one-checkpoint sweep of benchmarks/branched_sweep.py (trunk 1024/1536/2048, W 1024/2048,
    one or two seeds, 8 seed sets each: 96 probes, the cheapest settings, most misses);
  - the branched defaults of the recipe at 8 seed sets of three (`--set probe.mode=branched`);
  - the grid (the shipped default) at 3 seed sets of three.
Prints, per group: probes, misses (true regret > 1.05), how often the bound holds the true regret
(its claim: about 90% or more, since each candidate's comparison is a 90% interval and the bound
takes the worst), for each threshold how many misses and how many hits it flags, and the same for
the recommendation's "Weak evidence" warning (analysis/decide/recommend.weak_evidence). Simulated
seconds; deterministic per seed. A line per probe goes to stderr.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from branched_cost import true_times, tune_json  # noqa: E402
from branched_sweep import one_checkpoint  # noqa: E402

THRESHOLDS = (1.05, 1.1, 1.25, 1.5)
MISS = 1.05


def sweep_settings() -> list[list[str]]:
    """benchmarks/branched_sweep.py's 96 settings, in its order."""
    return [
        one_checkpoint(trunk, window, list(range(k * ns, k * ns + ns)))
        for trunk in (1024, 1536, 2048)
        for window in (1024, 2048)
        for ns in (1, 2)
        for k in range(8)
    ]


GROUPS = {
    "one-checkpoint sweep": sweep_settings(),
    "branched defaults": [
        ["probe.mode=branched", f"budget.seeds={[3 * k, 3 * k + 1, 3 * k + 2]}"] for k in range(8)
    ],
    "grid (default)": [
        ["probe.mode=grid", f"budget.seeds={[3 * k, 3 * k + 1, 3 * k + 2]}"] for k in range(3)
    ],
}


def main() -> None:
    grid = tune_json(["probe.mode=grid"])
    assert grid is not None, "the grid probe failed"
    t = true_times(grid)
    best = min(t.values())
    head = f"{'group':<22} {'probes':>6} {'misses':>6} {'bound holds':>11}"
    head += "".join(f" {'flag >' + format(x, 'g') + ' miss/hit':>19}" for x in THRESHOLDS)
    head += f" {'weak miss/hit':>19}"
    print(head)
    print("-" * len(head))
    for group, settings in GROUPS.items():
        rows: list[tuple[float, float, bool]] = []
        for sets in settings:
            d = tune_json(sets)
            if d is None:
                print(f"{group}: {sets}: failed", file=sys.stderr)
                continue
            rec = d["recommended"]
            regret = t[rec["name"]] / best
            # "inf" in JSON where the pick's interval is open above, None where it has none (one seed)
            high = math.inf if rec["regret_high"] is None else float(rec["regret_high"])
            weak = bool(rec["evidence"])
            rows.append((regret, high, weak))
            print(
                f"{group}: {sets[1:]}: {rec['name']} regret {regret:.3f} bound {high:.3f} "
                f"against {rec['regret_against']}; weak: {' | '.join(rec['evidence']) or 'no'}",
                file=sys.stderr,
                flush=True,
            )
        misses = [(h, w) for r, h, w in rows if r > MISS]
        hits = [(h, w) for r, h, w in rows if r <= MISS]
        holds = sum(r <= h * (1 + 1e-9) for r, h, _ in rows)
        line = f"{group:<22} {len(rows):>6} {len(misses):>6} {f'{holds}/{len(rows)}':>11}"
        for x in THRESHOLDS:
            cell = f"{sum(h > x for h, _ in misses)}/{len(misses)} {sum(h > x for h, _ in hits)}/{len(hits)}"
            line += f" {cell:>19}"
        cell = f"{sum(w for _, w in misses)}/{len(misses)} {sum(w for _, w in hits)}/{len(hits)}"
        line += f" {cell:>19}"
        print(line, flush=True)
    print(
        f"misses: true regret > {MISS}; bound holds: true regret <= regret_high; flag > x: probes whose "
        "regret_high exceeds x (unknown, one seed: counts), among the misses and among the hits; weak: "
        "probes whose recommendation says 'Weak evidence' (recommended.evidence not empty)"
    )
    print(f"grid throughput from one grid probe; best true time {best:.1f} s (simulated); inf counts as > x")


if __name__ == "__main__":
    main()
