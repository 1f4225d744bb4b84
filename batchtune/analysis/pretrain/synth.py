"""Loss curves from a known law with exactly computable B_min(L) and B_opt(L), for recovery tests.

The law (ours, chosen to have the shape Zhou et al. 2026, arXiv 2601.05034, describe for the stable
phase of WSD: a noise floor that falls with the batch, and a McCandlish steps-data trade-off):

    L(S; B)  = L_f(B) + (L0 - L_f(B)) / (1 + S r(B) / tau)        S in optimiser steps, B in tokens
    L_f(B)   = L_inf + sigma (B_ref / B)^alpha                    the loss floor at batch B
    r(B)     = B / (B + B_noise)                                  progress per step (McCandlish 2018)

so the steps to reach a target ``L`` are ``S(B) = tau (B + B_noise)/B * (L0 - L)/(L - L_f(B))``
and the tokens ``E(B) = B S(B)``. Below ``B_min(L) = B_ref (sigma / (L - L_inf))^(1/alpha)`` the
floor sits above the target and it is never reached; ``B_opt(L) = argmin_B E(B)`` is computed
numerically to 1e-10 relative. Both rise as the target falls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar


@dataclass(frozen=True)
class SynthLaw:
    """Parameters of the law above. Losses in nats/token, batches in tokens, ``tau`` in steps."""

    l0: float = 6.0
    l_inf: float = 2.0
    sigma: float = 1.0
    alpha: float = 0.5
    b_ref_tokens: float = 1024.0
    b_noise_tokens: float = 8192.0
    tau_steps: float = 200.0

    def floor(self, batch_tokens: object) -> np.ndarray:
        b = np.asarray(batch_tokens, dtype=float)
        return self.l_inf + self.sigma * (self.b_ref_tokens / b) ** self.alpha

    def loss(self, steps: object, batch_tokens: float) -> np.ndarray:
        s = np.asarray(steps, dtype=float)
        rate = batch_tokens / (batch_tokens + self.b_noise_tokens)
        lf = float(self.floor(batch_tokens))
        return lf + (self.l0 - lf) / (1.0 + s * rate / self.tau_steps)

    def steps_to(self, target: float, batch_tokens: object) -> np.ndarray:
        """Steps to reach ``target`` at each batch; inf where the floor is at or above it."""
        b = np.asarray(batch_tokens, dtype=float)
        gap = target - self.floor(b)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = self.tau_steps * (b + self.b_noise_tokens) / b * (self.l0 - target) / gap
        return np.where(gap > 0, s, np.inf)

    def b_min(self, target: float) -> float:
        return self.b_ref_tokens * (self.sigma / (target - self.l_inf)) ** (1.0 / self.alpha)

    def b_opt(self, target: float) -> float:
        lo = math.log(self.b_min(target))
        res = minimize_scalar(
            lambda u: math.log(math.exp(u) * float(self.steps_to(target, math.exp(u)))),
            bounds=(lo + 1e-9, lo + 12.0),
            method="bounded",
            options={"xatol": 1e-12},
        )
        return math.exp(float(res.x))


def synth_curves(
    law: SynthLaw,
    batches_tokens: object,
    seeds: object,
    *,
    max_tokens: float,
    points: int = 200,
    noise_rel: float = 0.0,
) -> list[tuple[float, int, np.ndarray, np.ndarray]]:
    """``(batch_tokens, seed, tokens, loss)`` per run: ``points`` log-spaced logs up to ``max_tokens``,
    the loss times ``exp(N(0, noise_rel))``, seeded by ``seed`` (shared across batches: paired)."""
    out = []
    for seed in np.atleast_1d(np.asarray(seeds, dtype=int)):
        rng = np.random.default_rng(int(seed))
        for b in np.atleast_1d(np.asarray(batches_tokens, dtype=float)):
            steps = np.unique(np.geomspace(1.0, max_tokens / b, points).round())
            loss = law.loss(steps, b) * np.exp(rng.normal(0.0, noise_rel, steps.size))
            out.append((float(b), int(seed), steps * b, loss))
    return out


@dataclass(frozen=True)
class ThreePhaseES:
    """Exact data of Zhou et al.'s stable-phase E(S) (docs/method.md §6) at one target loss:

        E(S) = b / (S - s_min) + a1 S + a0            S > s_min optimiser steps, E in tokens

    early it falls as the hyperbola, around S_opt = s_min + sqrt(b / a1) it is near its minimum
    E_min = 2 sqrt(b a1) + a1 s_min + a0, late it is the line a1 S + a0. A batch B trains E = B S
    tokens in S steps, so the steps to the target at B solve B S = E(S): a quadratic in S with one
    root past s_min for every B > a1 (with a0 >= 0), none below. So B_min = a1 exactly and
    B_opt = E_min / S_opt (the ray from the origin to the minimum of E(S))."""

    b: float
    s_min: float
    a1: float
    a0: float

    def steps_to(self, batch_tokens: object) -> np.ndarray:
        """Steps to the target at each batch; inf at or below B_min = a1."""
        bb = np.asarray(batch_tokens, dtype=float)
        d = bb - self.a1
        with np.errstate(divide="ignore", invalid="ignore"):
            k = d * self.s_min + self.a0
            disc = k * k - 4.0 * d * (self.a0 * self.s_min - self.b)
            s = (k + np.sqrt(np.maximum(disc, 0.0))) / (2.0 * d)
        return np.where(d > 0, s, np.inf)

    def b_min(self) -> float:
        return self.a1

    def s_opt(self) -> float:
        return self.s_min + math.sqrt(self.b / self.a1)

    def e_min(self) -> float:
        return 2.0 * math.sqrt(self.b * self.a1) + self.a1 * self.s_min + self.a0

    def b_opt(self) -> float:
        return self.e_min() / self.s_opt()
