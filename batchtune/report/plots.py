"""PNG figures with matplotlib's Agg canvas (no display, no pyplot global state).

matplotlib is imported inside each function, so importing this module costs nothing. Every function
writes one file and returns its path.

- ``plot_throughput(result, path)``: responses/s against concurrency per mode, with the fitted
  saturating curve, the knee (critical generation batch) and the OOM ceiling; output tokens/s
  against the roofline bound when there is one; training step time against batch with its fit.
- ``plot_roofline(prediction, path)``: a roofline-only prediction, clearly titled as one.
- ``plot_learning_curves(curves, target, metric, path)``: metric against samples consumed, one
  colour per candidate, one line per seed, a horizontal target line (docs/method.md §3.2).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchtune.records.files import atomic_write_bytes

if TYPE_CHECKING:
    from batchtune.analysis.system.hardware import RooflinePrediction
    from batchtune.analysis.system.profile import ProfileResult

_MODE_COLOURS = {"fixed": "tab:blue", "eos": "tab:orange"}


# Margins in inches around each panel: tick labels and an axis label on the left and below, a
# title of up to two lines above. Fixed, because a layout engine (constrained layout) measures
# every text first, in a draw of its own: about 40% of a plot's CPU, and a probe draws one per run.
_MARGIN_IN = {"left": 0.85, "right": 0.15, "bottom": 0.6, "top": 0.5, "between": 0.95}


def _figure(ncols: int, width: float = 5.2, height: float = 4.0) -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height))
    FigureCanvasAgg(fig)
    m, total = _MARGIN_IN, width * ncols
    panel = (total - m["left"] - m["right"] - (ncols - 1) * m["between"]) / ncols
    fig.subplots_adjust(
        left=m["left"] / total,
        right=1 - m["right"] / total,
        bottom=m["bottom"] / height,
        top=1 - m["top"] / height,
        wspace=m["between"] / panel,
    )
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _save(fig: Any, path: Path) -> Path:
    """``fig`` as a PNG at ``path``, drawn in memory and then written atomically: a write cut off
    part-way (a crash, a full disk) leaves the old plot or none, never a truncated one that a later
    run or the report takes for the plot. A failed write's OSError names ``path``."""
    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    atomic_write_bytes(path, buf.getvalue())
    return path


def plot_throughput(result: ProfileResult, path: Path) -> Path:
    """Generation throughput (and training step time) of one profile; see the module docstring."""
    has_train = any(p.status == "ok" for p in result.train_points)
    has_roof = any(m.roofline for m in result.modes.values())
    ncols = 1 + int(has_roof) + int(has_train)
    fig, axes = _figure(ncols)
    _generation_panel(axes[0], result)
    if has_roof:
        _roofline_panel(axes[1], result)
    if has_train:
        _training_panel(axes[1 + int(has_roof)], result)
    return _save(fig, path)


def _generation_panel(ax: Any, result: ProfileResult) -> None:
    """Responses per second against concurrency, per mode: medians, the fit, the knee, the ceiling."""
    import numpy as np

    for i, (mode, m) in enumerate(result.modes.items()):
        colour = _MODE_COLOURS.get(mode, f"C{i + 2}")
        ok = m.ok_points
        if not ok:
            continue
        c = np.array([p.concurrency for p in ok], dtype=float)
        y = np.array([p.responses_per_s for p in ok])
        err = np.array([p.step_latency_spread_s / p.step_latency_s * p.responses_per_s for p in ok])
        yerr = [np.minimum(err, y), err]  # a throughput is never negative: clip the lower bar at 0
        ax.errorbar(c, y, yerr=yerr, fmt="o", color=colour, label=f"{mode}: measured (median)", capsize=2)
        if m.fit is not None:
            grid = np.geomspace(c.min(), c.max(), 200)
            ax.plot(grid, m.fit.predict(grid), "-", color=colour, alpha=0.6, label=f"{mode}: fit c/(t0+t1 c)")
        if m.knee is not None:
            kind = "knee" if m.knee.saturated else "largest measured (no knee)"
            ax.axvline(
                m.knee.concurrency,
                color=colour,
                ls="--",
                lw=1,
                label=f"{mode}: {kind} {m.knee.concurrency:g}",
            )
        if m.ceiling is not None:
            ax.axvline(m.ceiling, color=colour, ls=":", lw=1.5, label=f"{mode}: out of memory at {m.ceiling}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (responses in flight)")
    ax.set_ylabel("responses / s")
    ax.set_title(f"generation: {result.model} on {result.device}", fontsize=9, wrap=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _roofline_panel(ax: Any, result: ProfileResult) -> None:
    """Output tokens per second against the roofline's bound, per mode."""
    for i, (mode, m) in enumerate(result.modes.items()):
        if not m.roofline:
            continue
        colour = _MODE_COLOURS.get(mode, f"C{i + 2}")
        conc = [r.concurrency for r in m.roofline]
        ax.plot(
            conc,
            [r.measured_tokens_per_s for r in m.roofline],
            "o-",
            color=colour,
            label=f"{mode}: measured",
        )
        ax.plot(
            conc,
            [r.bound_tokens_per_s for r in m.roofline],
            "--",
            color=colour,
            alpha=0.6,
            label=f"{mode}: roofline bound",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"against the roofline ({result.hardware.name if result.hardware else '?'})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _training_panel(ax: Any, result: ProfileResult) -> None:
    """The optimiser step time against the training batch, with its linear fit."""
    import numpy as np

    ok_train = [p for p in result.train_points if p.status == "ok"]
    n = np.array([p.concurrency for p in ok_train], dtype=float)
    t = np.array([p.step_latency_s for p in ok_train])
    ax.errorbar(
        n,
        t,
        yerr=[
            np.minimum([p.step_latency_spread_s for p in ok_train], t),
            [p.step_latency_spread_s for p in ok_train],
        ],
        fmt="o",
        color="tab:green",
        label="measured (median)",
    )
    if result.train_fit is not None:
        grid = np.linspace(0, n.max(), 100)
        fit = result.train_fit
        ax.plot(
            grid,
            fit.predict(grid),
            "-",
            color="tab:green",
            alpha=0.6,
            label=f"fit {fit.t0_s:.3g} + {fit.t1_s_per_sample:.3g} N s",
        )
    ax.set_xlabel("training batch (responses)")
    ax.set_ylabel("optimiser step time (s)")
    ax.set_title("training step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_roofline(prediction: RooflinePrediction, path: Path) -> Path:
    """Roofline-bound tokens/s against concurrency for hardware not measured: a PREDICTION."""
    c = prediction.curve
    fig, (ax,) = _figure(1)
    ax.plot(c.concurrency, c.tokens_per_s_bound, "o-", color="tab:purple", label="roofline bound (tokens/s)")
    if c.compute_bound_concurrency < float("inf"):
        ax.axvline(
            c.compute_bound_concurrency,
            ls="--",
            color="grey",
            label=f"compute-bound above {c.compute_bound_concurrency:.0f}",
        )
    cap = prediction.max_concurrency_by_memory
    if cap < 4 * float(c.concurrency.max()):
        ax.axvline(cap, ls=":", color="red", label=f"KV cache full at {cap:.0f}")
    else:
        ax.plot([], [], " ", label=f"KV cache full at {cap:.3g} (off the axis)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrency")
    ax.set_ylabel("decode tokens / s (upper bound)")
    ax.set_title(
        f"PREDICTION, not measured:\n{prediction.model_info.name} on {prediction.hardware.name}", fontsize=9
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_learning_curves(
    curves: dict[str, list[tuple[list[float], list[float]]]],
    target: float | None,
    metric: str,
    path: Path,
) -> Path:
    """``curves[candidate] = [(samples, values) per seed]``: one colour per candidate, one line per
    seed, against samples consumed (not steps), so curves that overlay are batch-invariant."""
    fig, (ax,) = _figure(1, width=6.4, height=4.4)
    for i, (label, seeds) in enumerate(curves.items()):
        colour = f"C{i % 10}"
        for j, (samples, values) in enumerate(seeds):
            ax.plot(samples, values, "-", color=colour, alpha=0.85, lw=1.3, label=label if j == 0 else None)
    if target is not None:
        ax.axhline(target, color="black", ls="--", lw=1, label=f"target {target:g}")
    ax.set_xlabel("samples consumed")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} against samples consumed")
    ax.grid(alpha=0.3)
    if curves or target is not None:
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_profile(result: ProfileResult, plots_dir: Path) -> list[Path]:
    """The figures of one profile into ``plots_dir`` (the store's ``plots_dir``)."""
    return [plot_throughput(result, Path(plots_dir) / f"throughput-{result.profile_id}.png")]
