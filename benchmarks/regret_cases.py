"""The cases of benchmarks/regret.py: NQM instances and synthetic RL curves, with their truths.

NQM (backends/nqm.py): the tool runs as a user would (probe, profile-gen, recommend on a recipe
with --set overrides, in a temporary results directory). The truth is computed apart from it:
  R(B)   the closed form of the expected SGD loss (backends/nqm_theory.expected_samples_to_target)
         at each candidate's scaled LR, uncapped (a full run has no probe budget);
  Θ(B)   the simulation's own time model, never the tool's fitted profile: a batch of N responses
         is generated in waves of c = min(N, c_max) sequences, each wave taking
         t0 * E[max L] + t1 * c E[L] simulated seconds (L the response-length law of the mode the
         tool ranks with: eos if profiled, else fixed), then one optimiser step t0' + t1' N.
Synthetic RL: reward curves whose samples-to-target is R(B) = E_min (1 + B / B_crit) exactly,
written as finished runs into a results store with per-step times from a known Θ(B) model, then
analysed and ranked by the tool (analysis.sample.efficiency / recommend, --throughput probe).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchtune.analysis.decide.recommend import Recommendation, recommend, throughput_from_probe
from batchtune.analysis.sample.assess import analyse_runs
from batchtune.analysis.sample.lr import scaled_lr
from batchtune.backends.nqm_theory import expected_samples_to_target, nqm_critical_batch_for_recipe
from batchtune.measure.probe import load_run_data, run_probe
from batchtune.measure.profile import run_profile
from batchtune.recipe.load import load_recipe
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import RunRecord, StepRecord, candidate_label
from batchtune.workflow.recommend import recommend_for_recipe

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class CaseResult:
    """One case: the truth, the tool's answer, and how far apart they are."""

    kind: str
    name: str
    batches: tuple[float, ...]
    true_t: tuple[float, ...]  # true time-to-target per batch (s; inf = never)
    best_batch: float
    recommended: float
    regret: float  # T(recommended) / T(best)
    true_critical: float  # largest grid batch with true R(B)/R(B0) <= 1 + tol
    true_crossing: float  # continuous 1+tol crossing (inf: none)
    critical: float | None  # the tool's
    crossing: float | None
    crossing_ci: tuple[float, float] | None
    probe_samples: float
    full_run_samples: float  # true R at the best batch
    wall_s: float
    regret_high: float = math.nan  # the tool's own bound: how much faster another batch could be
    shape_free_ci: tuple[float, float] | None = None  # the crossing's interval without a model of R(B)
    critical_fit: float | None = None  # what the joint fit's crossing alone gives (before 2026-12-03)

    @property
    def bound_covers(self) -> bool:
        """Whether the tool's regret bound holds the true regret (its 90% claim)."""
        return self.regret <= self.regret_high * (1 + 1e-9)

    @property
    def cost_ratio(self) -> float:
        return self.probe_samples / self.full_run_samples

    @property
    def critical_steps_off(self) -> float:
        """Grid steps between the tool's critical batch and the truth (log2 for doubling grids)."""
        return _steps(self.critical, self.true_critical)

    @property
    def critical_fit_steps_off(self) -> float:
        """The same for the joint fit's crossing alone (the estimate before 2026-12-03)."""
        return _steps(self.critical_fit, self.true_critical)


def _steps(x: float | None, truth: float) -> float:
    return math.inf if x is None else abs(math.log2(x / truth))


# ---- NQM --------------------------------------------------------------------------------------------

# name -> --set overrides on recipes/nqm.toml; each instance's target is set to TARGET_FRACTION of
# its initial loss so every instance is equally far from its start.
NQM_CASES: dict[str, list[str]] = {
    "shipped": [],
    "noise3": ["nqm.noise_scale=3.0"],
    "noise30": ["nqm.noise_scale=30.0"],
    "lr0.015": ["optimizer.lr=0.015"],
    "lr0.06": ["optimizer.lr=0.06"],
    "p0.7": ["nqm.curvature_power=0.7"],
    "p1.5": ["nqm.curvature_power=1.5"],
    "dim100": ["nqm.dim=100"],
    "dim3000": ["nqm.dim=3000"],
    "sqrt-rule": ["lr_scaling.rule=sqrt", "optimizer.lr=0.1"],
    # near the stability edge (issue 32 item 1: p = 0.8 read regret 1.151 on seeds not shipped here):
    # 512 is past the 1+tol crossing but keeps up on some seeds; other seed sets than the recipe's
    "p0.8": ["nqm.curvature_power=0.8"],
    "p0.8-s9": ["nqm.curvature_power=0.8", "budget.seeds=[9, 10, 11]"],
    "p0.75-s3": ["nqm.curvature_power=0.75", "budget.seeds=[3, 4, 5]"],
    "p0.85-s6": ["nqm.curvature_power=0.85", "budget.seeds=[6, 7, 8]"],
}
QUICK_NQM = ("shipped", "noise30")
TARGET_FRACTION = 1.0 / 3.74  # the shipped instance: 3.74 -> 1.0


def nqm_recipe(name: str, results: str, extra: list[str] = ()) -> Recipe:  # type: ignore[assignment]
    base = load_recipe(ROOT / "recipes" / "nqm.toml", [*NQM_CASES[name], "run.workers=1", *extra])
    h = 1.0 / np.arange(1, base.nqm.dim + 1) ** base.nqm.curvature_power
    loss0 = 0.5 * float(h.sum()) * base.nqm.init_scale**2
    target = round(loss0 * TARGET_FRACTION, 4)
    ref = min(base.candidates.prompts) * base.candidates.group_size
    r0 = _nqm_true_r(base, ref, target)
    overrides = [
        *NQM_CASES[name],
        "run.workers=1",
        f"target.value={target}",
        f"budget.max_samples={int(3.3 * r0)}",  # the shipped ratio of budget to the reference's R
        f"run.results_dir={results}",
        *extra,
    ]
    return load_recipe(ROOT / "recipes" / "nqm.toml", overrides)


def _nqm_true_r(cfg: Recipe, batch: int, target: float | None = None) -> float:
    ref = cfg.lr_scaling.reference_batch or min(cfg.candidates.prompts) * cfg.candidates.group_size
    lr = scaled_lr(cfg.optimizer.lr, batch, ref, cfg.lr_scaling.rule)
    return expected_samples_to_target(
        cfg.nqm,
        lr=lr,
        batch=batch,
        target_loss=cfg.target.value if target is None else target,
        warmup_samples=cfg.optimizer.warmup_samples,
        max_samples=2.0**50,
    )


def expected_lengths(mode: str, c: int, max_new_tokens: int, p: float) -> tuple[float, float]:
    """(E[max L], E[L]) for c responses of L = min(Geometric(p), T) (eos) or T (fixed), exact."""
    if mode == "fixed" or p <= 0:
        return float(max_new_tokens), float(max_new_tokens)
    k = np.arange(max_new_tokens)  # P(L > k) = (1-p)^k for k < T (Geometric on 1, 2, ...)
    survive = (1 - p) ** k
    return float(np.sum(1 - (1 - survive) ** c)), float(np.sum(survive))


def nqm_true_step_s(cfg: Recipe, batch: int) -> float:
    """Simulated seconds of one step at N = batch: generation in waves, then training (module doc)."""
    n, g = cfg.nqm, cfg.generation
    cap = max(c for c in g.concurrency if n.gen_max_concurrency <= 0 or c <= n.gen_max_concurrency)
    mode = "eos" if "eos" in g.modes else "fixed"
    gen, left = 0.0, batch
    while left > 0:
        c = min(left, cap)
        e_max, e_len = expected_lengths(mode, c, g.max_new_tokens, g.eos_stop_prob)
        gen += n.gen_t0_s * e_max + n.gen_t1_s * c * e_len
        left -= c
    return gen + n.train_t0_s + n.train_t1_s * batch + g.other_s_per_step


def _grid_truth(batches: np.ndarray, r: np.ndarray, tol: float) -> float:
    ok = batches[np.isfinite(r) & (r / r[0] <= 1 + tol)]
    return float(ok.max())


def nqm_true_time(cfg: Recipe, batch: int) -> float:
    """True time-to-target at N = batch: closed-form R times the simulated seconds per sample."""
    return _nqm_true_r(cfg, batch) * nqm_true_step_s(cfg, batch) / batch


def probe_and_recommend(name: str, workdir: str | None = None) -> tuple[Recipe, Recommendation]:
    """The tool on NQM case `name` as a user runs it (probe, profile, recommend) in a fresh results dir."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        cfg = nqm_recipe(name, str(Path(tmp) / "results"))
        run_probe(cfg)
        run_profile(cfg, ResultsStore.of(cfg))
        rec, _, _ = recommend_for_recipe(cfg, "auto", None, 1)
    return cfg, rec


def run_nqm_case(name: str, workdir: str | None = None) -> CaseResult:
    import time

    t0 = time.perf_counter()
    cfg, rec = probe_and_recommend(name, workdir)
    eff = rec.efficiency
    batches = np.array(sorted(c.batch_responses for c in eff.candidates if c.family == "main"), float)
    r = np.array([_nqm_true_r(cfg, int(b)) for b in batches])
    t = np.array([nqm_true_time(cfg, int(b)) for b in batches])
    try:
        crossing = nqm_critical_batch_for_recipe(cfg)
    except Exception:
        crossing = math.nan
    return _result("nqm", name, batches, r, t, rec, cfg.target.tolerance, crossing, t0)


def _result(
    kind: str,
    name: str,
    batches: np.ndarray,
    r: np.ndarray,
    t: np.ndarray,
    rec: Recommendation,
    tol: float,
    crossing: float,
    t0: float,
) -> CaseResult:
    import time

    eff = rec.efficiency
    best = int(np.argmin(t))
    chosen = float(rec.winner.batch_responses)
    t_rec = float(t[list(batches).index(chosen)])
    crit = eff.critical
    return CaseResult(
        kind=kind,
        name=name,
        batches=tuple(float(b) for b in batches),
        true_t=tuple(float(x) for x in t),
        best_batch=float(batches[best]),
        recommended=chosen,
        regret=t_rec / float(t[best]),
        true_critical=_grid_truth(batches, r, tol),
        true_crossing=crossing,
        critical=None if crit is None else crit.batch,
        crossing=None if crit is None else crit.crossing,
        crossing_ci=None if crit is None else crit.crossing_ci,
        probe_samples=float(eff.total_samples),
        full_run_samples=float(r[best]),
        wall_s=time.perf_counter() - t0,
        regret_high=float(rec.ranking.regret_high),
        shape_free_ci=None if crit is None or crit.shape_free is None else crit.shape_free.ci,
        critical_fit=None if crit is None else crit.batch if crit.model_batch is None else crit.model_batch,
    )


# ---- synthetic RL curves ----------------------------------------------------------------------------

SYN_B_CRITS = (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0)
SYN_GROUPS = (8, 16)
SYN_PROMPTS = (4, 8, 16, 32, 64, 128, 256)
SYN_SEEDS = (0, 1, 2)
QUICK_SYN = ((256.0, 8), (1024.0, 16))
# perfect scaling (R(B) flat: no critical batch), 3 seeds of the noise; G = 8 only: at G = 16 the
# largest batch (4096) exceeds E_min (2000), so a run reaches the target inside its first step
# and the truth's fractional-step time is not one a run can achieve
PERFECT_SYN = ((math.inf, 8, 0), (math.inf, 8, 1), (math.inf, 8, 2))
E_MIN = 2000.0  # samples at B -> 0
GEN_T0, GEN_T1, TRAIN_T0, TRAIN_T1 = 2.0, 0.004, 0.5, 0.002  # seconds: step_s(N) = 2.5 + 0.006 N
SIGMA0, B_SIGMA = 0.08, 32.0  # noise of one logged point at N = 32; it scales as sqrt(32 / N)
TOL = 0.1


def _logistic(u: np.ndarray | float) -> np.ndarray:
    """A GRPO-like reward curve in u = samples / R(B): it crosses TARGET at u = 1 exactly."""
    return 0.1 + 0.8 / (1 + np.exp(-(np.asarray(u) - 0.75) / 0.15))


TARGET = float(_logistic(1.0))  # 0.773


def _syn_store(root: Path, b_crit: float, group: int, rng: np.random.Generator) -> None:
    store = ResultsStore(root)
    for p in SYN_PROMPTS:
        n = p * group
        r_true = E_MIN * (1 + n / b_crit)
        step_s = (GEN_T0 + GEN_T1 * n, TRAIN_T0 + TRAIN_T1 * n)
        label = candidate_label(p, group)
        steps_total = max(4, int(math.ceil(1.25 * r_true / n)))
        for seed in SYN_SEEDS:
            rid = f"{label}-s{seed}"
            s = n * np.arange(1, steps_total + 1, dtype=float)
            m = _logistic(s / r_true) + SIGMA0 * math.sqrt(B_SIGMA / n) * rng.standard_normal(s.size)
            steps = [
                StepRecord(rid, k + 1, int(s[k]), int(s[k]) * 8, 1e-4, p, group, seed,
                           {"eval_reward": float(m[k])}, 1.0, None, step_s[0], step_s[1])
                for k in range(s.size)
            ]  # fmt: skip
            rec = RunRecord(
                run_id=rid, candidate=label, prompts=p, group_size=group, seed=seed, lr=1e-4,
                lr_rule="given", base_lr=1e-4, reference_batch=SYN_PROMPTS[0] * group,
                status="budget_exhausted", reason="synthetic", steps=s.size, samples=int(s[-1]),
                tokens=int(s[-1]) * 8, wall_s=0.0, gen_s=step_s[0] * s.size,
                train_s=step_s[1] * s.size, other_s=0.0, parallel_runs=1,
            )  # fmt: skip
            store.add_finished_run(rec, steps)


def run_synthetic_case(b_crit: float, group: int, seed: int = 0) -> CaseResult:
    import time

    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, int(min(b_crit, 2.0**62)), group])
    with tempfile.TemporaryDirectory() as tmp:
        _syn_store(Path(tmp), b_crit, group, rng)
        runs = load_run_data(ResultsStore(tmp))
    eff = analyse_runs(runs, metric="eval_reward", target=TARGET, tolerance=TOL)
    rec = recommend(eff, throughput_from_probe(eff.candidates, 0.0, {}))
    batches = np.array([p * group for p in SYN_PROMPTS], float)
    r = E_MIN * (1 + batches / b_crit)
    t = r * (GEN_T0 + TRAIN_T0 + (GEN_T1 + TRAIN_T1) * batches) / batches
    crossing = batches[0] * (1 + TOL) + TOL * b_crit
    name = f"Bc{b_crit:g}-G{group}" + (f"-s{seed}" if seed else "")
    return _result("synthetic", name, batches, r, t, rec, TOL, crossing, t0)
