"""Why the real probe misses on the noisiest async NQM instances (issue 30).

benchmarks/async_nqm_realprobe.py found the shipped top-up's misses through the real probe on the
held-out instances of noise 4, curvature power 2 (regret up to 2.435 against E[L] at step ends).
This script reruns draw 0 of both (gen:train 3:1 and 1:2) and prints, for the probe's leading
candidates: the probe's own R (its ranking's T x the row's responses/s), R_true of E[L] read at step
ends, R of a typical run (async_nqm_realprobe.typical_truth: the median of 256 runs' own crossings,
read as the probe reads a run but over the whole simulated run), R as the probe defines it
(async_nqm_probetruth.py: runs trained and stopped as the probe's, median over 256 seeds, 1280 for
the contenders; read from its committed JSON), and, per candidate, how many runs the probe kept,
how many of them diverged, and the median samples at which they stopped (a run stops once it is
25% past its crossing, measure/stop_rule.py).

    python benchmarks/async_nqm_realprobe_why.py  (writes benchmarks/out/async_nqm_realprobe_why.txt)
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import async_nqm_sequential as S  # noqa: E402
from async_nqm_probetruth import committed  # noqa: E402
from async_nqm_realprobe import typical_truth  # noqa: E402

from batchtune.recipe.load import load_recipe  # noqa: E402
from batchtune.workflow.recommend import recommend_for_recipe  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "async_nqm_realprobe_why.txt"
SHOWN = 8  # leading rows of the probe's ranking


def _stops(root: Path, label: str) -> tuple[int, int, float]:
    """(runs kept, of them diverged, median samples at which they stopped) of one candidate in the
    probe's store."""
    runs = [json.loads(f.read_text()) for f in (root / "runs").glob(f"{label}-s*/run.json")]
    div = sum(r["status"] == "diverged" for r in runs)
    return len(runs), div, statistics.median(r["samples"] for r in runs)


def instance_lines(i: int) -> list[str]:
    held = [j for j, inst in enumerate(S.HELD_OUT) if (inst.noise, inst.power) == (4.0, 2.0)]
    inst = S.HELD_OUT[held[i]]
    _, steps = S._real_truth(inst)
    typical = typical_truth(("held-out", held[i]))
    est = (committed() or {})[f"held-out/{held[i]}"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        S._real_probe(inst, root, S.BASE, 0)
        pick, theta, _, _ = S._real_probe(inst, root, S.TOP, 0)
        cfg = load_recipe("recipes/nqm.toml", S._probe_sets(inst, root, S.TOP, 0))
        rec, _, _ = recommend_for_recipe(cfg, "probe", None, 1, plot=False)
        assert rec.async_decision is not None
        rows = sorted(rec.async_decision.rows, key=lambda r: r.choice.t)[:SHOWN]
        stops = {r.label: _stops(root, r.label) for r in rows}
    t_step = {lab: steps[lab] / th for lab, th in theta.items() if th > 0}
    t_typ = {lab: typical[lab] / th for lab, th in theta.items() if th > 0}
    t_est = {lab: est[lab] / th for lab, th in theta.items() if th > 0}
    best_s, best_t, best_e = min(t_step.values()), min(t_typ.values()), min(t_est.values())
    g_t = inst.gen_per_resp_s / inst.train_per_resp_s
    ratio = f"{g_t:.0f}:1" if g_t >= 1 else f"1:{1 / g_t:.0f}"
    lines = [
        f"held-out noise {inst.noise}, p {inst.power}, gen:train {ratio}, draw 0; the top-up's pick {pick}; "
        f"best under E[L] {min(t_step, key=t_step.__getitem__)}, under a typical run "
        f"{min(t_typ, key=t_typ.__getitem__)}, under the probe's estimand "
        f"{min(t_est, key=t_est.__getitem__)}",
        f"{'candidate':>14} {'resp/s':>7} {'R probe':>8} {'R E[L]':>8} {'R typical':>9} {'R estimand':>10} "
        f"{'T/best E[L]':>11} {'T/best typ':>10} {'T/best est':>10} {'runs':>5} {'diverged':>8} "
        f"{'stopped at':>10}",
    ]
    for r in rows:
        lab, th = r.label, theta[r.label]
        n, div, stop = stops[lab]
        lines.append(
            f"{lab:>14} {th:7.2f} {r.choice.t * th:8.0f} {steps[lab]:8.0f} {typical[lab]:9.0f} "
            f"{est[lab]:10.0f} "
            f"{t_step[lab] / best_s:11.3f} {t_typ[lab] / best_t:10.3f} {t_est[lab] / best_e:10.3f} {n:5d} "
            f"{div:8d} {stop:10.0f}"
        )
    return lines


def main() -> int:
    t0 = time.process_time()
    lines = [
        "the real probe's leading candidates on the two held-out instances of noise 4, p 2 (draw 0): the "
        "probe's R, E[L]'s at step ends, a typical run's, the probe's estimand's;",
        "runs = seeds the probe ran, diverged = of them, stopped at = their median samples when they stopped",
        "",
        *instance_lines(0),
        "",
        *instance_lines(1),
    ]
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    print(f"cpu {time.process_time() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
