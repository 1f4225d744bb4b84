"""More seeds where the async decision hinges (issue 30): the seed top-up of the async probe.

Why: a candidate near its stability edge (a large staleness k with reuse u) can look fast on a few
seeds that all agree, while its expected time is carried by rare large excursions that only more
seeds show (benchmarks/async_nqm_sequential.py: the 3-seed pick had regret 1.741 on such an NQM
instance). Seed disagreement cannot flag it; being close to the best can. And between close
contenders the seed noise of the estimate (sd 2-14% at 8 seeds on the NQM, as large as the gaps:
benchmarks/async_nqm_heldout.py) decides the pick unless more seeds are spent where they decide.

The rule, in rounds; each round estimates T (each candidate's best row of the joint ranking) from
the runs so far, then:

1. contenders: every candidate whose T is within a factor (1 + margin) of the best estimate and
   that was never asked for ``top`` seeds is topped up to ``top`` seeds;
2. else, sequential (while ``cap`` > ``top``): the leaders are the candidates within the margin;
   a leader c other than the best b is SEPARATED from it when the interval of T_c / T_b, the ratio
   on the full seeds minus z times its delete-a-group jackknife standard error, lies wholly
   above 1 - ``tol``: the paired seeds rule out that c is more than a share ``tol`` faster than b
   (so picking b costs at most about ``tol``). The seeds are split into ``GROUPS`` groups by their
   position in the shared seed list (the same seed ids for every candidate: paired), and group j's
   estimates T_c^-j, T_b^-j leave group j out. A ratio that is not finite is not separated. A
   candidate outside the margin that was never topped up is separated by the margin; one topped up
   before (``STICKY``) stays compared and leaves only when its interval separates it: the estimate
   of a candidate whose runs spread widely can fall far past the margin on a few seeds (a true best
   read 1.6x high on 16 seeds, benchmarks/async_nqm_miss_rounds.py), while its interval still
   covers the truth. z is ``z`` shared among the m leaders
   compared in the round (m distinct estimates besides the best's; candidates that share runs share
   one): the one-sided tail of ``z`` over m (Bonferroni, ``family_z``), so that several close
   leaders do not each get the tail's chance to look separated at once. When some leader is not
   separated, the best and those leaders are brought to the same seed count: the ones behind catch
   up to the most seeds among them, or, when all have it, all double it (8 -> 16 -> 32 -> 64),
   never past ``cap``.

The rounds end when no contender lacks seeds and every leader is separated or at the cap. A
candidate is never asked twice for the same seed count (a run that fails does not loop), so the
rounds end. A best T that is not finite (no candidate reached the target) names no contender.
Where the sequential rounds end is reported (``TopUpEnd``): the leaders still not separated from the
best at the cap, each with its interval, whose lower end bounds what picking the best estimate may
cost against it (1 / low). A near tie the seeds could not order is said, not hidden in the pick
(benchmarks/async_nqm_unresolved.py scores how often a miss is flagged so and the bound holds).

Constants: the default margin 0.3, ``Z`` 2.5, the family z and cap 64 (``MARGIN``, ``Z``,
``FAMILY``, ``MAX_SEEDS``) were chosen on 8 seed draws of held-out NQM instances by
benchmarks/async_nqm_seqtest.py (the fewest misses > 1.05 among the rules costing at most 8 seeds
everywhere), which scores them on
other draws of the reported instances and of a fresh set where nothing was chosen: max regret
<= 1.039 there on 14 draws each, against 1.061 and 1.200 for the rule shipped before (z 1.5 per
comparison, cap 32), at 1.6-2.2x the 3-seed probe's seed-runs against 1.3-1.5x. Not on the held-out
instances: two of them sit at the estimator's floor (its 512-seed limit puts the best and a
candidate 7-8% slower in truth within 3% of each other), a miss no seed rule avoids at a
reasonable cost (benchmarks/async_nqm_misses.py). ``TOL`` = 0.05 (the goal's own regret share) and
``GROUPS`` = 8 (leave-one-seed-out at 8 seeds) were set beforehand. ``STICKY`` came later, from the
real probe's held-out miss above (those constants chosen without it, unchanged); through the real
probe (benchmarks/async_nqm_realprobe.py) it is scored on every set.
The fixed rule alone (``cap`` <= ``top``) had its margin 0.1 (``FIXED_MARGIN``) chosen on the
held-out instances by benchmarks/async_nqm_sequential.py; the top of 8 seeds was set beforehand,
not chosen there.
Pure, no I/O: ``top_up`` takes the estimates, the evidence and the runner as functions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from batchtune.errors import AnalysisError
from batchtune.recipe.schema import BudgetConfig

# the recipe's defaults are the one home of these three (budget.async_top_up_*)
MARGIN = BudgetConfig.async_top_up_margin  # contenders: T within (1 + MARGIN) x the best estimate
FIXED_MARGIN = 0.1  # the margin chosen for the fixed rule alone (a cap <= the top)
TOP_SEEDS = BudgetConfig.async_top_up_seeds  # each contender's seeds after its first top-up
MAX_SEEDS = BudgetConfig.async_top_up_max_seeds  # the sequential rounds' cap; <= the top: none
Z = 2.5  # separated: T_c / T_b - z x its jackknife standard error above 1 - TOL (z: family_z of Z)
TOL = 0.05  # the regret share the paired seeds must rule out
FAMILY = True  # Z shared among the distinct leaders compared at once (Bonferroni: family_z)
GROUPS = 8  # delete-a-group jackknife over this many groups of the paired seeds
STICKY = True  # a topped-up candidate outside the margin is still compared by its interval

Estimate = Callable[[], tuple[Mapping[str, float], Mapping[str, int]]]
# evidence(labels): per label, its T with group j of the paired seeds left out, j = 0 .. GROUPS - 1
Evidence = Callable[[list[str]], Mapping[str, Sequence[float]]]


@dataclass(frozen=True)
class TopUp:
    """One candidate topped up in a round, and why."""

    label: str
    t: float  # its estimated T when it was chosen
    seeds_before: int
    ratio: float = math.nan  # sequential rounds: T / the best's T, and the interval's lower end
    low: float = math.nan


@dataclass(frozen=True)
class OpenLeader:
    """A leader the paired seeds had not separated from the best when the sequential rounds ended."""

    label: str
    ratio: float  # its estimated T / the best's
    low: float  # the lower end of that ratio's interval (family z): below 1, it may be the faster
    seeds: int


@dataclass(frozen=True)
class TopUpEnd:
    """Where the sequential rounds stopped: the best estimate, its seeds, how many other candidates
    were compared with it, and those its paired seeds did not separate from it at the cap (none:
    each compared leader's interval ruled out that it is more than ``tol`` faster)."""

    best: str
    seeds: int
    open: tuple[OpenLeader, ...] = ()
    tol: float = TOL
    compared: int = 0  # the other candidates compared in the last state (0: none within the margin)
    cap: int = 0  # budget.async_top_up_max_seeds

    def bound(self) -> float:
        """What picking the best estimate may cost against the compared leaders, by their intervals:
        the largest 1 / low (inf where a low is <= 0 or missing), 1 / (1 - tol) when every one is
        separated."""
        lows = [o.low for o in self.open]
        if any(not lo > 0 for lo in lows):
            return math.inf
        return max([1.0 / (1.0 - self.tol), *(1.0 / lo for lo in lows)])

    def _cost(self) -> str:
        b = self.bound()
        return "a cost these seeds do not bound" if math.isinf(b) else f"up to {b:.2f}x the best's time"

    def near_tie(self, pick: str) -> str:
        """Why ``pick`` rests on thin evidence when it is in a group the seeds left open ("": it is
        not, or nothing is open): the sentence of `recommend`'s weak-evidence panel."""
        group = [self.best, *(o.label for o in self.open)]
        if not self.open or pick not in group:
            return ""
        others = ", ".join(o.label for o in self.open)
        return (
            f"the seed top-up's paired seeds did not separate the best estimate {self.best} from "
            f"{others} at its cap ({self.cap or self.seeds} seeds): {pick} is in a near tie at this "
            f"probe's resolution (picking {self.best} may cost {self._cost()}, by their intervals; "
            "budget.async_top_up_max_seeds raises the cap)"
        )

    def words(self) -> str:
        """The end in one line for `recommend`."""
        if not self.open:
            if not self.compared:
                return f"the seed top-up ended with no other candidate within its margin of {self.best}"
            return (
                f"the seed top-up ended with each of the {self.compared} compared leader(s) separated from "
                f"the best estimate {self.best}: by their intervals, picking it costs at most "
                f"{1.0 / (1.0 - self.tol):.3f}x against them"
            )
        who = ", ".join(
            f"{o.label} ("
            + (
                f"T {o.ratio:.3f}x, interval from {o.low:.3f}"
                if math.isfinite(o.ratio) and math.isfinite(o.low)
                else "no interval: a group of its seeds has no T"
            )
            + f"; {o.seeds} seeds)"
            for o in self.open
        )
        return (
            f"NOT RESOLVED: at the seed cap ({self.cap or self.seeds}), the paired seeds did not separate "
            f"the best estimate {self.best} ({self.seeds} seeds) from {who}. These are a near tie at this "
            f"probe's resolution: picking {self.best} may cost {self._cost()}, by their intervals "
            "(budget.async_top_up_max_seeds raises the cap)"
        )


@dataclass(frozen=True)
class TopUpRound:
    best: str  # the best estimate's candidate in this round
    best_t: float
    topped: tuple[TopUp, ...]
    seeds: int = 0  # the seeds each topped candidate is brought to (0: a record before the field)
    kind: str = "contenders"  # or "sequential"

    def words(self, margin: float, top: int, tol: float = TOL) -> str:
        """The round in one line: who was topped up, from how many seeds, and why."""
        n = self.seeds or top
        if self.kind == "sequential":
            who = ", ".join(
                f"{t.label} ({t.seeds_before} -> {n} seeds"
                + ("" if math.isnan(t.ratio) else f"; T {t.ratio:.3f}x the best, interval from {t.low:.3f}")
                + ")"
                for t in self.topped
            )
            return (
                f"best estimate {self.best} at T {self.best_t:.4g} s; not separated from it (interval "
                f"of the T ratio not wholly above {1 - tol:.2f}), so they and the best get more seeds: {who}"
            )
        who = ", ".join(
            f"{t.label} (T {t.t:.4g} s, {t.t / self.best_t:.3f}x the best; {t.seeds_before} -> {n} seeds)"
            for t in self.topped
        )
        return f"best estimate {self.best} at T {self.best_t:.4g} s; within {margin:.0%} of it: {who}"


def contenders(
    t: Mapping[str, float],
    seeds: Mapping[str, int],
    *,
    margin: float = MARGIN,
    top: int = TOP_SEEDS,
    done: Sequence[str] = (),
) -> list[str]:
    """The candidates to top up now: T within (1 + margin) x the best, fewer than ``top`` seeds, and
    not topped up before (``done``), in the order of ``t``."""
    return [lab for lab in leaders(t, margin) if seeds.get(lab, 0) < top and lab not in done]


def leaders(t: Mapping[str, float], margin: float) -> list[str]:
    """The candidates whose T is within (1 + margin) x the best finite T, in the order of ``t``."""
    finite = [v for v in t.values() if math.isfinite(v)]
    if not finite:
        return []
    best = min(finite)
    return [lab for lab, v in t.items() if v <= (1.0 + margin) * best]


def compared(t: Mapping[str, float], margin: float, topped: Iterable[str], sticky: bool) -> list[str]:
    """The candidates a sequential round compares: the leaders and, when ``sticky``, every candidate
    topped up before (``topped``) with a finite T: it leaves by its interval, not by a noisy estimate
    past the margin (module docstring, 2.)."""
    lead = leaders(t, margin)
    if sticky:
        lead += [lab for lab in topped if lab not in lead and math.isfinite(t.get(lab, math.inf))]
    return lead


def ratio_interval(
    t_c: float, t_b: float, c_groups: Sequence[float], b_groups: Sequence[float], z: float
) -> tuple[float, float]:
    """(T_c / T_b, its lower end: minus ``z`` delete-a-group jackknife standard errors over the paired
    groups); (nan, nan) when a ratio is not finite."""
    r = t_c / t_b if t_b > 0 and math.isfinite(t_b) else math.nan
    parts = [
        c / b if b > 0 and math.isfinite(b) else math.nan for c, b in zip(c_groups, b_groups, strict=True)
    ]
    if not math.isfinite(r) or len(parts) < 2 or not all(math.isfinite(p) for p in parts):
        return math.nan, math.nan
    g = len(parts)
    mean = sum(parts) / g
    se = math.sqrt((g - 1) / g * sum((p - mean) ** 2 for p in parts))
    return r, r - z * se


@dataclass(frozen=True)
class SeqRule:
    """The sequential rounds' constants (module docstring)."""

    cap: int = MAX_SEEDS
    z: float = Z
    tol: float = TOL
    family: bool = FAMILY  # z for the family of leaders compared at once (Bonferroni: family_z)
    sticky: bool = STICKY  # a candidate once topped up leaves the comparison by its interval alone


def family_z(z: float, m: int) -> float:
    """The one-sided z whose tail is that of ``z`` shared among ``m`` comparisons (Bonferroni)."""
    nd = NormalDist()
    return nd.inv_cdf(1.0 - (1.0 - nd.cdf(z)) / max(1, m)) if m > 1 else z


def top_up(
    estimate: Estimate,
    run: Callable[[list[str], int], None],
    *,
    margin: float = MARGIN,
    top: int = TOP_SEEDS,
    seq: SeqRule | None = None,
    evidence: Evidence | None = None,
    asked: Mapping[str, int] | None = None,
    on_round: Callable[[TopUpRound], None] | None = None,
    on_end: Callable[[TopUpEnd], None] | None = None,
) -> list[TopUpRound]:
    """Run the rounds of the module docstring. ``estimate()``: (T per candidate, seeds per candidate)
    from the runs so far; ``run(labels, n)``: bring each of ``labels`` to ``n`` seeds; ``seq``: the
    sequential rounds (None or a cap <= ``top``: none); ``evidence``: their group estimates (needed
    when ``seq`` runs); ``asked``: the seeds each candidate was asked for earlier (a resumed probe's
    record); ``on_round``: called with each round before its runs start (so a probe can record it);
    ``on_end``: called once with where the sequential rounds stopped (not without them). Returns the
    rounds run here."""
    if not margin >= 0:  # inf: every candidate is a contender (top seeds everywhere)
        raise AnalysisError(f"the top-up margin must be a share >= 0, not {margin}")
    if seq is not None and seq.cap > top and evidence is None:
        raise AnalysisError("sequential top-up rounds need the paired seeds' evidence")
    rounds: list[TopUpRound] = []
    want = dict(asked or {})  # also: every candidate topped up so far (seq.sticky keeps them compared)
    while True:
        t, seeds = estimate()
        todo = [lab for lab in contenders(t, seeds, margin=margin, top=top) if want.get(lab, 0) < top]
        if todo:
            best = _best(t)
            rnd = TopUpRound(best, t[best], tuple(TopUp(lab, t[lab], seeds.get(lab, 0)) for lab in todo), top)
        elif seq is not None and seq.cap > top and evidence is not None:
            found = _sequential(t, seeds, want, margin, seq, evidence)
            if isinstance(found, TopUpEnd):
                if on_end is not None and found.best:  # "": no candidate reached the target
                    on_end(found)
                return rounds
            rnd = found
        else:
            return rounds
        rounds.append(rnd)
        if on_round is not None:
            on_round(rnd)
        labels = [u.label for u in rnd.topped]
        want.update(dict.fromkeys(labels, rnd.seeds))
        run(labels, rnd.seeds)


def _best(t: Mapping[str, float]) -> str:
    return min((lab for lab in t if math.isfinite(t[lab])), key=lambda lab: t[lab])


def _sequential(
    t: Mapping[str, float],
    seeds: Mapping[str, int],
    want: Mapping[str, int],
    margin: float,
    seq: SeqRule,
    evidence: Evidence,
) -> TopUpRound | TopUpEnd:
    """The next sequential round (module docstring, 2.), or where the rounds end: every leader
    separated or at the cap."""
    lead = compared(t, margin, want, seq.sticky)
    finite = [v for v in t.values() if math.isfinite(v)]
    best = _best(t) if finite else ""
    have = {lab: max(seeds.get(lab, 0), want.get(lab, 0)) for lab in {*lead, *([best] if best else [])}}
    n_other = len(lead) - (best in lead)
    end = TopUpEnd(best, have.get(best, 0), tol=seq.tol, compared=n_other, cap=seq.cap)
    if len(lead) < 2:
        return end
    groups = evidence(lead)
    why: dict[str, tuple[float, float]] = {}
    z = family_z(seq.z, len({t[lab] for lab in lead}) - 1) if seq.family else seq.z  # distinct estimates
    for lab in lead:
        if lab == best:
            continue
        r, low = ratio_interval(t[lab], t[best], groups[lab], groups[best], z)
        if not low > 1.0 - seq.tol:
            why[lab] = (r, low)
    group = [best, *why]
    level = max(have[lab] for lab in group)
    behind = [lab for lab in group if have[lab] < level]
    n = level if behind else min(seq.cap, 2 * level)
    todo = behind or [lab for lab in group if have[lab] < n]
    if not why or not todo:
        opened = tuple(OpenLeader(lab, r, low, have[lab]) for lab, (r, low) in why.items())
        return dataclasses.replace(end, open=opened)
    topped = tuple(TopUp(lab, t[lab], seeds.get(lab, 0), *why.get(lab, (math.nan, math.nan))) for lab in todo)
    return TopUpRound(best, t[best], topped, n, "sequential")


def best_times(rows: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Each candidate's least T over its rows ((label, T) pairs of a joint ranking)."""
    out: dict[str, float] = {}
    for lab, t in rows:
        out[lab] = min(out.get(lab, math.inf), t)
    return out
