"""`batchtune report RESULTS`: one self-contained HTML page (plots embedded as base64, no external
files or network) and the same content as Markdown for a pull request.

Built from the objects the terminal renders (SampleEfficiency, Recommendation): the recommendation
and why, the sample-efficiency and time-to-target tables, the probe's cost, the caveats and plots.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchtune.analysis.decide.recommend import how_sure, weak_advice
from batchtune.analysis.sample.intervals import ci_header, crossing_words
from batchtune.report.terminal import fmt_ci, fmt_n, fmt_time, r_statistic

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1000px;margin:2em auto;
padding:0 1em;color:#1b1f24;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.sub{color:#57606a;margin-top:0} .win{background:#eaf7ee;border:1px solid #4ac26b;border-radius:6px;
padding:.8em 1em} table{border-collapse:collapse;font-size:.88em;margin:.6em 0}
th,td{border:1px solid #d0d7de;padding:.25em .6em;text-align:right} th{background:#f6f8fa}
td:first-child,th:first-child{text-align:left} tr.winner td{background:#eaf7ee;font-weight:600}
img{max-width:100%;border:1px solid #eee;margin:.4em 0} .note{color:#7d4e00}
"""


@dataclass(frozen=True)
class Section:
    title: str
    paragraphs: tuple[str, ...] = ()
    table: tuple[tuple[str, ...], ...] = ()  # header row first
    winner_row: int = -1  # index into table rows (after the header) to highlight
    images: tuple[Path, ...] = ()
    css_class: str = ""


def efficiency_rows(eff: Any) -> tuple[tuple[str, ...], ...]:
    ci_col = ci_header([c.estimate for c in eff.candidates])
    head = ("candidate", "N", "LR", "seeds", f"R ({r_statistic(eff)})", ci_col, "R/R0 paired", "status")
    rows: list[tuple[str, ...]] = [head]
    for c in eff.candidates:
        est = c.estimate
        ratio = c.verdict.ratio if c.verdict else None
        rows.append(
            (
                c.label,
                str(c.batch_responses),
                fmt_n(c.lr),
                str(c.n_runs),
                fmt_n(est.samples_to_target) if est else "-",
                fmt_ci(*eff.absolute_ci(est)) if est else "",
                fmt_n(ratio.ratio) if ratio else ("1" if c.label == eff.reference else "-"),
                c.status,
            )
        )
    return tuple(rows)


def ranking_rows(rec: Any) -> tuple[tuple[str, ...], ...]:
    thr = rec.throughput
    rows: list[tuple[str, ...]] = [
        (
            "rank",
            "candidate",
            "N",
            "R/R0 of R",
            f"Θ {rec.efficiency.rate_unit}" if thr.absolute else "Θ/Θ0",
            "T/T0",
            "T/T0 interval",
            "E[T]/T0 (ranks)",
        )
    ]
    for r in rec.ranking.candidates:
        rows.append(
            (
                str(r.rank),
                r.name,
                str(int(r.batch_responses)),
                fmt_n(r.sample_ratio),
                fmt_n(r.responses_per_s if thr.absolute else r.throughput_ratio),
                f"{r.time_ratio:.2f}" if math.isfinite(r.time_ratio) else "never",
                fmt_ci(*r.time_ratio_ci) or "-",
                "never" if r.censored else f"{rec.ranking.expected_ratio(r):.3f}",
            )
        )
    return tuple(rows)


def build_sections(eff: Any, rec: Any | None, plots: list[Path], missing: str = "") -> list[Section]:
    """The report's content: ``rec`` None (no throughput) gives the sample-efficiency part only."""
    sections: list[Section] = []
    by_name = {p.name: p for p in plots}
    if rec is not None:
        w = rec.winner
        lr = f", LR {w.lr:.3g} ({w.lr_rule})" if math.isfinite(w.lr) else ""
        head = f"{w.label}: {eff.shape_words(w.prompts, w.group_size)} = {w.batch_responses} per step{lr}"
        conc = rec.winner_throughput.generation_concurrency
        paras = [head] + ([f"Generation concurrency: {conc} responses in flight."] if conc else [])
        sure = how_sure(rec)
        paras += [rec.ranking.reason, *([sure] if sure else [])]
        if rec.evidence:
            advice = weak_advice(eff.unit, eff.imported, eff.from_measurements)
            paras.append(f"Weak evidence: {'; '.join(rec.evidence)}. {advice}")
        if rec.throughput_noise is not None:
            paras.append(rec.throughput_noise.text())
        paras += [rec.confirm, f"Θ (throughput) from {rec.throughput.source}."]
        sections.append(Section("Recommendation", tuple(paras), css_class="win"))
        winner_idx = next(i for i, r in enumerate(rec.ranking.candidates) if r.name == rec.ranking.winner)
        imgs = tuple(p for n, p in by_name.items() if n == "time_to_target.png")
        sections.append(Section("Predicted time-to-target", (), ranking_rows(rec), winner_idx, imgs))
        if rec.async_decision is not None:  # a recipe with off-policy or async knobs (report/joint.py)
            from batchtune.report.joint import joint_paragraphs, joint_rows

            d = rec.async_decision
            best = next((i for i, r in enumerate(d.rows) if r.label == w.label), -1)
            sections.append(Section("Sync or async", joint_paragraphs(d), joint_rows(d), best))
    else:
        sections.append(
            Section("Recommendation", (f"No time-to-target ranking: {missing}",), css_class="win")
        )
    crit = eff.critical
    paras = [crit.reason] if crit is not None else []
    if crit is not None and crit.batch is not None:
        words = crossing_words(crit.shape_free, crit.crossing_ci, eff.batch_noun)
        head = f"Critical training batch: {fmt_n(crit.batch)} {eff.batch_noun}"
        paras.insert(0, head + (f"; {words}." if words else "."))
    cmp = ">=" if eff.higher_is_better else "<="
    paras.append(f"Target: {eff.metric} {cmp} {eff.target:g}; tolerance R/R0 <= {1 + eff.tolerance:g}.")
    imgs = tuple(p for n, p in by_name.items() if n == "learning_curves.png")
    sections.append(Section("Sample efficiency", tuple(paras), efficiency_rows(eff), -1, imgs))
    cost = f"The probe spent {eff.total_samples:,} {eff.unit} in {fmt_time(eff.total_wall_s)} of run time"
    if rec is not None and math.isfinite(rec.winner.estimate.samples_to_target):
        r = rec.winner.estimate.samples_to_target
        cost += f"; one full run at {rec.winner.label} needs ~{r:,.0f} ({eff.total_samples / r:.1f}x less)"
    if not eff.imported:  # runs imported from logs: no probe spent anything
        sections.append(Section("Probe cost", (cost + ".",)))
    notes = list(rec.notes if rec is not None else eff.notes)
    notes = [n for n in notes if not n.startswith("time-to-target plot:")]
    if notes:
        sections.append(Section("Caveats", tuple(notes), css_class="note"))
    other = tuple(p for n, p in by_name.items() if n not in ("time_to_target.png", "learning_curves.png"))
    if other:
        sections.append(Section("Generation and training throughput", (), (), -1, other))
    return sections


def _img_tag(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def to_html(title: str, subtitle: str, sections: list[Section]) -> str:
    e = html.escape
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1><p class='sub'>{e(subtitle)}</p>",
    ]
    for s in sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        div = f"<div class='{s.css_class}'>" if s.css_class else "<div>"
        out.append(div + "".join(f"<p>{e(p)}</p>" for p in s.paragraphs) + "</div>")
        if s.table:
            head, *rows = s.table
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            for i, row in enumerate(rows):
                cls = " class='winner'" if i == s.winner_row else ""
                out.append(f"<tr{cls}>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>")
            out.append("</table>")
        out.extend(_img_tag(p) for p in s.images)
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    """Text from run and metric names (an imported log's, anyone's) as inert Markdown: no HTML tags,
    no line breaks that start a new block, no cell separators."""
    tagless = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)  # "<script>" inert, "R/R0 <= 1.1" as it reads
    return tagless.replace("\r", " ").replace("\n", " ").replace("|", "\\|")


def to_markdown(title: str, subtitle: str, sections: list[Section], image_root: Path) -> str:
    """Markdown for a pull request; images are linked relative to ``image_root`` (not embedded)."""
    out = [f"# {_md(title)}", "", f"_{_md(subtitle)}_", ""]
    for s in sections:
        out += [f"## {_md(s.title)}", ""]
        out += [_md(p) + "\n" for p in s.paragraphs]
        if s.table:
            head, *rows = s.table
            out.append("| " + " | ".join(_md(h) for h in head) + " |")
            out.append("|" + "|".join("---" for _ in head) + "|")
            for i, row in enumerate(rows):
                cells = [f"**{_md(v)}**" if i == s.winner_row and v else _md(v) for v in row]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
        for p in s.images:
            rel = Path(os.path.relpath(p.resolve(), Path(image_root).resolve()))  # from report.md's folder
            out += [f"![{p.stem}]({rel.as_posix()})", ""]
    return "\n".join(out).rstrip() + "\n"
