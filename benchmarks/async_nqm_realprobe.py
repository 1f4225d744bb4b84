"""The shipped seed top-up through the REAL probe on every async NQM instance set (issue 30).

async_nqm_seqtest.py scores the top-up's rule on a simulated probe that reads the loss after every
update; async_nqm_sequential.py (part 2) runs the real probe (measure/probe.run_probe on the NQM
backend, its store, top-up record and `recommend`) on the 8 reported instances, one seed draw. The
real probe's backend logs the loss once per step, after the batch's u updates, and on the reported
instances its top-up picked the best at every one against the truth read there.

This script runs that same real-probe pipeline (async_nqm_sequential._real_probe: the plain 3-seed
probe, then the top-up at the shipped defaults in the same results directory) on all three sets of
async_nqm_seqtest.py (reported, held-out, fresh: 24 instances), 4 seed draws each (planned seeds
0-2, 100-102, 200-202, 300-302; the top-up's seeds follow them, at most 64), and scores each pick
against four truths of R:

- at step ends: E[L] after each batch's u updates, linear between step ends
  (nqm_async.expected_async_step_samples_to_target): what the probe can see;
- per update: nqm_async's definition (the truth of async_nqm_seqtest.py);
- a typical run: the median over 256 other seeds (10000..10255) of each run's own crossing, read as
  the probe reads a run (the isotonic fit of its loss at step ends, nqm_async.read_isotonic_crossing,
  over the whole simulated run; a run that never crosses counts as inf). Where the loss is
  heavy-tailed (a run near its stability edge spikes now and then) the mean loss E[L] crosses far
  later than a typical run does: the two truths answer different questions, and the probe's reading
  estimates the second;
- the probe's estimand (async_nqm_probetruth.py): each run trained and stopped exactly as a probe
  run is, the median over 256 seeds (1280 for the contenders) by the probe's own estimator; what a
  perfect probe of this recipe converges to. Read from the committed async_nqm_probetruth.json.

T_true = R_true / the row's responses/s from the probe's own ranking. Nothing is tuned here: the
top-up runs at its shipped defaults. Two probes run at a time (one per core).

    python benchmarks/async_nqm_realprobe.py  (writes benchmarks/out/async_nqm_realprobe.{txt,json})
    python benchmarks/async_nqm_realprobe.py --from benchmarks/out/async_nqm_realprobe.json  (re-renders)
    python benchmarks/async_nqm_realprobe.py --confirm-margin 1.0  (NOT the shipped probe: each run
        stops 100% past its crossing, not 25%; every set again, the typical
        truth read from the committed JSON; writes async_nqm_realprobe_margin1.0.{txt,json})
    python benchmarks/async_nqm_realprobe.py --top-up-seeds 16 held-out  (NOT the shipped top-up:
        async_top_up_seeds 16 instead of 8, on one set; the typical truth read from the committed
        JSON; writes async_nqm_realprobe_topup16_held-out.{txt,json})
    python benchmarks/async_nqm_realprobe.py --rule sticky,cap=128 held-out  (NOT the shipped top-up:
        sticky: a candidate once topped up leaves the sequential comparison by its interval alone
        (SeqRule.sticky, the shipped default since async_nqm_miss_rounds.py), not by an estimate past
        the margin; cap=N: budget.async_top_up_max_seeds N instead of 64; on one set; writes
        async_nqm_realprobe_rule-sticky-cap128_held-out.{txt,json})
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

OUT = Path(__file__).resolve().parent / "out" / "async_nqm_realprobe.txt"
TYPICAL_SEEDS = tuple(range(10000, 10256))
MARGIN_ENV = "BT_BENCH_CONFIRM_MARGIN"  # set by --confirm-margin for the spawned workers
TOPUP_ENV = "BT_BENCH_TOP_UP_SEEDS"  # set by --top-up-seeds for the spawned workers
RULE_ENV = "BT_BENCH_RULE"  # set by --rule for the spawned workers
DRAWS = (0, 100, 200, 300)
SET_NAMES = ("reported", "held-out", "fresh")
GOAL = 1.05


def _sets() -> dict[str, list]:  # type: ignore[type-arg]
    from async_nqm_seqtest import SETS

    return {name: SETS[name][0] for name in SET_NAMES}


def task(job: tuple[str, int, int]) -> dict[str, object]:
    """One instance and draw: the plain probe and the top-up, scored under both E[L] truths
    (async_nqm_sequential._real_truth); main scores the other two."""
    name, i, first = job
    import async_nqm_sequential as S

    if MARGIN_ENV in os.environ:  # --confirm-margin: the probe's runs stop later (not the shipped rule)
        import functools

        import batchtune.measure.stop_rule as stop_rule
        from batchtune.analysis.sample import curves

        margin = float(os.environ[MARGIN_ENV])
        stop_rule.confirmed_crossing = functools.partial(curves.confirmed_crossing, margin=margin)  # type: ignore[assignment]

    if RULE_ENV in os.environ:
        _patch_rule(os.environ[RULE_ENV])
    inst = _sets()[name][i]
    truth, steps = S._real_truth(inst)
    with tempfile.TemporaryDirectory() as tmp:
        plain, theta, n_plain, _ = S._real_probe(inst, Path(tmp), S.BASE, first)
        top = int(os.environ.get(TOPUP_ENV, S.TOP))
        pick, theta2, n_top, topped = S._real_probe(inst, Path(tmp), top, first)
        end = _end(Path(tmp))
    best_u, u_plain, u_top = S._regrets(truth, theta, theta2, (plain, pick))
    best_s, s_plain, s_top = S._regrets(steps, theta, theta2, (plain, pick))
    return dict(
        name=name, i=i, first=first, plain=plain, pick=pick, best_s=best_s, best_u=best_u,
        s_plain=s_plain, s_top=s_top, u_plain=u_plain, u_top=u_top, n_plain=n_plain, n_top=n_top,
        topped=topped, theta=theta, theta2=theta2, **end,
    )  # fmt: skip


def _end(root: Path) -> dict[str, object]:
    """Where the probe's sequential rounds ended (its TopUpEnd): the best estimate, the leaders not
    separated from it at the cap and the bound their intervals put on the pick's cost (none: no end)."""
    from batchtune.measure.topup_record import load_top_up
    from batchtune.records.store import ResultsStore

    rec = load_top_up(ResultsStore(root))
    if rec is None or rec.end is None:
        return {"end_best": None, "open": [], "bound": None}
    return {"end_best": rec.end.best, "open": [o.label for o in rec.end.open], "bound": rec.end.bound()}


_ORIG: dict[str, Any] = {}  # this worker's unpatched SeqRule and _probe_sets (--rule)


def _patch_rule(rule: str) -> None:
    """--rule (module docstring): the sequential rounds' variant, patched into this worker."""
    import functools

    import async_nqm_sequential as S

    import batchtune.analysis.decide.async_topup as A

    parts = dict(p.partition("=")[::2] for p in rule.split(","))
    # a pool worker runs several jobs: patch the originals each time, never a patch of a patch
    if "sticky" in parts:
        A.SeqRule = functools.partial(_ORIG.setdefault("SeqRule", A.SeqRule), sticky=True)  # type: ignore[misc,assignment]
    if parts.get("cap"):
        sets = _ORIG.setdefault("probe_sets", S._probe_sets)
        extra = f"budget.async_top_up_max_seeds={int(parts['cap'])}"
        S._probe_sets = lambda *a, **k: [*sets(*a, **k), extra]


def _shipped_rule() -> str:
    from batchtune.analysis.decide.async_topup import MAX_SEEDS, STICKY

    return f"{'sticky' if STICKY else 'not sticky'}, cap {MAX_SEEDS}"


def typical_truth(job: tuple[str, int]) -> dict[str, float]:
    """R of a typical run per candidate label (module docstring): the median of the runs' own
    crossings at step ends over TYPICAL_SEEDS."""
    import itertools

    import async_nqm_sequential as S
    import numpy as np
    from async_nqm_regret import lr_of

    from batchtune.backends.nqm_async import read_isotonic_crossing, simulate_loss_curves
    from batchtune.backends.nqm_theory import initial_theta, nqm_loss

    inst = _sets()[job[0]][job[1]]
    cfg, target = S._cfg(inst)
    loss0 = nqm_loss(cfg, initial_theta(cfg))
    out = {}
    for p in S.PROBE_PROMPTS:
        b = 8 * p
        for k, u in itertools.product(S.PROBE_KS, S.PROBE_US):
            kw = dict(lr=lr_of(b), batch=b, delay=k, updates_per_batch=u, target_loss=target)
            ends = simulate_loss_curves(cfg, seeds=list(TYPICAL_SEEDS), max_updates=4000, **kw)[u - 1 :: u]  # type: ignore[arg-type]
            rs = [
                read_isotonic_crossing(
                    ends[:, j], target_loss=target, batch=b, updates_per_batch=1, loss0=loss0
                )
                for j in range(ends.shape[1])
            ]
            out[S.probe_label(p, k, u)] = float(np.median(rs))
    return out


def score_estimand(rows: list[dict[str, object]]) -> None:
    """Each row's regrets under the probe's estimand (async_nqm_probetruth.json), where committed."""
    import async_nqm_sequential as S
    from async_nqm_probetruth import committed

    truth = committed()
    if truth is None:
        return
    for r in rows:
        est = truth[f"{r['name']}/{r['i']}"]
        picks = (str(r["plain"]), str(r["pick"]))
        r["best_p"], r["p_plain"], r["p_top"] = S._regrets(est, r["theta"], r["theta2"], picks)  # type: ignore[arg-type]


def _p(row: dict[str, object], key: str) -> str:
    return f"{float(row[key]):5.3f}" if key in row else "    -"  # type: ignore[arg-type]


def _summary(rows: list[dict[str, object]], key: str) -> str:
    if any(key not in r for r in rows):  # rendered before the probe's estimand was computed
        return f"{'-':>6} {'-':>6} {'-':>3}"
    vals = [float(r[key]) for r in rows]  # type: ignore[arg-type]
    miss = sum(v > GOAL for v in vals)
    return f"{max(vals):6.3f} {statistics.fmean(vals):6.3f} {miss:3d}"


def render(
    done: list[dict[str, object]],
    wall: float,
    load: float,
    margin: float | None = None,
    top_up_seeds: int | None = None,
    rule: str | None = None,
) -> str:
    """The tables (module docstring) from the tasks' records."""
    sets = _sets()
    names = [n for n in SET_NAMES if any(r["name"] == n for r in done)]
    variant = [
        *([f"async_top_up_seeds {top_up_seeds} (shipped 8)"] if top_up_seeds is not None else []),
        *([f"sequential rule variant {rule} (shipped: {_shipped_rule()})"] if rule else []),
        *(
            [
                f"each run stops {margin:.0%} past its crossing (measure/stop_rule.py stops it 25% past), so "
                "the probe's estimand (runs stopped by the shipped rule) is not scored"
            ]
            if margin is not None
            else []
        ),
    ]
    lines = [
        *(
            [f"NOT THE SHIPPED PROBE: {'; '.join(variant)}; the typical truth is the committed one", ""]
            if variant
            else []
        ),
        "the shipped seed top-up through the real probe (run_probe on the NQM backend, then recommend), "
        f"every set, {len(DRAWS)} seed draws",
        f"(planned seeds {', '.join(f'{d}..{d + 2}' for d in DRAWS)}); regret = T_true(pick) / least T_true; "
        f"miss = regret > {GOAL}; plain = the 3-seed probe,",
        "top-up = the shipped defaults in its results directory; truths: E[L] read at step ends (what the "
        "probe sees), per update (nqm_async's),",
        f"a typical run (the median of {len(TYPICAL_SEEDS)} runs' own crossings over a long run, read as "
        "the probe reads a run) and the probe's estimand",
        "(async_nqm_probetruth.py: runs trained and stopped as the probe's, 256 seeds, 1280 for the "
        "contenders, read by its estimator)",
        f"machine: {platform.machine()} {os.cpu_count()} cores; two probes at a time; load at the end "
        f"{load:.2f}; wall {wall:.0f} s",
        "",
        "per instance: the best under E[L] at step ends, a typical run and the probe's estimand; per draw "
        "the top-up's pick, its regret under each",
        f"{'set':>9} {'noise':>5} {'p':>4} {'g:t':>4} {'best E[L]':>14} {'best typical':>14} "
        f"{'best estimand':>14}  per draw: pick  E[L]  typical  estimand",
    ]
    for name in names:
        for i, inst in enumerate(sets[name]):
            rs = [r for r in done if r["name"] == name and r["i"] == i]
            g_t = inst.gen_per_resp_s / inst.train_per_resp_s
            ratio = f"{g_t:.0f}:1" if g_t >= 1 else f"1:{1 / g_t:.0f}"
            cells = "  ".join(
                f"{r['pick']!s:>14} {float(r['s_top']):5.3f} {float(r['t_top']):5.3f} {_p(r, 'p_top')}"
                for r in rs
            )
            lines.append(
                f"{name:>9} {inst.noise:5.2f} {inst.power:4.2f} {ratio:>4} {rs[0]['best_s']!s:>14} "
                f"{rs[0]['best_t']!s:>14} {rs[0].get('best_p', '-')!s:>14}  {cells}"
            )
    lines += [
        "",
        f"per set, over {len(DRAWS)} draws x 8 instances: max regret, mean, misses; cost = the top-up's "
        "seed-runs over the plain probe's",
        f"{'':>9}  {'E[L] at step ends':^35}  {'E[L] per update':^35}  {'a typical run':^35}  "
        f"{'the probe estimand':^35}",
        f"{'set':>9}  " + "  ".join([f"{'plain':^17} {'top-up':^17}"] * 4) + f"  {'cost':>5}",
    ]
    for name in names:
        rows = [r for r in done if r["name"] == name]
        cost = sum(int(r["n_top"]) for r in rows) / sum(int(r["n_plain"]) for r in rows)  # type: ignore[call-overload]
        cells = "  ".join(
            f"{_summary(rows, p + 'plain')} {_summary(rows, p + 'top')}" for p in ("s_", "u_", "t_", "p_")
        )
        lines.append(f"{name:>9}  {cells}  {cost:4.2f}x")
    return "\n".join(lines + _end_lines(done, names)) + "\n"


def _end_lines(done: list[dict[str, object]], names: list[str]) -> list[str]:
    """Where the top-up's rounds ended, scored against the probe's estimand (none: a run before
    TopUpEnd was recorded, or the estimand not computed)."""
    if any("open" not in r or "p_top" not in r for r in done):
        return []
    from async_nqm_unresolved import flag_head, flag_row

    from batchtune.analysis.decide.async_topup import TOL

    lines = [
        "",
        "where the top-up's rounds ended (recommend's NOT RESOLVED note: leaders not separated from the best "
        "estimate at the cap), against the probe's estimand;",
        "bound = 1 / the least lower end of their T-ratio intervals, what the note says the pick may cost; "
        f"unflagged = every compared leader separated (within 1 / (1 - {TOL}) = {1 / (1 - TOL):.3f})",
        flag_head(),
    ]
    for name in names:
        rows = [
            (float(r["p_top"]), list(r["open"]), float(r["bound"]), r["best_p"] in (r["pick"], *r["open"]))  # type: ignore[arg-type,call-overload,misc]
            for r in done
            if r["name"] == name
        ]
        lines.append(flag_row(name, rows))
    for r in done:
        if r["open"] and float(r["p_top"]) > GOAL:  # type: ignore[arg-type]
            lines.append(
                f"  flagged miss: {r['name']}/{r['i']} draw {r['first']}: pick {r['pick']}, estimand's best "
                f"{r['best_p']}, regret {float(r['p_top']):.3f}, bound {float(r['bound']):.3f}, "  # type: ignore[arg-type]
                f"open: {', '.join(str(x) for x in r['open'])}"  # type: ignore[attr-defined]
            )
    return lines


def main() -> int:
    """Run every probe and the typical-run truth, or (``--from``) re-render the committed JSON."""
    if sys.argv[1:2] == ["--from"]:
        path = Path(sys.argv[2])
        saved = json.loads(path.read_text())
        if saved.get("confirm_margin") is None:  # the estimand is the shipped stop rule's runs'
            score_estimand(saved["runs"])
        else:  # a variant stopping runs later: no estimand to score it against
            for r in saved["runs"]:
                for key in ("best_p", "p_plain", "p_top"):
                    r.pop(key, None)
        text = render(
            saved["runs"],
            saved["wall_s"],
            saved["load_end"],
            saved.get("confirm_margin"),
            saved.get("top_up_seeds"),
            saved.get("rule"),
        )
        path.with_suffix(".txt").write_text(text)
        print(text, end="")
        return 0
    margin = float(sys.argv[2]) if sys.argv[1:2] == ["--confirm-margin"] else None
    top_up = int(sys.argv[2]) if sys.argv[1:2] == ["--top-up-seeds"] else None
    rule = sys.argv[2] if sys.argv[1:2] == ["--rule"] else None
    names = [sys.argv[3]] if top_up is not None or rule else list(SET_NAMES)
    out = OUT if margin is None else OUT.with_name(f"{OUT.stem}_margin{margin}.txt")
    if top_up is not None:
        out = OUT.with_name(f"{OUT.stem}_topup{top_up}_{names[0]}.txt")
        os.environ[TOPUP_ENV] = str(top_up)
    if rule:
        slug = rule.replace(",", "-").replace("=", "")
        out = OUT.with_name(f"{OUT.stem}_rule-{slug}_{names[0]}.txt")
        os.environ[RULE_ENV] = rule
    # the truth does not depend on the probe: a variant reads the committed one
    reuse_typical = margin is not None or top_up is not None or rule is not None
    t0 = time.time()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if margin is not None:
        os.environ[MARGIN_ENV] = str(margin)
    sets = _sets()
    jobs = [(name, i, first) for name in names for i in range(len(sets[name])) for first in DRAWS]
    insts = [(name, i) for name in names for i in range(len(sets[name]))]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        done = pool.map(task, jobs, chunksize=1)
        if not reuse_typical:
            typical = dict(zip(insts, pool.map(typical_truth, insts, chunksize=1), strict=True))
        else:  # the truth does not depend on the probe: the committed one
            kept = json.loads(OUT.with_suffix(".json").read_text())["typical"]
            typical = {(n, i): kept[f"{n}/{i}"] for n, i in insts}
    import async_nqm_sequential as S

    for r in done:
        truth = typical[(str(r["name"]), int(r["i"]))]  # type: ignore[call-overload]
        picks = (str(r["plain"]), str(r["pick"]))
        r["best_t"], r["t_plain"], r["t_top"] = S._regrets(truth, r["theta"], r["theta2"], picks)  # type: ignore[arg-type]
    if margin is None:  # the estimand is that of runs stopped by the shipped rule: not this variant's
        score_estimand(done)
    wall, load = time.time() - t0, os.getloadavg()[0]
    saved = {
        "confirm_margin": margin,
        "top_up_seeds": top_up,
        "rule": rule,
        "wall_s": wall,
        "load_end": load,
        "runs": done,
        "typical": {f"{n}/{i}": v for (n, i), v in typical.items()},
    }
    out.with_suffix(".json").write_text(json.dumps(saved, indent=1) + "\n")
    text = render(done, wall, load, margin, top_up, rule)
    out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
