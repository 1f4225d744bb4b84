"""The noisy quadratic model backend (a simulation): determinism, real optimisation, the B^-1/2 law,
recovery of the exact expected dynamics, the known critical batch, divergence, simulated generation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from batchtune import backends
from batchtune.analysis.sample.curves import samples_to_target
from batchtune.analysis.sample.lr import scaled_lr
from batchtune.analysis.system.knee import find_knee
from batchtune.backends.nqm import (
    NQMBackend,
    SampleStream,
    SimulatedGeneration,
    curvatures,
    expected_samples_to_target,
    expected_sgd_losses,
    initial_theta,
    nqm_b_simple,
    nqm_critical_batch,
    nqm_critical_batch_for_recipe,
    nqm_loss,
    nqm_minibatch_gradient,
)
from batchtune.backends.spec import Candidate, GenRequest, OutOfMemory, RunFailed, RunSpec
from batchtune.errors import AnalysisError
from batchtune.recipe.load import load_recipe, recipe_from_dict
from batchtune.recipe.schema import NQMConfig

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "nqm.toml"


def _recipe(**sections):
    data = {
        "backend": {"training": "nqm"},
        "generation": {"backend": "simulated"},
        "optimizer": {"name": "sgd", "lr": 0.03, "grad_clip": 0.0},
        "lr_scaling": {"rule": "linear"},
        "candidates": {"prompts": [1], "group_size": 8},
        "target": {"metric": "loss", "value": 1.0, "higher_is_better": False},
        "budget": {"max_samples": 2048, "seeds": [0]},
        "nqm": {"dim": 200, "noise_scale": 10.0},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return recipe_from_dict(data)


def _spec(recipe, prompts=1, group=8, lr=None, seed=0, ref=8, label=None):
    lr = recipe.optimizer.lr if lr is None else lr
    cand = Candidate(label or f"P{prompts}xG{group}", prompts, group, lr, recipe.lr_scaling.rule)
    return RunSpec(f"{cand.label}-s{seed}", cand, seed, recipe, Path("."), recipe.optimizer.lr, ref)


def _run(spec):
    return list(NQMBackend().train(spec))


# ---- records and determinism -----------------------------------------------------------------------


def test_registered_like_any_backend():
    assert backends.load("training", "nqm") is NQMBackend
    assert backends.load("generation", "simulated") is SimulatedGeneration


def test_same_seed_same_run_other_seed_other_run():
    recipe = _recipe()
    a, b = _run(_spec(recipe, seed=3)), _run(_spec(recipe, seed=3))
    c = _run(_spec(recipe, seed=4))
    assert a == b
    assert [s.metrics["loss"] for s in a] != [s.metrics["loss"] for s in c]


def test_step_records_say_what_is_simulated():
    recipe = _recipe(budget={"max_samples": 100})
    steps = _run(_spec(recipe, prompts=2, group=8))
    cfg, n = recipe.nqm, 16
    assert [s.samples for s in steps] == [16 * (i + 1) for i in range(7)]  # stops once >= budget
    last = steps[-1]
    assert set(last.metrics) == {"loss", "sim_train_loss", "sim_b_simple"}
    assert last.tokens == last.samples * recipe.generation.max_new_tokens
    assert last.gen_s == pytest.approx((cfg.gen_t0_s + cfg.gen_t1_s * n) * recipe.generation.max_new_tokens)
    assert last.train_s == pytest.approx(cfg.train_t0_s + cfg.train_t1_s * n)
    assert (last.prompts, last.group_size, last.lr) == (2, 8, 0.03)


def test_same_seed_shares_one_sample_stream_across_batches():
    """A batch of 2B holds exactly the samples of two consecutive batches of B (any order of reads)."""
    s1, s2 = SampleStream(7, 50), SampleStream(7, 50)
    pairs = [s1.batch_sum(i, i + 8) for i in range(0, 64, 8)]
    whole = [s2.batch_sum(i, i + 16) for i in range(0, 64, 16)]
    np.testing.assert_allclose(np.add(pairs[0::2], pairs[1::2]), whole, atol=1e-12)
    np.testing.assert_allclose(SampleStream(7, 50).batch_sum(24, 40), pairs[3] + pairs[4], atol=1e-12)
    draws = np.array([SampleStream(1, 2000).batch_sum(0, 24), SampleStream(1, 2000).batch_sum(24, 48)])
    assert draws.var(axis=1) == pytest.approx([24, 24], rel=0.1)  # Var = samples per coordinate
    assert abs(np.corrcoef(draws)[0, 1]) < 0.1  # disjoint batches are independent


# ---- optimisation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "lr"), [("sgd", 0.03), ("adam", 0.01), ("adamw", 0.01)])
def test_loss_decreases(name, lr):
    recipe = _recipe(optimizer={"name": name, "lr": lr}, budget={"max_samples": 4096})
    steps = _run(_spec(recipe))
    loss0 = nqm_loss(recipe.nqm, initial_theta(recipe.nqm))
    assert np.mean([s.metrics["loss"] for s in steps[-20:]]) < 0.5 * loss0


def test_mean_loss_recovers_the_exact_expected_dynamics():
    """Averaged over seeds, the simulated loss follows E[L_t] from the closed-form recursion."""
    recipe = _recipe(budget={"max_samples": 8 * 300})
    runs = np.array([[s.metrics["loss"] for s in _run(_spec(recipe, seed=k))] for k in range(16)])
    expected = expected_sgd_losses(recipe.nqm, np.full(300, 0.03), 8)
    for t in (10, 100, 299):
        assert runs[:, t].mean() == pytest.approx(expected[t], rel=0.03)


def test_sim_train_loss_is_an_unbiased_minibatch_estimate():
    recipe = _recipe(budget={"max_samples": 8 * 400})
    steps = _run(_spec(recipe))
    gap = [s.metrics["sim_train_loss"] - s.metrics["loss"] for s in steps]  # noisy, centred near 0
    assert abs(np.mean(gap)) < 4 * np.std(gap) / math.sqrt(len(gap)) + 0.2


def test_grad_clip_clips_but_logs_the_pre_clip_norm():
    clipped = _run(_spec(_recipe(optimizer={"grad_clip": 0.5}, budget={"max_samples": 80})))
    free = _run(_spec(_recipe(budget={"max_samples": 80})))  # grad_clip = 0: no clipping
    assert clipped[0].grad_norm == free[0].grad_norm > 0.5  # same theta_0, same samples: pre-clip
    assert clipped[-1].metrics["loss"] > free[-1].metrics["loss"]  # clipped steps move less


def test_absurd_sgd_lr_diverges():
    recipe = _recipe()
    with pytest.raises(RunFailed) as err:
        _run(_spec(recipe, lr=5.0))  # > 2 / h_max = 2
    assert err.value.status == "diverged"
    assert "2/h_max" in err.value.message


# ---- gradient noise ---------------------------------------------------------------------------------


def test_grad_norm_falls_like_b_to_the_minus_half_when_noise_dominates():
    cfg = NQMConfig(dim=500, noise_scale=1000.0)  # B_simple ~ 4.5e3 at theta_0: noise dominates
    theta = initial_theta(cfg)
    rng = np.random.default_rng(0)
    batches = np.array([1, 2, 4, 8, 16, 32, 64])
    norms = [
        np.mean([np.linalg.norm(nqm_minibatch_gradient(cfg, theta, b, rng)) for _ in range(50)])
        for b in batches
    ]
    slope = np.polyfit(np.log(batches), np.log(norms), 1)[0]
    assert slope == pytest.approx(-0.5, abs=0.03)
    assert nqm_b_simple(cfg, theta) > 50 * batches[-1]


def test_two_batch_estimate_recovers_b_simple():
    """E|g_B|^2 = |G|^2 + tr(C)/B (McCandlish et al. 2018), so two batches recover B_simple."""
    cfg = NQMConfig(dim=300, noise_scale=20.0)
    theta = initial_theta(cfg) * 0.5
    rng = np.random.default_rng(1)
    small, big = 4, 256
    gs = np.mean([np.sum(nqm_minibatch_gradient(cfg, theta, small, rng) ** 2) for _ in range(2000)])
    gb = np.mean([np.sum(nqm_minibatch_gradient(cfg, theta, big, rng) ** 2) for _ in range(2000)])
    g2 = (big * gb - small * gs) / (big - small)
    trace = (gs - gb) / (1 / small - 1 / big)
    assert trace / g2 == pytest.approx(nqm_b_simple(cfg, theta), rel=0.1)


# ---- the known critical batch ----------------------------------------------------------------------


def test_shipped_recipe_probe_recovers_the_analytic_critical_batch():
    """R(B)/R(B0) <= 1.1 below the analytic critical batch, > 1.1 above it, divergence past 2/h_max."""
    recipe = load_recipe(RECIPE)
    b_crit = nqm_critical_batch_for_recipe(recipe)
    assert 256 < b_crit < 512
    t = recipe.target
    r_median = {}
    for n in (8, 64, 256, 512, 1024):
        lr = scaled_lr(recipe.optimizer.lr, n, 8, recipe.lr_scaling.rule)
        rs = []
        for seed in recipe.budget.seeds:
            spec = _spec(recipe, prompts=n // 8, lr=lr, seed=seed)
            samples, loss = [], []
            try:
                for step in NQMBackend().train(spec):
                    samples.append(step.samples)
                    loss.append(step.metrics["loss"])
                    if step.metrics["loss"] < 0.8 * t.value:
                        break
            except RunFailed as exc:
                assert exc.status == "diverged"
                rs.append(math.nan)
                continue
            cross = samples_to_target(samples, loss, t.value, higher_is_better=False, ema_alpha=t.ema_alpha)
            rs.append(math.inf if cross.censored else cross.samples_to_target)
        r_median[n] = float(np.median(rs))
    ratio = {n: r / r_median[8] for n, r in r_median.items()}
    assert all(ratio[n] <= 1 + t.tolerance for n in (64, 256))  # below the analytic critical batch
    assert ratio[512] > 1 + t.tolerance  # above it
    assert math.isnan(ratio[1024])  # lr 3.84 > 2/h_max: diverged


def test_critical_batch_sits_where_the_expected_ratio_crosses_the_tolerance():
    cfg = NQMConfig(dim=300, noise_scale=10.0)
    kw = dict(target_loss=1.0, base_lr=0.03, reference_batch=8, warmup_samples=0)
    b = nqm_critical_batch(cfg, rule="linear", tolerance=0.1, **kw)

    def ratio(batch):
        lr = scaled_lr(0.03, batch, 8, "linear")
        r = expected_samples_to_target(
            cfg, lr=lr, batch=round(batch), target_loss=1.0, warmup_samples=0, max_samples=1e9
        )
        r0 = expected_samples_to_target(
            cfg, lr=0.03, batch=8, target_loss=1.0, warmup_samples=0, max_samples=1e9
        )
        return r / r0

    assert ratio(b) <= 1.1 < ratio(b * 1.02)
    assert b * 0.03 / 8 < 2.0  # below the stability limit alpha h_max = 2
    halved = nqm_critical_batch(cfg, rule="linear", tolerance=0.1, **{**kw, "base_lr": 0.015})
    assert halved > 1.5 * b  # half the LR per sample: the curvature limit arrives at a larger batch


def test_critical_batch_refuses_what_it_cannot_know():
    with pytest.raises(AnalysisError, match="sgd"):
        nqm_critical_batch_for_recipe(_recipe(optimizer={"name": "adamw"}))
    with pytest.raises(AnalysisError, match="never reaches"):
        nqm_critical_batch(
            NQMConfig(dim=100, noise_scale=10.0),
            target_loss=1e-3,
            base_lr=0.03,
            reference_batch=8,
            rule="linear",
            tolerance=0.1,
            warmup_samples=0,
        )


def test_expected_samples_to_target_handles_warmup_and_instability():
    cfg = NQMConfig(dim=200, noise_scale=10.0)
    kw = dict(batch=8, target_loss=1.0, max_samples=1e9)
    plain = expected_samples_to_target(cfg, lr=0.03, warmup_samples=0, **kw)
    warm = expected_samples_to_target(cfg, lr=0.03, warmup_samples=2000, **kw)
    assert plain < warm < plain + 2000
    assert expected_samples_to_target(cfg, lr=2.5, warmup_samples=0, **kw) == math.inf
    assert 0.5 * np.dot(curvatures(cfg), np.ones(200)) == pytest.approx(nqm_loss(cfg, initial_theta(cfg)))


# ---- simulated generation ---------------------------------------------------------------------------


def _gen(mode, c, max_new=64, seed=0, **gen):
    recipe = _recipe(generation={"eos_stop_prob": 0.05, **gen})
    return SimulatedGeneration(recipe).generate(GenRequest(c, 8, 32, max_new, mode, seed=seed))


def test_simulated_throughput_saturates_with_a_knee():
    cs = [8, 16, 32, 64, 128, 256, 512, 1024]
    thr = [c / _gen("fixed", c).elapsed_s for c in cs]
    assert all(b > a for a, b in zip(thr, thr[1:], strict=False))
    knee = find_knee(cs, thr, threshold=0.1)
    assert knee.saturated and 64 <= knee.concurrency <= 512


def test_eos_mode_waits_for_the_longest_response():
    fixed, eos = _gen("fixed", 256), _gen("eos", 256)
    assert eos.output_tokens < fixed.output_tokens
    assert eos.output_tokens / eos.elapsed_s < fixed.output_tokens / fixed.elapsed_s  # tokens/s: worse
    mean_len = round(eos.output_tokens / eos.responses)
    same_mean = _gen("fixed", 256, max_new=mean_len)  # a fixed sweep at the same mean length flatters
    assert eos.responses / eos.elapsed_s < same_mean.responses / same_mean.elapsed_s
    assert _gen("eos", 256, seed=5) == _gen("eos", 256, seed=5)


def test_simulated_generation_model_memory_and_train_time():
    gen = SimulatedGeneration(_recipe(nqm={"gen_max_concurrency": 128}))
    assert "simulated" in gen.model_info().name
    with pytest.raises(OutOfMemory):
        gen.generate(GenRequest(256, 8, 32, 64, "fixed"))
    small, large = (gen.generate(GenRequest(c, 8, 32, 64, "fixed")).peak_mem_bytes for c in (8, 128))
    assert large > small > 0
    assert gen.train_step_s(64, 96) == pytest.approx(0.05 + 0.001 * 64)


def test_staleness_and_updates_per_batch_change_the_dynamics_and_k0_u1_is_unchanged():
    """backends/nqm_async.py's dynamics run for real: the gradient at the weights of k updates ago,
    each batch's noise reused by u updates; k = 0, u = 1 is the on-policy run, record for record."""
    import dataclasses

    recipe = _recipe()
    base = _spec(recipe)
    plain = _run(base)

    def at(k: int, u: int):
        cand = dataclasses.replace(base.candidate, staleness=k, updates_per_batch=u)
        return _run(dataclasses.replace(base, candidate=cand))

    assert at(0, 1) == plain
    stale, reused = at(2, 1), at(0, 2)
    # the first update sees the same gradient (the history starts at theta_0); later ones do not
    assert stale[0].metrics["loss"] == plain[0].metrics["loss"]
    assert stale[2].metrics["loss"] != plain[2].metrics["loss"]
    assert reused[0].metrics["loss"] != plain[0].metrics["loss"]
    assert reused[0].train_s == 2 * plain[0].train_s and len(reused) == len(plain)
