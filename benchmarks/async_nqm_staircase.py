"""Why the held-out async NQM instances sit at the estimator's floor: a staircase (issue 30).

async_nqm_misses.py traced 7 of the 8 held-out misses of the shipped top-up to one candidate, the true
best (128, 0, 4) of the noise 4, p 1.25 instances, read 6.5% late at 256 seeds
(async_nqm_smoothing.py). This script shows where that comes from, on the EXACT expected loss
(nqm_async.expected_async_losses, no seeds, no noise):

1. With u = 4 updates per batch, E[L] per update is a staircase: the first update of each batch
   (fresh noise) drops it, the next three reuse the batch and leave it flat. The per-update truth
   (nqm_async's R) crosses at a drop; when the level after that drop lies just below the target, a
   reading that lifts the curve by a fraction of a percent reads the crossing a whole batch late.
2. Per candidate near the best (within 10% of the true best T, as async_nqm_smoothing.py selects
   them), R read off the exact curve over R_true:
   - ma: the probe's centred moving average (half-width SMOOTH x the crossing's update, shipped);
   - phase: the same span, but averaging only the same update of neighbouring batches
     (n + u j, |j| <= half-width // u), which keeps the staircase; a diagnostic, not shipped;
   - step: the curve read at step ends (after each batch's u updates; nqm_async at="step", with the
     shipped smoothing over steps) over the truth read there (expected_async_step_samples_to_target).
3. The price of keeping the staircase: the phase reading's noise for that best candidate, from drawn
   runs (nqm_async.simulate_loss_curves, seeds 5000..5255): mean and sd over 32 groups of 8 seeds
   and 4 groups of 64, against the shipped reading's.

    python benchmarks/async_nqm_staircase.py  (writes benchmarks/out/async_nqm_staircase.txt)
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_nqm_regret import Instance, lr_of  # noqa: E402
from async_nqm_sequential import HELD_OUT, _cfg, _grid, _truth  # noqa: E402

from batchtune.backends.nqm_async import (  # noqa: E402
    expected_async_losses,
    expected_async_samples_to_target,
    expected_async_step_samples_to_target,
    probe_half_width,
    read_crossing,
    simulate_loss_curves,
)
from batchtune.backends.nqm_theory import initial_theta, nqm_loss  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "async_nqm_staircase.txt"
NEAR = 1.10
SHOWN = (4.0, 1.25, (128, 0, 4))  # noise, curvature power, (B, d, u): the best behind the misses
FIRST, BIG = 5000, 256


def phase_average(curve: np.ndarray, u: int, m: int) -> np.ndarray:
    """Centred average over the same update of neighbouring batches: n + u j for |j| <= m (the
    ends, where the window does not fit, are left as they are)."""
    if m <= 0 or not np.all(np.isfinite(curve)) or len(curve) <= 2 * u * m:
        return curve
    out = curve.copy()
    kernel = np.zeros(2 * u * m + 1)
    kernel[::u] = 1.0 / (2 * m + 1)
    out[u * m : len(curve) - u * m] = np.convolve(curve, kernel, mode="valid")
    return out


def deseasonalised_average(curve: np.ndarray, u: int, w: int, n0: int) -> np.ndarray:
    """The staircase kept, the rest averaged as the shipped reading does: the within-batch profile
    (the curve less its one-batch centred average, per update of the batch, over n0 +- 2w, centred)
    is taken out, the rest gets the centred moving average of half-width w, the profile goes back."""
    n = len(curve)
    if w <= 0 or not np.all(np.isfinite(curve)) or n <= 2 * w + u:
        return curve
    if u == 1:  # no batch profile: the shipped moving average
        out = curve.copy()
        out[w : n - w] = np.convolve(curve, np.ones(2 * w + 1) / (2 * w + 1), mode="valid")
        return out
    k = np.ones(u + 1 if u % 2 == 0 else u)
    if u % 2 == 0:
        k[0] = k[-1] = 0.5
    k /= u
    h = len(k) // 2
    trend = np.full(n, np.nan)
    trend[h : n - h] = np.convolve(curve, k, mode="valid")
    idx = np.arange(max(h, n0 - 2 * w), min(n - h, n0 + 2 * w + 1))
    prof = np.array([np.mean((curve - trend)[idx[idx % u == p]]) for p in range(u)])
    season = (prof - prof.mean())[np.arange(n) % u]
    rest = curve - season
    rest[w : n - w] = np.convolve(rest, np.ones(2 * w + 1) / (2 * w + 1), mode="valid")
    return rest + season


def readings(
    curve: np.ndarray, n_seeds: int, target: float, b: int, u: int, loss0: float
) -> dict[str, float]:
    """R read off one (mean) curve: the shipped moving average, and the phase average of the same span."""
    w = probe_half_width(curve, target, n_seeds)
    raw = np.flatnonzero(curve <= target)
    n0 = int(raw[0]) if raw.size else 0  # the raw crossing's update
    kw = dict(target_loss=target, batch=b, updates_per_batch=u, loss0=loss0)
    return {
        "ma": read_crossing(curve, half_width=w, **kw),  # type: ignore[arg-type]
        "phase": read_crossing(phase_average(curve, u, w // u), half_width=0, **kw),  # type: ignore[arg-type]
        "deseas": read_crossing(deseasonalised_average(curve, u, w, n0), half_width=0, **kw),  # type: ignore[arg-type]
    }


def exact_rows(inst: Instance) -> list[str]:
    """Part 2: per candidate near the best, R read off the exact curve over R_true."""
    cfg, target = _cfg(inst)
    loss0 = nqm_loss(cfg, initial_theta(cfg))
    truth = _truth(inst)
    best = min(truth.values())
    seen: dict[tuple[int, int, int], float] = {}
    for c in sorted(truth, key=lambda c: truth[c]):
        if truth[c] <= NEAR * best:
            seen.setdefault((c[0], _grid(inst)[c][1], c[2]), truth[c] / best)
    rows = []
    for (b, d, u), gap in seen.items():
        kw = dict(lr=lr_of(b), batch=b, delay=d, updates_per_batch=u)
        rt = expected_async_samples_to_target(cfg, target_loss=target, **kw)  # type: ignore[arg-type]
        curve = expected_async_losses(cfg, n_updates=4 * math.ceil(rt * u / b) + 2 * u, **kw)  # type: ignore[arg-type]
        r = readings(curve, 1, target, b, u, loss0)
        st = expected_async_step_samples_to_target(cfg, target_loss=target, **kw)  # type: ignore[arg-type]
        ends = curve[u - 1 :: u]
        w = probe_half_width(ends, target, 1)
        rs = read_crossing(ends, target_loss=target, batch=b, updates_per_batch=1, loss0=loss0, half_width=w)
        g_t = inst.gen_per_resp_s / inst.train_per_resp_s
        rows.append(
            f"{inst.noise:5.2f} {inst.power:4.2f} {f'{g_t:.0f}:1' if g_t >= 1 else f'1:{1 / g_t:.0f}':>4} "
            f"{str((b, d, u)):>13} {gap:6.3f} {rt * u / b:8.2f} {r['ma'] / rt:6.3f} {r['phase'] / rt:6.3f} "
            f"{r['deseas'] / rt:6.3f} "
            f"{st / rt:8.3f} {rs / st:6.3f}"
        )
    return rows


def noise_rows() -> list[str]:
    """Part 3: the shown candidate's readings from drawn runs, shipped against phase."""
    inst = next(i for i in HELD_OUT if (i.noise, i.power) == SHOWN[:2])
    cfg, target = _cfg(inst)
    b, d, u = SHOWN[2]
    loss0 = nqm_loss(cfg, initial_theta(cfg))
    kw = dict(lr=lr_of(b), batch=b, delay=d, updates_per_batch=u, target_loss=target)
    rt = expected_async_samples_to_target(cfg, **kw)  # type: ignore[arg-type]
    out = []
    for n in (8, 64):
        reads: dict[str, list[float]] = {"ma": [], "phase": [], "deseas": []}
        for g in range(FIRST, FIRST + BIG, n):
            c = simulate_loss_curves(cfg, seeds=list(range(g, g + n)), max_updates=4000, **kw).mean(axis=1)  # type: ignore[arg-type]
            for k, v in readings(c, n, target, b, u, loss0).items():
                reads[k].append(v / rt)
        out.append(
            f"{n:5d} {BIG // n:6d} "
            + " ".join(f"{statistics.fmean(reads[k]):9.3f} {statistics.stdev(reads[k]):7.3f}" for k in reads)
        )
    return out


def conditioning_rows() -> list[str]:
    """Part 4: how noisy the seed-mean curve is at the drop, against how far below the target the drop
    lands (the margin a reading has before the crossing leaves the batch)."""
    inst = next(i for i in HELD_OUT if (i.noise, i.power) == SHOWN[:2])
    cfg, target = _cfg(inst)
    b, d, u = SHOWN[2]
    kw = dict(lr=lr_of(b), batch=b, delay=d, updates_per_batch=u, target_loss=target)
    rt = expected_async_samples_to_target(cfg, **kw)  # type: ignore[arg-type]
    n = int(rt * u / b)  # the update of the drop that crosses
    exact = expected_async_losses(cfg, lr=kw["lr"], batch=b, delay=d, updates_per_batch=u, n_updates=n + 1)  # type: ignore[arg-type]
    margin = 1 - exact[n] / target
    c = simulate_loss_curves(cfg, seeds=list(range(FIRST, FIRST + BIG)), max_updates=4000, **kw)  # type: ignore[arg-type]
    sd = float(np.std(c[n])) / target
    need = math.ceil((sd / (margin / 2)) ** 2)
    return [
        f"update {n} (the crossing drop): exact level {margin:.2%} below the target; one seed's loss sd "
        f"{sd:.1%} of the target ({BIG} seeds)",
        f"sd of the seed-mean there: {sd / 8:.2%} at 64 seeds, {sd / 16:.2%} at 256; seeds for an sd of "
        f"half the margin: {need}",
    ]


def main() -> int:
    t0 = time.process_time()
    inst = next(i for i in HELD_OUT if (i.noise, i.power) == SHOWN[:2])
    cfg, target = _cfg(inst)
    b, d, u = SHOWN[2]
    kw = dict(lr=lr_of(b), batch=b, delay=d, updates_per_batch=u)
    curve = expected_async_losses(cfg, n_updates=32, **kw)  # type: ignore[arg-type]
    rt = expected_async_samples_to_target(cfg, target_loss=target, **kw)  # type: ignore[arg-type]
    st = expected_async_step_samples_to_target(cfg, target_loss=target, **kw)  # type: ignore[arg-type]
    lines = [
        f"1. the exact E[L] per update of {SHOWN[2]} (B, d, u), held-out noise {SHOWN[0]}, p {SHOWN[1]}; "
        f"target {target:.4f}; * = a batch's first update",
        "update " + " ".join(f"{n:>6}" for n in range(16, 32)),
        "E[L]   " + " ".join(f"{curve[n]:.4f}" for n in range(16, 32)),
        "       " + " ".join(f"{'*' if n % u == 0 else '':>6}" for n in range(16, 32)),
        f"R_true per update {rt:.1f} samples ({rt * u / b:.2f} updates' worth); at step ends {st:.1f} "
        f"({st / rt:.3f}x); the level after the drop lies {1 - curve[24] / target:.1%} below the target",
        "R_true per update if the target were lower (as if the curve were read higher) or higher: "
        + ", ".join(
            f"{f:+.0%}: {expected_async_samples_to_target(cfg, target_loss=target * (1 + f), **kw) / rt:.3f}x"  # type: ignore[arg-type]
            for f in (-0.03, -0.02, -0.01, 0.01)
        ),
        "",
        f"2. R read off the EXACT curve (no noise) over R_true, per (B, d, u) in {NEAR:.2f} of the best T;",
        "upd = the per-update R_true in updates' worth of samples (R u / B);",
        "ma: the shipped moving average; phase: same span, same update of neighbouring batches only;",
        "deseas: the within-batch profile taken out, the rest averaged as ma, the profile put back;",
        "step/upd: the step-end truth over the per-update one;",
        "step read: the curve read at step ends (shipped smoothing over steps) over the step-end truth",
        f"{'noise':>5} {'p':>4} {'g:t':>4} {'(B, d, u)':>13} {'T/Tb':>6} {'upd':>8} {'ma':>6} {'phase':>6} "
        f"{'deseas':>6} {'step/upd':>8} {'step read':>6}",
    ]
    for i in HELD_OUT:
        lines += exact_rows(i)
    lines += [
        "",
        f"3. drawn runs of {SHOWN[2]} (seeds {FIRST}..{FIRST + BIG - 1}): R / R_true, mean, sd over groups",
        f"{'seeds':>5} {'groups':>6} {'ma mean':>9} {'sd':>7} {'phase mean':>9} {'sd':>7} "
        f"{'deseas mean':>9} {'sd':>7}",
        *noise_rows(),
        "",
        "4. the conditioning: the seed-mean's noise at the drop against the drop's margin below the target",
        *conditioning_rows(),
    ]
    text = "\n".join(line.rstrip() for line in lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    print(f"cpu {time.process_time() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
