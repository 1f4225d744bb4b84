"""The headline figure: predicted time-to-target against batch, relative to the reference.

    T(B) / T(B0) = [R(B) / R(B0)] / [Θ(B) / Θ(B0)]      (docs/method.md §1)

One point per ranked candidate with its interval (``RankedCandidate.time_ratio_ci``), the winner
marked, the reference's line at 1; a candidate that never reached the target within its runs is a
lower bound (an upward triangle at the bound) or, with no finite bound, an arrow at the top edge.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from batchtune.report.plots import _figure, _save

TIME_PLOT = "time_to_target.png"


def plot_time_to_target(rec: Any, path: Path) -> Path:
    """``rec``: an analysis.decide.recommend.Recommendation; writes one PNG and returns its path."""
    fig, (ax,) = _figure(1, width=6.4, height=4.4)
    ranked = sorted(rec.ranking.candidates, key=lambda r: r.batch_responses)
    finite = [r for r in ranked if math.isfinite(r.time_ratio)]
    tops = [r.time_ratio_ci[1] for r in finite if math.isfinite(r.time_ratio_ci[1])]
    top = max([*tops, *(r.time_ratio for r in finite), 1.0]) * 1.3
    first = {"measured": True, "bound": True, "never": True}
    for r in ranked:
        x = r.batch_responses
        if math.isfinite(r.time_ratio):
            lo, hi = r.time_ratio_ci
            lo = lo if math.isfinite(lo) else r.time_ratio
            hi = hi if math.isfinite(hi) else top  # an open interval reaches the top edge
            yerr = [[max(r.time_ratio - lo, 0.0)], [max(hi - r.time_ratio, 0.0)]]
            label = "predicted T/T0 (interval)" if first["measured"] else None
            ax.errorbar([x], [r.time_ratio], yerr=yerr, fmt="o", color="tab:blue", capsize=3, label=label)
            first["measured"] = False
        elif math.isfinite(r.time_ratio_ci[0]) and r.time_ratio_ci[0] > 0:
            label = "never reached: at least" if first["bound"] else None
            ax.plot([x], [r.time_ratio_ci[0]], "^", color="tab:red", ms=9, label=label)
            first["bound"] = False
        else:
            label = "never reached (no bound)" if first["never"] else None
            ax.annotate("", (x, top), (x, top / 1.25), arrowprops={"arrowstyle": "->", "color": "tab:red"})
            ax.plot([x], [top / 1.25], "v", color="tab:red", ms=6, label=label)
            first["never"] = False
    expected = [(r.batch_responses, rec.ranking.expected_ratio(r)) for r in finite]
    ax.plot(*zip(*expected, strict=True), "x", color="black", ms=7, label="expected T/T0 (ranks; see table)")
    w = rec.ranking.by_name(rec.ranking.winner)
    if math.isfinite(w.time_ratio):
        ax.plot([w.batch_responses], [w.time_ratio], "*", color="gold", mec="black", ms=16, zorder=5)
        ax.annotate(
            f"winner {w.name}",
            (w.batch_responses, w.time_ratio),
            (8, -14),
            textcoords="offset points",
            fontsize=8,
        )
    ax.axhline(1.0, color="grey", ls="--", lw=1, label=f"reference {rec.ranking.reference}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(top=top)
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 16, 0.25: not 2^4, 2.5x10^-1
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel(f"batch N ({rec.efficiency.batch_noun} per step)")
    ax.set_ylabel("time-to-target / reference's (lower is sooner)")
    ax.set_title(f"Predicted time-to-target (Θ from {rec.throughput.source})", fontsize=9, wrap=True)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(fig, path)
