"""Why the real probe's top-up misses on the held-out async NQM set (issue 30): its rounds, logged.

async_nqm_realprobe.py scores the shipped top-up's pick on 4 seed draws of 24 instances. Against the
probe's own estimand (async_nqm_probetruth.json) it misses 1.05 on 3 held-out instance-draws. This
script reruns those instances' draws (the misses and the hits beside them, same code, same seeds)
with the top-up's rounds logged: at every state the rule saw (each call of its estimate), the
leaders (T within the margin of the best estimate), each one's seeds, its R read by the probe against
the estimand's R, and its T ratio to the round's best: as estimated, with the lower end of the
interval the rule tested (ratio minus the family z times the delete-a-group jackknife error), and in
truth. So one reads whether a miss comes from a round that stopped (declared a leader separated)
while the truth says otherwise, from leaders left at the cap, or from the median itself being off.

Each instance-draw runs under two sequential rules (analysis/decide/async_topup.py): margin-only, a
leader whose estimate falls past the margin (30% of the best) leaves the comparison, as the rule did
when the misses were found; and sticky (SeqRule.sticky), a candidate once topped up leaves it only
when its interval separates it. What it showed under margin-only: the 1.193 miss is a true best
whose first 16 seeds read R 1.6x its estimand (seeds 300..315, a 2.6-sigma draw of a wide-spread
candidate, median-unbiased over 256 seeds), so its estimate left the margin and it was never
compared again; the 1.066 and 1.122 misses are leaders still not separated at the 64-seed cap.
Nothing is tuned here; the probe runs at the shipped defaults but for the rule. Two probes at a time.

    python benchmarks/async_nqm_miss_rounds.py  (writes benchmarks/out/async_nqm_miss_rounds.{txt,json}
        and the round-by-round log async_nqm_miss_rounds_log.txt)
    python benchmarks/async_nqm_miss_rounds.py --from benchmarks/out/async_nqm_miss_rounds.json
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

OUT = Path(__file__).resolve().parent / "out" / "async_nqm_miss_rounds.txt"  # the picks and seed blocks
LOG = OUT.with_name("async_nqm_miss_rounds_log.txt")  # every state the rule saw, round by round
# (set, instance, first planned seed): the 3 held-out misses of async_nqm_realprobe.txt, and the
# other draws of the same two instances (hits), for contrast
# each under both sequential rules: the margin alone ends a leader's comparison (sticky False, the
# rule before this script), or a topped-up candidate leaves it by its interval alone (sticky True)
_ORIG: dict[str, Any] = {}  # this worker's unpatched async_topup.SeqRule and top_up
JOBS = [("held-out", i, d, sticky) for sticky in (False, True) for i in (3, 6) for d in (0, 100, 200, 300)]


def task(job: tuple[str, int, int, bool]) -> dict[str, Any]:
    """One probe (plain, then the top-up at the shipped defaults but ``sticky``, in its results
    directory) with the rule's inputs logged."""
    name, i, first, sticky = job
    import functools

    import async_nqm_sequential as S
    from async_nqm_realprobe import _sets

    import batchtune.analysis.decide.async_topup as A

    # a pool worker runs several jobs: patch the originals each time, never a patch of a patch
    A.SeqRule = functools.partial(_ORIG.setdefault("SeqRule", A.SeqRule), sticky=sticky)  # type: ignore[misc,assignment]

    log: list[dict[str, Any]] = []
    topped: set[str] = set()  # every candidate topped up so far (a sticky rule keeps comparing them)
    orig = _ORIG.setdefault("top_up", A.top_up)

    def logged(estimate: Any, run: Any, **kw: Any) -> Any:
        def est() -> Any:
            t, seeds = estimate()
            log.append({"t": dict(t), "seeds": dict(seeds), "groups": {}, "kept": sorted(topped)})
            return t, seeds

        told = kw.get("on_round")

        def on_round(rnd: Any) -> None:
            topped.update(u.label for u in rnd.topped)
            if told is not None:
                told(rnd)

        kw["on_round"] = on_round

        ev: Any = kw.get("evidence")

        def groups(labels: list[str]) -> Any:
            g = ev(labels)
            log[-1]["groups"] = {lab: list(v) for lab, v in g.items()}
            return g

        if ev is not None:
            kw["evidence"] = groups
        return orig(est, run, **kw)

    A.top_up = logged
    inst = _sets()[name][i]
    with tempfile.TemporaryDirectory() as tmp:
        S._real_probe(inst, Path(tmp), S.BASE, first)
        pick, theta, n_top, _ = S._real_probe(inst, Path(tmp), S.TOP, first)
    return dict(name=name, i=i, first=first, sticky=sticky, pick=pick, theta=theta, n_top=n_top, log=log)


def _state_lines(
    state: dict[str, Any], theta: dict[str, float], truth: dict[str, float], sticky: bool
) -> list[str]:
    """One state the rule saw: its leaders, estimated and true."""
    from batchtune.analysis.decide.async_topup import MARGIN, Z, compared, family_z, ratio_interval

    t, seeds, groups = state["t"], state["seeds"], state["groups"]
    lead = compared(t, MARGIN, state.get("kept", ()), sticky)
    best = min(lead, key=lambda lab: t[lab])
    z = family_z(Z, len({t[lab] for lab in lead}) - 1)
    t_true = {lab: truth[lab] / theta[lab] for lab in lead}
    out = []
    for lab in sorted(lead, key=lambda lab: t[lab]):
        r_est = t[lab] * theta[lab]
        low = "    -"
        if lab != best and lab in groups and best in groups:
            _, lo = ratio_interval(t[lab], t[best], groups[lab], groups[best], z)
            low = f"{lo:5.3f}" if math.isfinite(lo) else "  nan"
        sep = "" if lab == best or low.strip() in ("-", "nan") else (" sep" if float(low) > 0.95 else " NOT")
        out.append(
            f"      {lab:>14} {seeds.get(lab, 0):3d} seeds  R {r_est:7.1f} / true {truth[lab]:7.1f} "
            f"({r_est / truth[lab]:5.3f})  T/T_best {t[lab] / t[best]:5.3f} low {low}{sep}  "
            f"true {t_true[lab] / t_true[best]:5.3f}"
        )
    return out


BLOCKS = ((300, 16), (0, 256), (300, 256), (10000, 256))  # (first seed, seeds)


def seed_blocks() -> list[str]:
    """The 1.193 miss's two candidates read by the probe's estimator over blocks of seeds: is the
    first-16-seeds reading a bias or a draw?"""
    import async_nqm_probetruth as P

    from batchtune.measure.plan import plan_candidates

    recipe = P._recipe("held-out", 6)
    plan = plan_candidates(recipe)
    out = [
        "",
        "held-out/6, the 1.193 miss's two candidates: R by the probe's estimator over blocks of seeds "
        "(median, its interval, the seeds' quartiles)",
    ]
    for cand in (c for c in plan.candidates if c.label in ("P8xG8-k1u4", "P16xG8-k0u4")):
        for first, n in BLOCKS:
            runs = P._runs(recipe, cand, plan.reference_batch, tuple(range(first, first + n)))
            e = P._estimate(recipe, runs)
            out.append(
                f"  {cand.label:>12} seeds {first}..{first + n - 1}: R {e['r']:6.1f} [{e['lo']:.0f}, "
                f"{e['hi']:.0f}]  quartiles {e['q25']:.0f} {e['q75']:.0f}"
            )
    return out


def _blocks(_: None) -> list[str]:  # seed_blocks in a spawned worker (its sys.path set)
    return seed_blocks()


def _why(row: dict[str, Any], truth: dict[str, float]) -> str:
    """Why a miss: where the true best stood in the last state the rule saw."""
    from batchtune.analysis.decide.async_topup import MARGIN, compared

    if _regret(row, truth) <= 1.05:
        return "-"
    best = _true_best(row, truth)
    last = row["log"][-1]
    t, n = last["t"], last["seeds"].get(best, 0)
    lead = compared(t, MARGIN, last.get("kept", ()), row["sticky"])
    ratio = t[best] / min(t.values())
    if best not in lead:
        return f"outside: best {ratio:.2f}x at {n} seeds"
    return f"not separated: best {ratio:.2f}x at {n} seeds"


def _t_true(row: dict[str, Any], truth: dict[str, float]) -> dict[str, float]:
    return {lab: truth[lab] / th for lab, th in row["theta"].items() if th > 0}


def _true_best(row: dict[str, Any], truth: dict[str, float]) -> str:
    t_true = _t_true(row, truth)
    return min(t_true, key=t_true.__getitem__)


def _regret(row: dict[str, Any], truth: dict[str, float]) -> float:
    t_true = _t_true(row, truth)
    return t_true[row["pick"]] / min(t_true.values())


def render(rows: list[dict[str, Any]], wall: float, blocks: list[str]) -> tuple[str, str]:
    from async_nqm_probetruth import committed

    truth = committed()
    assert truth is not None, "needs benchmarks/out/async_nqm_probetruth.json"
    lines = [
        "the top-up's rounds through the real probe, logged (held-out instances 3 and 6, 4 seed draws "
        "each), under two sequential rules:",
        "margin-only (a leader past 30% of the best estimate leaves the comparison) and sticky (a "
        "candidate once topped up leaves it by its interval alone)",
        f"machine: {platform.machine()} {os.cpu_count()} cores; two probes at a time; wall {wall:.0f} s",
        "",
        "per instance-draw: the pick and its regret against the estimand (async_nqm_probetruth.json), "
        "seed-runs, why a miss (the true best in the last state: past the margin, or a leader not "
        "separated at the cap); margin-only | sticky",
    ]
    picks: dict[tuple[str, int, int], list[str]] = {}
    for r in rows:
        key = f"{r['name']}/{r['i']}"
        picks.setdefault((r["name"], r["i"], r["first"]), []).append(
            f"{r['pick']:>14} {_regret(r, truth[key]):5.3f} {r['n_top']:4d} {_why(r, truth[key]):<38}"
        )
    lines += [f"  {n}/{i} draw {d:3d}: {' | '.join(c)}".rstrip() for (n, i, d), c in picks.items()]
    lines += [*blocks, "", f"every state the rule saw: {LOG.name}"]
    log = [
        "per state the rule saw: each leader (T within 30% of the best estimate; sticky: and every "
        "candidate topped up before), its seeds, its R as",
        "the probe reads it / the estimand's R, its T over the state's best T (estimated; low = the "
        "lower end the rule tests, family z; sep: above 0.95,",
        "NOT: not) and the same ratio in truth",
    ]
    for r in rows:
        key = f"{r['name']}/{r['i']}"
        tr = truth[key]
        best = _true_best(r, tr)
        log += [
            "",
            f"{'sticky' if r['sticky'] else 'margin-only'} rule, {key} draw {r['first']}: pick {r['pick']} "
            f"(regret {_regret(r, tr):.3f} against the estimand; best {best}); {r['n_top']} seed-runs",
        ]
        for s, state in enumerate(r["log"], 1):
            log.append(f"    state {s}:")
            log += _state_lines(state, r["theta"], tr, r["sticky"])
    return "\n".join(lines) + "\n", "\n".join(log) + "\n"


def _write(texts: tuple[str, str]) -> None:
    OUT.write_text(texts[0])
    LOG.write_text(texts[1])
    print(texts[0], end="")


def main() -> int:
    if sys.argv[1:2] == ["--from"]:
        saved = json.loads(Path(sys.argv[2]).read_text())
        _write(render(saved["runs"], saved["wall_s"], saved["blocks"]))
        return 0
    t0 = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        rows = pool.map(task, JOBS, chunksize=1)
        (blocks,) = pool.map(_blocks, [None])
    wall = time.perf_counter() - t0
    saved = {"wall_s": wall, "runs": rows, "blocks": blocks}
    OUT.with_suffix(".json").write_text(json.dumps(saved, indent=1))
    _write(render(rows, wall, blocks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
