"""Why the sequential async top-up misses regret 1.05 on further seed draws (issue 30).

benchmarks/async_nqm_seqtest.py scored the sequential rule shipped first (margin 0.3, z 1.5, cap 32)
at 6 further seed draws (seeds 400.. to 900..): max regret 1.061 reported, 1.102 held-out, 1.200
fresh. This script reruns those draws with the probe's own loop (analysis/decide/async_topup.top_up)
and takes every miss (regret > 1.05) apart; then does the same for the shipped defaults on
async_nqm_seqtest.py's scoring draws (seeds 2000.. to 2700..). Per miss:

- the instance and draw, the pick and the true best (B, k, u), the true T gap (T_true(pick) /
  T_true(best));
- the seeds each had when the rule stopped, their estimated T ratio, and the interval of
  T_best / T_pick the rule read (the pick is the best estimate: was the true best separated from it?);
- WHY it stopped: "outside" (the true best's estimate was not within the margin of the best estimate,
  so it was no leader), "cap" (both at the cap, not separated: the point estimate picked),
  "separated" (the true best's interval lay wholly above 1 - tol: a false separation at that z),
  "never" (the best had no finite T);
- bias: R_est / R_true of the pick and the best at 256 seeds (seeds 5000..5255), the estimator's
  large-sample limit, and lim = the pick's T over the best's in that limit (the gap the estimator
  can see at all): a bias off 1 is the estimator's (its smoothing reads a flat approach late; runs
  that never reach the target would read inf, none does here), a lim near or under 1.05 is a miss
  no seed rule with this estimator avoids reliably.

Nothing is chosen here.
    python benchmarks/async_nqm_misses.py  (writes benchmarks/out/async_nqm_misses.txt)
    python benchmarks/async_nqm_misses.py --shrink-from 8  (another reading of R, not shipped:
        benchmarks/async_nqm_smoothing.py; writes benchmarks/out/async_nqm_misses_shrink8.txt)
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_nqm_regret import Instance, lr_of  # noqa: E402
from async_nqm_seqtest import BEFORE, MORE, SCORE, SETS, Cand, _r, _seed_list, run_rule, use_reading  # noqa: E402
from async_nqm_sequential import _cfg, _grid, _truth  # noqa: E402

from batchtune.analysis.decide.async_topup import (  # noqa: E402
    FAMILY,
    MARGIN,
    MAX_SEEDS,
    STICKY,
    TOL,
    SeqRule,
    Z,
    family_z,
    ratio_interval,
)
from batchtune.backends.nqm_async import expected_async_samples_to_target  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "async_nqm_misses.txt"
BIG = 256  # seeds of the large-sample limit
HEAD = (
    f"{'set':>9} {'noise':>5} {'p':>4} {'g:t':>4} {'draw':>4} {'pick':>13} {'best':>13} {'gap':>6} "
    f"{'seeds':>6} {'est':>6} {'low':>6} {'why':>9} {'bias pick':>9} {'best':>6} {'lim':>6}"
)


def diagnose(margin: float, rule: SeqRule, draws: tuple[int, ...]) -> list[str]:
    """One line per miss of the rule over the three sets at ``draws``, then the causes counted."""
    lines, counts, n_draws = [HEAD], {}, 0
    for name, (insts, _) in SETS.items():
        for inst in insts:
            truth = _truth(inst)
            best = min(truth, key=lambda c: truth[c])
            for first in draws:
                n_draws += 1
                p, seeds, t, groups, _ = run_rule(inst, first, rule, margin)
                gap = truth[p] / truth[best]
                if gap <= 1.05:
                    continue
                why, low = _why(t, seeds, groups, p, best, margin, rule)
                counts[why] = counts.get(why, 0) + 1
                bias = [_bias(inst, c) for c in (p, best)]
                ratio = inst.gen_per_resp_s / inst.train_per_resp_s
                g_t = f"{ratio:.0f}:1" if ratio >= 1 else f"1:{1 / ratio:.0f}"
                lines.append(
                    f"{name:>9} {inst.noise:5.2f} {inst.power:4.2f} {g_t:>4} {first:4d} {str(p):>13} "
                    f"{str(best):>13} {gap:6.3f} {seeds[p]:>2}/{seeds[best]:<3} {t[best] / t[p]:6.3f} "
                    f"{low:6.3f} {why:>9} {bias[0]:9.3f} {bias[1]:6.3f} {gap * bias[0] / bias[1]:6.3f}"
                )
    lines.append(
        f"misses: {sum(counts.values())} of {n_draws} instance-draws; by cause: "
        + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none")
    )
    return lines


def _why(t, seeds, groups, p: Cand, best: Cand, margin: float, rule: SeqRule) -> tuple[str, float]:  # type: ignore[no-untyped-def]
    if not math.isfinite(t[best]):
        return "never", math.nan
    if t[best] > (1 + margin) * t[p]:
        return "outside", math.nan
    lead = [c for c in t if t[c] <= (1 + margin) * t[p]]
    z = family_z(rule.z, len({t[c] for c in lead}) - 1) if rule.family else rule.z
    _, low = ratio_interval(t[best], t[p], groups(best), groups(p), z)
    if low > 1 - rule.tol:
        return "separated", low
    return ("cap" if seeds[best] >= rule.cap and seeds[p] >= rule.cap else "other"), low


def _bias(inst: Instance, c: Cand) -> float:
    _, d = _grid(inst)[c]
    cfg, target = _cfg(inst)
    r_true = expected_async_samples_to_target(
        cfg, lr=lr_of(c[0]), batch=c[0], delay=d, updates_per_batch=c[2], target_loss=target
    )
    return _r(inst, c[0], d, c[2], _seed_list(5000, BIG)) / r_true


def main() -> int:
    t0 = time.process_time()
    old_m, old = BEFORE
    out, note = use_reading(sys.argv[1:], OUT)
    lines = [
        *note,
        "misses (regret > 1.05) of the async seed top-up; gap = T_true(pick) / T_true(best); seeds =",
        "pick/best at the stop; est = T_est(best) / T_est(pick) at the stop; low = its interval's lower end",
        "(separated when low > 1 - tol); why: outside = the true best not within the margin of the best",
        "estimate, cap = both at the cap, not separated, separated = a false separation; bias = R_est / "
        f"R_true at {BIG} seeds (pick, best); lim = gap x bias pick / bias best",
        "",
        f"the rule shipped first (margin {old_m}, z {old.z}, cap {old.cap}, no family), {len(MORE)} further "
        f"draws (seeds {MORE[0]}.. to {MORE[-1]}..):",
        *diagnose(old_m, old, MORE),
        "",
        f"the shipped defaults (margin {MARGIN}, z {Z}, cap {MAX_SEEDS}, family {'yes' if FAMILY else 'no'}, "
        f"tol {TOL}, sticky {'yes' if STICKY else 'no'}), async_nqm_seqtest.py's {len(SCORE)} scoring "
        f"draws (seeds {SCORE[0]}.. to {SCORE[-1]}..):",
        *diagnose(MARGIN, SeqRule(MAX_SEEDS, Z, TOL, FAMILY), SCORE),
    ]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    print(text, end="")
    print(f"cpu {time.process_time() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
