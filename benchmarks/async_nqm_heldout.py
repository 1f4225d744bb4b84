"""Why the held-out async NQM instances miss the goal even with 8 seeds everywhere (issue 30).

benchmarks/async_nqm_sequential.py's held-out instances reach max regret 1.162 at the chosen margin
and at margin inf (8 seeds for every candidate). This script takes the 8-seed-everywhere probe apart
on each held-out instance and seed draw (seeds 0.. and 100..):

- best / pick / regret against the exact per-update truth (nqm_async, part 1's truth), and the
  regret read at step ends (E[L] after each batch's u updates: async_nqm_sequential._step_crossing);
- for the best and the pick: R_est / R_true in that draw, and the mean and standard deviation of
  R_est / R_true over 30 further 8-seed draws (seeds 3000..3239): a mean near 1 with a wide sd says
  the miss is seed noise, a mean off 1 says the estimator is biased;
- the share of those 30 draws whose 8-seed pick has regret > 1.05;
- the pick of the same estimator at 256 seeds (seeds 1000..1255; its large-sample limit), and the
  max regret with n seeds for every candidate, n = 8, 16, 32, 64 (the two draws).

Nothing here is chosen: no margin, width or seed count is tuned on these instances.
    python benchmarks/async_nqm_heldout.py  (writes benchmarks/out/async_nqm_heldout.txt)
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_nqm_sequential import (  # noqa: E402
    DRAWS,
    HELD_OUT,
    Cand,
    Instance,
    _cfg,
    _grid,
    _probe_r,
    _step_crossing,
    _truth,
)

OUT = Path(__file__).resolve().parent / "out" / "async_nqm_heldout.txt"
REPS = tuple(range(3000, 3000 + 8 * 30, 8))  # 30 further 8-seed draws
BIG = (1000, 256)  # the estimator's large-sample limit: seeds 1000..1255
SEED_COUNTS = (8, 16, 32, 64)


def _est(inst: Instance, first: int, n: int) -> dict[Cand, float]:
    """Estimated T per candidate from n seeds starting at ``first`` (R from simulate_samples_to_target)."""
    grid = _grid(inst)
    return {c: _probe_r(inst, c[0], d, c[2], first, n) / theta for c, (theta, d) in grid.items()}


def _pick(t: dict[Cand, float]) -> Cand:
    return min(t, key=lambda c: (t[c], c[1], c[2]))  # ties as async_nqm_sequential.sequential_pick


def _ratio(inst: Instance, c: Cand, first: int) -> float:
    """R_est / R_true of candidate c at 8 seeds from ``first``."""
    theta, d = _grid(inst)[c]
    return _probe_r(inst, c[0], d, c[2], first, 8) / (_truth(inst)[c] * theta)


def _spread(inst: Instance, c: Cand) -> tuple[float, float]:
    vals = [_ratio(inst, c, f) for f in REPS]
    return statistics.mean(vals), statistics.pstdev(vals)


def _step_truth(inst: Instance) -> dict[Cand, float]:
    cfg, target = _cfg(inst)
    out = {}
    for c, (theta, d) in _grid(inst).items():
        r = _step_crossing(cfg, c[0], d, c[2], target, _truth(inst)[c] * theta)
        out[c] = r / theta
    return out


def _row(inst: Instance, first: int, steps: dict[Cand, float], miss: float) -> str:
    truth = _truth(inst)
    best = min(truth, key=lambda c: truth[c])
    pick = _pick(_est(inst, first, 8))
    (mb, sb), (mp, sp) = _spread(inst, best), _spread(inst, pick)
    theta, _ = _grid(inst)[pick]
    upd = truth[pick] * theta * pick[2] / pick[0]
    g, t = inst.gen_per_resp_s, inst.train_per_resp_s
    ratio = f"{g / t:.0f}:1" if g >= t else f"1:{t / g:.0f}"
    inst_s = f"{inst.noise:5.1f} {inst.power:4.2f} {ratio:>8} {first:4d}"
    return (
        f"{inst_s}  {str(best):>12} {str(pick):>12} {truth[pick] / truth[best]:6.3f} "
        f"{steps[pick] / min(steps.values()):6.3f}   {_ratio(inst, best, first):5.3f} {mb:5.3f}+-{sb:5.3f}"
        f"   {_ratio(inst, pick, first):5.3f} {mp:5.3f}+-{sp:5.3f} {upd:6.1f}  {miss:5.2f}"
    )


def main() -> int:
    t0 = time.process_time()
    lines = [
        "held-out async NQM instances, 8 seeds for every candidate (async_nqm_sequential.py's margin inf):",
        "regret = T_true(pick) / T_true(best), truth per update; 'steps' = the same pick against the truth",
        "read at step ends; R/Rt = the estimate's R over the exact R (this draw; mean+-sd over 30 other",
        "8-seed draws); upd = updates to the target of the pick (truth); P>1.05 = share of the 30 draws",
        "whose 8-seed pick misses the goal",
        f"{'noise':>5} {'p':>4} {'gen:train':>8} {'draw':>4}  {'best':>12} {'pick':>12} {'regret':>6} "
        f"{'steps':>6}   {'best R/Rt: draw, mean+-sd':>25}   {'pick R/Rt: draw, mean+-sd':>25} {'upd':>6}  "
        f"{'P>1.05':>5}",
    ]
    big_regs, by_n = [], {n: [] for n in SEED_COUNTS}  # type: dict[int, list[float]]
    for inst in HELD_OUT:
        truth = _truth(inst)
        t_best = min(truth.values())
        steps = _step_truth(inst)
        miss = statistics.mean(truth[_pick(_est(inst, f, 8))] / t_best > 1.05 for f in REPS)
        for first in DRAWS:
            lines.append(_row(inst, first, steps, miss))
            for n in SEED_COUNTS:
                by_n[n].append(truth[_pick(_est(inst, first, n))] / t_best)
        big_regs.append(truth[_pick(_est(inst, *BIG))] / t_best)
    lines += [
        "",
        f"the same estimator at {BIG[1]} seeds: regret per held-out instance "
        + ", ".join(f"{r:.3f}" for r in big_regs)
        + f" (max {max(big_regs):.3f})",
        "n seeds for every candidate, the two draws: "
        + "; ".join(
            f"{n}: max {max(by_n[n]):.3f}, mean {statistics.mean(by_n[n]):.3f}"
            + ("" if all(math.isfinite(r) for r in by_n[n]) else " (inf)")
            for n in SEED_COUNTS
        ),
    ]
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    print(f"cpu {time.process_time() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
