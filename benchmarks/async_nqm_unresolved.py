"""Does the seed top-up say when it could not decide? Where its rounds end, scored (issue 30).

The shipped top-up (analysis/decide/async_topup.py) doubles the seeds of the best estimate and of
every leader its paired seeds do not separate from it, up to a cap of 64. Its misses left are near
ties still not separated at the cap (benchmarks/async_nqm_miss_rounds.py), and gaps the estimator
cannot see at any seed count (async_nqm_misses.py). Where the rounds end is now reported
(``TopUpEnd``: a "NOT RESOLVED" note in `recommend`, ``async_decision.top_up_end`` in its JSON): the
leaders not separated from the best estimate at the cap, and a bound on what picking the best
estimate may cost against them, 1 / (the least lower end of their T-ratio intervals).

This script scores that report where the truth is known: the simulated probe of
async_nqm_seqtest.py (the probe's own loop, top_up, fed the NQM estimates; the truth per update,
nqm_async's) at the shipped rule, on that script's 8 scoring draws (seeds 2000.. to 2700..) of every
set (reported, held-out, fresh: 8 instances each, 192 instance-draws). Nothing is tuned here.

- flagged: the draws whose rounds ended with a leader not separated from the best estimate;
- misses (regret > 1.05): how many were flagged; the others by cause (the true best never in the
  comparison, or separated from the pick by its interval: a false separation);
- the bound, on flagged draws: the share where regret <= bound (its coverage), and the bound's
  median; on draws not flagged, the share where regret <= 1 / (1 - tol), what "resolved" promises
  against the compared leaders;
- whether a flag names the true best (the pick, or one of the open leaders).

    python benchmarks/async_nqm_unresolved.py  (writes benchmarks/out/async_nqm_unresolved.txt)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_nqm_seqtest import SCORE, SETS, run_rule, truth_of  # noqa: E402

from batchtune.analysis.decide.async_topup import MARGIN, TOL, TOP_SEEDS, SeqRule, TopUpEnd  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "async_nqm_unresolved.txt"
GOAL = 1.05


def draw(name: str, i: int, first: int) -> dict[str, object]:
    """One instance-draw at the shipped rule: its regret and where the rounds ended."""
    inst = SETS[name][0][i]
    ends: list[TopUpEnd] = []
    pick, seeds, _, _, _ = run_rule(inst, first, SeqRule(), MARGIN, on_end=ends.append)
    truth = truth_of(inst)
    best = min(truth, key=lambda c: truth[c])
    end = ends[-1] if ends else None
    open_ = [o.label for o in end.open] if end is not None else []
    return {
        "name": name, "i": i, "first": first, "pick": str(pick), "best": str(best),
        "regret": truth[pick] / truth[best], "ended": end is not None, "open": open_,
        "bound": end.bound() if end is not None else float("nan"),
        "names_best": str(best) == str(pick) or str(best) in open_,
        # a miss not flagged: the true best topped up (compared, then separated by its interval) or not
        "why": "flagged" if open_ else ("separated" if seeds[best] >= TOP_SEEDS else "outside"),
    }  # fmt: skip


Flag = tuple[float, list[str], float, bool]  # (regret, open leaders, bound, names the true best)


def flag_head() -> str:
    """The header of the per-set table of where the rounds ended (this script's and the real probe's)."""
    return (
        f"{'set':>9} {'draws':>5} {'misses':>6} {'flagged':>7} {'misses flagged':>14} "
        f"{'flags on a miss':>15} {'bound holds':>11} {'median bound':>12} {'names best':>10} "
        f"{'unflagged <= 1.053':>18}"
    )


def flag_row(name: str, draws: list[Flag]) -> str:
    """One set's row: draws, misses, flagged, misses flagged, flags on a miss, bound holds (on flagged
    draws), the median bound, flags naming the true best, unflagged draws within 1 / (1 - tol)."""
    flagged = [d for d in draws if d[1]]
    misses = [d for d in draws if d[0] > GOAL]
    quiet = [d for d in draws if not d[1]]
    med = statistics.median(d[2] for d in flagged) if flagged else float("nan")
    return (
        f"{name:>9} {len(draws):5d} {len(misses):6d} {len(flagged):7d} "
        f"{sum(bool(d[1]) for d in misses):>9d} of {len(misses):<2d} "
        f"{sum(d[0] > GOAL for d in flagged):>10d} of {len(flagged):<2d} "
        f"{sum(d[0] <= d[2] for d in flagged):>6d} of {len(flagged):<2d} {med:12.3f} "
        f"{sum(d[3] for d in flagged):>5d} of {len(flagged):<2d} "
        f"{sum(d[0] <= 1 / (1 - TOL) for d in quiet):>12d} of {len(quiet):<3d}"
    )


def _flag(r: dict[str, object]) -> Flag:
    return float(r["regret"]), list(r["open"]), float(r["bound"]), bool(r["names_best"])  # type: ignore[arg-type,call-overload]


def main() -> int:
    t0 = time.process_time()
    rows = [draw(name, i, first) for name in SETS for i in range(len(SETS[name][0])) for first in SCORE]
    lines = [
        "where the shipped seed top-up's sequential rounds end, scored: the simulated probe of "
        f"async_nqm_seqtest.py at the shipped rule, {len(SCORE)} draws",
        f"(seeds {SCORE[0]}.. to {SCORE[-1]}..) x 8 instances per set; truth per update; miss = regret > "
        f"{GOAL}; flagged = a leader not separated from the best estimate at the cap;",
        "bound = 1 / (the least lower end of the open leaders' T-ratio intervals), what the report says "
        f"picking the best estimate may cost; unflagged draws promise 1 / (1 - {TOL}) = {1 / (1 - TOL):.3f} "
        "against the compared leaders",
        "",
        flag_head(),
    ]
    for name in SETS:
        rs = [r for r in rows if r["name"] == name]
        lines.append(flag_row(name, [_flag(r) for r in rs]))
    lines += [
        "",
        "the misses, each: set, instance, draw, pick, true best, regret, why (flagged; not flagged: the "
        "true best separated by its interval, or outside the comparison), bound, open leaders",
    ]
    for r in rows:
        if float(r["regret"]) > GOAL:  # type: ignore[arg-type]
            opened = ", ".join(str(x) for x in r["open"]) or "-"  # type: ignore[attr-defined]
            lines.append(
                f"  {r['name']:>9}/{r['i']} draw {r['first']}: pick {r['pick']} best {r['best']} "
                f"regret {float(r['regret']):.3f}  {r['why']}  "  # type: ignore[arg-type]
                f"bound {float(r['bound']):.3f}  open: {opened}"  # type: ignore[arg-type]
            )
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    print(f"cpu {time.process_time() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
