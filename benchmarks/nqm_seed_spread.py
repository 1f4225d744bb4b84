"""Why a cheap branched probe misjudges 512 on the NQM (recipes/nqm.toml): the seed spread.

    python benchmarks/nqm_seed_spread.py > benchmarks/out/nqm_seed_spread.txt

1. Full runs (`batchtune probe`, grid, no band stop) at N = 8, 256 and 512 over 20 seeds: each
   seed's R (samples to loss 1.0) and R/R(8) of the medians, beside the closed form's R/R(8) from
   the expected loss (what benchmarks/regret.py and branched_cost.py call the truth).
2. Branched local ratios at 512 over 12 seeds (`batchtune tune --set probe.mode=branched`, every
   candidate branched, max window 3x), at checkpoints 1024 and 2048 of the trunk, with 512's own
   window of 4 steps (2048 samples): per-seed R_c(512, s) / R_c(8, s).
3. The local critical batch at each checkpoint of `batchtune probe --set probe.mode=branched` with
   trunk 3072, checkpoints 0.5/1.0, W 2048 (the recipe's seeds 0-2), beside the closed form's
   critical batch at the trunk's loss there (`nqm_critical_batch` at that loss as the target).
Simulated seconds; deterministic per seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from branched_cost import cli_json
from regret_cases import _nqm_true_r

from batchtune.analysis.sample.lr import scaled_lr
from batchtune.backends.nqm_theory import curvatures, expected_sgd_moments
from batchtune.recipe.load import load_recipe
from batchtune.recipe.schema import Recipe

SEEDS = list(range(20))
BRANCH_SEEDS = list(range(12))


def _json(command: str, sets: list[str]) -> dict[str, Any]:
    out = cli_json(command, sets)
    if out is None:
        raise SystemExit(f"batchtune {command} recipes/nqm.toml failed with --set {sets}")
    return out


def _per_seed(c: dict[str, Any]) -> list[float]:
    ps = c["per_seed_samples_to_target"]
    vals = ps.values() if isinstance(ps, dict) else ps
    return sorted(float("inf") if v in (None, "inf") else float(v) for v in vals)


def closed_form_local_critical(recipe: Recipe, checkpoint: int, window: int, tol: float) -> float:
    """The branched design in expectation (nqm_theory.expected_sgd_moments): the reference's
    expected second moments at the checkpoint, the level = its expected loss one window later, each
    batch's samples to that level / W (linear between steps), and the 1+tol crossing in log batch
    between the candidates."""
    cfg, b0 = recipe.nqm, 8

    def lrs(batch: int, samples: int) -> np.ndarray:
        lr = scaled_lr(recipe.optimizer.lr, batch, b0, recipe.lr_scaling.rule)
        return np.full(math.ceil(samples / batch), lr)

    _, at_c = expected_sgd_moments(cfg, lrs(b0, checkpoint), b0)
    level = expected_sgd_moments(cfg, lrs(b0, window), b0, at_c)[0][-1]
    start = 0.5 * float(curvatures(cfg) @ at_c)

    def samples_to_level(batch: int) -> float:
        losses = np.r_[start, expected_sgd_moments(cfg, lrs(batch, 50 * window), batch, at_c)[0]]
        hit = np.flatnonzero(losses <= level)
        if not hit.size:
            return math.inf
        j = int(hit[0])
        return batch * (j - 1 + (losses[j - 1] - level) / (losses[j - 1] - losses[j]))

    batches = [p * recipe.candidates.group_size for p in recipe.candidates.prompts]
    ratios = [samples_to_level(b) / window for b in batches]
    for i in range(1, len(batches)):
        if ratios[i] > 1 + tol:
            lo, hi = math.log(batches[i - 1]), math.log(batches[i])
            f = (1 + tol - ratios[i - 1]) / (ratios[i] - ratios[i - 1]) if math.isfinite(ratios[i]) else 0.0
            return math.exp(lo + max(0.0, min(1.0, f)) * (hi - lo))
    return math.inf


def main() -> None:
    recipe = load_recipe("recipes/nqm.toml")
    exp_r = {n: _nqm_true_r(recipe, n) for n in (8, 256, 512)}
    d = _json(
        "probe",
        [
            "candidates.prompts=[1, 32, 64]", f"budget.seeds={SEEDS}", "budget.max_extra_seeds=0",
            "budget.stop_at_target=false",
        ],
    )  # fmt: skip
    cands = {c["batch_responses"]: c for c in d["candidates"]}
    r8 = float(np.median(_per_seed(cands[8])))
    print(f"## full runs, {len(SEEDS)} seeds: R per seed (samples to loss {recipe.target.value:g})")
    print("N | median R/R(8) | closed form R/R(8) | per-seed R (sorted)")
    for n in (8, 256, 512):
        r = _per_seed(cands[n])
        print(
            f"{n} | {np.median(r) / r8:.3f} | {exp_r[n] / exp_r[8]:.3f} | " + " ".join(f"{x:,.0f}" for x in r)
        )
    print()
    print(
        f"## branched local ratio R_c(512, s) / R_c(8, s), {len(BRANCH_SEEDS)} seeds, "
        "W 1024 (512: its own 2048)"
    )
    print("checkpoint | median | per-seed (sorted; inf = never reached within 3 windows)")
    for ck in (1024, 2048):
        b = _json(
            "tune",
            [
                "probe.mode=branched", f"branch.trunk_samples={ck}", "branch.window_samples=1024",
                "branch.checkpoints=[1.0]", "branch.max_window_factor=3", "branch.search=all",
                f"budget.seeds={BRANCH_SEEDS}",
            ],
        )  # fmt: skip
        bc = {c["batch_responses"]: c for c in b["candidates"]}
        r0 = bc[8]["samples_to_target"]
        ratios = [x / r0 for x in _per_seed(bc[512])]
        print(f"{ck} | {np.median(ratios):.2f} | " + " ".join(f"{x:.2f}" for x in ratios))
    print()
    print("## local critical batch per checkpoint (trunk 3072, checkpoints 0.5/1.0, W 2048, seeds 0-2)")
    print(
        "checkpoint samples | trunk loss there | local critical batch [90% CI] | "
        "closed form of the same design (expected dynamics)"
    )
    p = _json(
        "probe",
        [
            "probe.mode=branched",
            "branch.trunk_samples=3072",
            "branch.window_samples=2048",
            "branch.checkpoints=[0.5, 1.0]",
        ],
    )
    for lc in p["branched"]["checkpoints"]:
        lo, hi = lc["local_critical_batch_ci"]
        truth = closed_form_local_critical(recipe, int(lc["samples"]), 2048, recipe.target.tolerance)
        print(
            f"{lc['samples']:,.0f} | {lc['metric_at_checkpoint']:.3f} | {lc['local_critical_batch']:.0f} "
            f"[{lo:.0f}, {hi:.0f}] | {truth:.0f}"
        )


if __name__ == "__main__":
    main()
