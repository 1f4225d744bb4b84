"""Rich tables and text for the terminal, built from the same result objects the JSON comes from."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from batchtune.analysis.decide.ranking import RankedCandidate
from batchtune.analysis.decide.recommend import TIE_MARGIN, Recommendation, how_sure, weak_advice
from batchtune.analysis.sample.efficiency import SampleEfficiency
from batchtune.analysis.sample.intervals import ci_header, crossing_words
from batchtune.analysis.sample.seeds import MEDIAN
from batchtune.report.json import cost_ratio_range

STATUS_STYLE = {
    "reference": "bold cyan",
    "invariant": "green",
    "deviates": "red",
    "inconclusive": "yellow",
    "failed": "magenta",
}


def fmt_n(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "-"
    if math.isinf(x):
        return "never" if x > 0 else "-inf"
    if abs(x) >= 1e3:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def fmt_ci(lo: float, hi: float) -> str:
    if lo == hi:
        return ""
    return f"[{fmt_n(lo)}, {fmt_n(hi)}]"


def fmt_ratio(x: float, lo: float | None = None, hi: float | None = None) -> str:
    """A ratio near 1 to three decimals, so 0.996 and 1.004 never both print as "1"."""
    if not math.isfinite(x):
        return fmt_n(x)
    text = f"{x:.3f}"
    if lo is not None and hi is not None and lo != hi:
        text += f" [{lo:.3f}, {hi:.3f}]"
    return text


def fmt_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "never"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def r_statistic(eff: SampleEfficiency) -> str:
    """How R was read over seeds: "median" (a grid probe), "geometric mean" (a branched probe)."""
    stats = {c.estimate.statistic for c in eff.candidates if c.estimate is not None}
    return stats.pop() if len(stats) == 1 else MEDIAN


def efficiency_table(eff: SampleEfficiency) -> Table:
    cmp = ">=" if eff.higher_is_better else "<="
    goal = f"{eff.metric} {cmp} {eff.target:g}" if math.isfinite(eff.target) else "the target"
    table = Table(title=f"Sample efficiency: {eff.batch_noun} until {goal}")
    r_col = f"R ({r_statistic(eff)})"
    ci_col = ci_header([c.estimate for c in eff.candidates])
    for col in ("candidate", eff.shape_header, "N", "LR", "seeds", r_col, ci_col, "R/R0 paired", "status"):
        table.add_column(col, justify="right" if col not in ("candidate", "status") else "left")
    for c in eff.candidates:
        est = c.estimate
        ratio = c.verdict.ratio if c.verdict else None
        status = c.status
        seeds = f"{c.n_runs}" + (f" ({est.n_censored} cens.)" if est and est.n_censored else "")
        if eff.extra_seeds.get(c.label):
            seeds += f" (+{eff.extra_seeds[c.label]} seq.)"
        if c.failures:
            seeds += f" ({len(c.failures)} failed)"
        table.add_row(
            c.label,
            f"{c.prompts} x {c.group_size}",
            str(c.batch_responses),
            fmt_n(c.lr),
            seeds,
            fmt_n(est.samples_to_target) if est else "-",
            fmt_ci(*eff.absolute_ci(est)) if est else "",
            fmt_ratio(ratio.ratio, ratio.ci_low, ratio.ci_high)
            if ratio
            else (fmt_ratio(1.0) if c.label == eff.reference else "-"),
            f"[{STATUS_STYLE.get(status, '')}]{status}[/]",
        )
    return table


def efficiency_summary(eff: SampleEfficiency) -> list[str]:
    lines = []
    crit = eff.critical
    if crit is not None:
        head = "Critical training batch: "
        if crit.batch is None:
            head += "not estimated (the reference never reached the target)"
        else:
            head += f"{fmt_n(crit.batch)} {eff.batch_noun}"
            ref = next((c for c in eff.candidates if c.label == eff.reference), None)
            if crit.upper is not None and ref is not None and crit.batch == ref.batch_responses:
                head += f" (the reference itself; {fmt_n(crit.upper)} already needs more {eff.unit})"
            elif crit.upper is not None:
                head += f" (the measured bracket: {fmt_n(crit.lower)} to {fmt_n(crit.upper)})"
            else:
                head += " or more (no probed batch deviated)"
        words = crossing_words(crit.shape_free, crit.crossing_ci, eff.batch_noun)
        if words:
            head += f"; {words}"
        elif (quoted := crit.quoted_crossing) is not None:
            cross, (lo, hi), kind = quoted
            head += f"; R(B)/R(B0) reaches 1+tol at {fmt_n(cross)} ({kind} {fmt_ci(lo, hi)})"
        lines.append(head)
        reason = crit.reason
        if crit.batch is not None:
            act = ACT_ON.format(batch=fmt_n(crit.batch), noun=eff.batch_noun)
            lines.append(f"  {act}" + (ACT_NOT_BCRIT if crit.joint is not None else ""))
        if crit.joint is not None:  # said once: the reason refers back to it
            lines.append(f"  {crit.fit_line()}")
            lines.append(f"  [dim]{JOINT_LEGEND}[/]")
            reason = reason.replace(crit.fit_line(), "the joint fit above")
        lines.append(f"  {reason}")
    if eff.grad_slope is not None:
        g = eff.grad_slope
        lines.append(f"Gradient norm vs batch at matched samples (-0.5 = noise-dominated): {g.reason}")
    if eff.critic_grad_slope is not None:
        lines.append(f"Critic gradient norm vs batch (PPO, on its own): {eff.critic_grad_slope.reason}")
    if eff.noise_scale is not None and not math.isfinite(eff.noise_scale.b_simple):
        lines.append("Gradient noise scale B_simple: not estimated (no finite value from these runs)")
    elif eff.noise_scale is not None:
        lines.append(
            f"Gradient noise scale B_simple ~ {fmt_n(eff.noise_scale.b_simple)} {eff.batch_noun} "
            "(a prior: it underestimates the critical batch of Adam-trained LMs)"
        )
    for c in eff.candidates:
        for f in c.failures:
            lines.append(f"[magenta]{c.label}[/] {escape(f)}")
    lines.extend(f"[yellow]note:[/] {n}" for n in eff.notes)
    return lines


# one line each for the terms the table and the joint fit lean on, printed where they appear
TABLE_LEGEND = (
    "R: samples to reach the target; R/R0 paired: R over the reference's R, seed by seed (the same seeds "
    "at both batches), with its interval; status 'deviates': the whole interval of R/R0 lies above 1+tol"
)
JOINT_LEGEND = (
    "(1+tol crossing: the batch where R(B)/R(B0) = 1 + target.tolerance; B_crit: the fitted curve's "
    "scale, where a run needs about twice the samples of a small batch; dAIC(mcc-pow) = AIC(McCandlish) "
    "- AIC(power): above 6 the power law is chosen; its intervals hold if its shape does, the shape-free one "
    "above whatever the shape)"
)
ACT_ON = (
    "The number to act on: {batch} {noun}, the largest measured batch within 1+tol of the reference's "
    "samples (a ceiling for the batch to train at; a recommendation picks by time)"
)
ACT_NOT_BCRIT = "; the 1+tol crossing and the fit's B_crit describe the curve, they are not batches to run"


def render_efficiency(console: Console, eff: SampleEfficiency) -> None:
    console.print(efficiency_table(eff))
    console.print(f"[dim]{TABLE_LEGEND}[/]")
    for line in efficiency_summary(eff):
        console.print(line)


# the rule the rank column follows, printed under the table it orders
RANK_RULE = (
    f"rank: by E[T]/T0, the expected time given the skew of the seeds' interval (T/T0 is the median); "
    f"within {TIE_MARGIN:.0%} of the lowest E[T]/T0 the smaller batch ranks first"
)


def _expected(rec: Recommendation, r: RankedCandidate) -> str:
    if r.censored:
        return "never"
    return f"{rec.ranking.expected_ratio(r):.3f}"


def recommendation_table(rec: Recommendation) -> Table:
    thr = rec.throughput
    unit = rec.efficiency.rate_unit if thr.absolute else "x ref"
    table = Table(title=f"Predicted time-to-target (throughput from {thr.source})")
    table.caption = RANK_RULE
    cols = ["rank", "candidate", "N", "R", "R/R0 of R", f"Θ {unit}", "Θ/Θ0", "T/T0", "T/T0 CI", "E[T]/T0"]
    if thr.absolute:
        cols.insert(7, "T")
    cols.append("s/step gen+train+other")
    for col in cols:
        table.add_column(col, justify="left" if col == "candidate" else "right")
    for r in rec.ranking.candidates:
        t = thr.per_candidate[r.name]
        comps = "-"
        if t.gen_s is not None and t.train_s is not None:
            comps = f"{t.gen_s:.3g} + {t.train_s:.3g} + {t.other_s or 0:.3g}"
        style = "bold green" if r.name == rec.ranking.winner else ("cyan" if r.is_reference else "")
        row = [
            str(r.rank),
            f"[{style}]{r.name}[/]" if style else r.name,
            str(int(r.batch_responses)),
            fmt_n(r.samples_to_target),
            fmt_n(r.sample_ratio),
            fmt_n(r.responses_per_s),
            fmt_n(r.throughput_ratio),
            f"{r.time_ratio:.2f}" if math.isfinite(r.time_ratio) else "never",
            fmt_ci(*r.time_ratio_ci) or "-",
            _expected(rec, r),
        ]
        if thr.absolute:
            row.insert(7, fmt_time(r.time_to_target_s))
        row.append(comps)
        table.add_row(*row)
    return table


def render_recommendation(
    console: Console, rec: Recommendation, emitted: str | None = None, *, efficiency: bool = True
) -> None:
    """``efficiency``: start with the sample-efficiency table (tune printed it after its probe)."""
    if efficiency:
        render_efficiency(console, rec.efficiency)
        console.print()
    console.print(recommendation_table(rec))
    knee = rec.throughput.knee
    if knee is not None:
        console.print(
            f"Critical generation batch ({rec.throughput.mode} lengths): {fmt_n(knee.concurrency)} "
            f"responses in flight. {knee.reason}"
        )
    w = rec.winner
    wt = rec.winner_throughput
    body = [
        f"[bold]{w.label}[/]: {rec.efficiency.shape_words(w.prompts, w.group_size)} = {w.batch_responses} "
        "per step" + (f", lr {w.lr:.3g} ({w.lr_rule})" if math.isfinite(w.lr) else ""),
    ]
    if wt.generation_concurrency:
        body.append(f"generation concurrency: {wt.generation_concurrency} responses in flight")
    body.append(rec.ranking.reason)
    sure = how_sure(rec)
    if sure:
        body.append(sure)
    if rec.throughput_noise is not None:
        body.append(rec.throughput_noise.text())
    if rec.evidence:
        eff = rec.efficiency
        advice = escape(weak_advice(eff.unit, eff.imported, eff.from_measurements))  # [[candidate.curve]]
        body.append(f"[bold yellow]Weak evidence:[/] {'; '.join(rec.evidence)}. {advice}")
    body.append(rec.confirm)
    console.print(
        Panel("\n".join(body), title="Recommendation", border_style="yellow" if rec.evidence else "green")
    )
    for n in rec.notes:
        if n not in rec.efficiency.notes:
            console.print(f"[yellow]note:[/] {n}")
    if emitted and console.is_terminal:
        console.print(Panel(emitted, title="Trainer config", border_style="cyan"))
    elif emitted:  # piped or redirected: plain text that pastes as it is (no box, no wrapping)
        console.print("Trainer config:")
        console.print(emitted.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)


def render_probe_cost(
    console: Console, eff: SampleEfficiency, rec: Recommendation | None, *, simulated: bool = False
) -> None:
    """``simulated``: the step times are computed, not measured (the NQM): the times say so."""
    u = eff.unit
    sim = "simulated " if simulated else ""
    text = f"Probe cost: {eff.total_samples:,} {u}, {fmt_time(eff.total_wall_s)} of run time"
    crit = eff.critical.batch if eff.critical is not None else None
    at_crit = [c for c in eff.candidates if c.family == "main" and c.batch_responses == crit and c.estimate]
    crit_est = at_crit[0].estimate if at_crit else None
    if rec is None and crit_est is not None and math.isfinite(crit_est.samples_to_target):
        c = at_crit[0]
        r = crit_est.samples_to_target
        text += f"; one full run at the critical batch ({c.label}): ~{r:,.0f} {u}"
        step_s = c.gen_s_per_step + c.train_s_per_step
        if step_s > 0:
            text += f", ~{fmt_time(r / c.batch_responses * step_s)} at the probe's {sim}step time"
    win_est = rec.winner.estimate if rec is not None else None
    if rec is not None and win_est is not None and math.isfinite(win_est.samples_to_target):
        r = win_est.samples_to_target
        text += f"; one full run at {rec.winner.label}: ~{r:,.0f} {u}"
        if rec.throughput.absolute:
            text += f", ~{fmt_time(r / rec.winner_throughput.responses_per_s)}"
            text += " (simulated)" if sim else ""
        text += f": the probe cost {eff.total_samples / r:.2f}x one full run"
        span = cost_ratio_range(eff.total_samples, eff, win_est)
        if span is not None:
            text += f" ({span[0]:.2f}-{span[1]:.2f}x over the full run's interval)"
        steps = eff.total_samples / rec.winner.batch_responses
        text += f", as many {u} as {steps:,.0f} steps at {rec.winner.label}"
    console.print(text)


def kv_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("key")
    table.add_column("value")
    for k, v in rows:
        table.add_row(k, str(v))
    return table
