"""Rank candidate batches by time-to-target ``T(B) = R(B) / Θ(B)`` (docs/method.md §1, §5).

``R``: samples (responses) consumed until the target is first reached, with a confidence interval
from the curve analysis; ``inf`` when the run never reached it (censored). ``Θ``: end-to-end
throughput in responses/s, treated as exact: its run-to-run spread (a few %) is small next to the
seed-to-seed spread of ``R`` (up to 2x on small RL tasks, docs/method.md §3.2).

Relative to a reference batch ``B0`` (usually the smallest):

    T(B)/T(B0) = (R(B)/R(B0)) / (Θ(B)/Θ(B0))

A larger batch wins only when its throughput grows faster than the samples it needs.

The order is by the **expected** time, not the point: with few seeds a candidate whose seeds
disagree (one or two much slower, as at the edge of stability) has a median that looks fast and
an interval skewed up. Each ``T`` is read as a split normal on the log scale, mode ``log T`` and
sigmas ``(down, up) / z`` from its interval, whose mean is ``log T + sqrt(2/pi) (up - down) / z``;
``expected_time_s`` is ``T`` times the exponential of that shift (``T`` itself for a symmetric
interval). An interval open above (some seeds, or a branched probe's branches, never reached the
target in their budget) gives no skew shift: how much slower is unknown, and counting it as never
would throw away candidates whose branch windows were merely short. Its point is then often a lower
bound (a branched probe's geometric mean holds a censored seed at the samples it reached), so it is
ranked at its point times ``1 + open_margin`` (the recipe's tolerance): a candidate that was not
measured to the target must beat a measured one by more than the tolerance to win (the cases behind
both rules: docs/analysis-system-efficiency.md). benchmarks/out/regret.txt checks it on ground truth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from scipy.stats import norm

from batchtune.errors import AnalysisError


@dataclass(frozen=True)
class RankedCandidate:
    """One candidate's time-to-target and its parts, relative to the reference.

    ``time_to_target_s = samples_to_target / responses_per_s`` (inf if censored). Ratios:
    ``sample_ratio = R/R_ref``, ``throughput_ratio = Θ/Θ_ref``, ``time_ratio = sample_ratio /
    throughput_ratio``. ``time_ratio_ci`` combines this candidate's and the reference's ``R``
    intervals as independent log-scale half-widths added in quadrature (exact ``Θ``).
    ``expected_time_s``: the time the ranking orders by, the point moved by the skew of its
    interval (module doc); the point times ``1 + open_margin`` if the interval is open above, inf
    if censored.
    """

    name: str
    batch_responses: float
    samples_to_target: float
    samples_ci: tuple[float, float]
    responses_per_s: float
    time_to_target_s: float
    time_ci_s: tuple[float, float]
    time_ratio: float
    time_ratio_ci: tuple[float, float]
    sample_ratio: float
    throughput_ratio: float
    rank: int
    is_reference: bool
    expected_time_s: float

    @property
    def censored(self) -> bool:
        """True when the run never reached the target."""
        return math.isinf(self.samples_to_target)


@dataclass(frozen=True)
class Ranking:
    """Candidates sorted by rank (1 = reaches the target soonest) and why the winner won."""

    candidates: tuple[RankedCandidate, ...]
    reference: str
    winner: str
    reason: str
    # how much faster than the winner another candidate could be at this evidence (regret_bound)
    regret_high: float = 1.0
    regret_against: str | None = None

    def expected_ratio(self, cand: RankedCandidate) -> float:
        """``cand``'s expected time over the reference's median time: the statistic the rank orders by."""
        return cand.expected_time_s / self.by_name(self.reference).time_to_target_s

    def by_name(self, name: str) -> RankedCandidate:
        for cand in self.candidates:
            if cand.name == name:
                return cand
        raise AnalysisError(f"no candidate named {name!r} in this ranking.")


def _column(name: str, values: object, n: int, *, allow_inf: bool = False) -> np.ndarray:
    arr = np.asarray(values, dtype=float).reshape(-1)
    if arr.size != n:
        raise AnalysisError(f"{name} has {arr.size} values for {n} candidates.")
    bad = np.isnan(arr) if allow_inf else ~np.isfinite(arr)
    if np.any(bad) or np.any(arr <= 0):
        what = "NaN or <= 0" if allow_inf else "NaN, inf or <= 0"
        raise AnalysisError(f"{name} has {what} values: {arr.tolist()}.")
    return arr


def _log_halfwidths(point: float, low: float, high: float) -> tuple[float, float]:
    """(down, up) on the log scale; inf where the bound is open."""
    if math.isinf(point):
        return math.inf, math.inf
    return math.log(point / low), (math.log(high / point) if math.isfinite(high) else math.inf)


def _ratio_ci(ratio: float, hw_num: tuple[float, float], hw_den: tuple[float, float]) -> tuple[float, float]:
    """CI of a finite ``num/den`` for independent estimates with (down, up) log half-widths."""
    down = math.hypot(hw_num[0], hw_den[1])
    up = math.hypot(hw_num[1], hw_den[0])
    return (ratio * math.exp(-down), ratio * math.exp(up))


def expected_time(
    time_s: float, halfwidths: tuple[float, float], confidence: float, open_margin: float = 0.0
) -> float:
    """Mean of the split normal on log T with mode log ``time_s`` and sigmas ``halfwidths / z``.

    ``halfwidths`` are (down, up) on the log scale of a ``confidence`` interval. Symmetric: the
    point itself. Open above (how much slower is unknown, module doc): the point times
    ``1 + open_margin``. Censored: inf.
    """
    down, up = halfwidths
    if not math.isfinite(time_s):
        return math.inf
    if not math.isfinite(up):
        return time_s * (1 + open_margin)
    z = float(norm.ppf((1 + confidence) / 2))
    return time_s * math.exp(math.sqrt(2 / math.pi) * (up - down) / z)


class _Columns(NamedTuple):  # the checked inputs, one value per candidate; ref: the reference's index
    names: list[str]
    batch: np.ndarray
    r: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    thr: np.ndarray
    ref: int


def _checked(names: Sequence[str], columns: Sequence[object], reference: str) -> _Columns:
    """The inputs as arrays, or an ``AnalysisError`` naming the first bad one."""
    names = [str(n) for n in names]
    n = len(names)
    if n == 0:
        raise AnalysisError("no candidates to rank.")
    if len(set(names)) != n:
        raise AnalysisError(f"candidate names must be unique, got {names}.")
    if reference not in names:
        raise AnalysisError(f"reference {reference!r} is not among the candidates {names}.")
    batch = _column("batch_responses", columns[0], n)
    r = _column("samples_to_target", columns[1], n, allow_inf=True)
    lo = _column("samples_ci_low", columns[2], n, allow_inf=True)
    hi = _column("samples_ci_high", columns[3], n, allow_inf=True)
    thr = _column("responses_per_s", columns[4], n)
    for i, name in enumerate(names):
        if not (lo[i] <= r[i] <= hi[i]) or math.isinf(lo[i]):
            raise AnalysisError(
                f"{name}: need finite ci_low <= samples_to_target <= ci_high, got "
                f"{lo[i]:g} <= {r[i]:g} <= {hi[i]:g}."
            )
    ref = names.index(reference)
    if math.isinf(r[ref]):
        raise AnalysisError(
            f"the reference {reference!r} never reached the target, so no ratio can be formed; "
            "choose a reference that reached it (usually the smallest batch) or lower the target."
        )
    return _Columns(names, batch, r, lo, hi, thr, ref)


def _row(
    c: _Columns, i: int, halfwidths: list[tuple[float, float]], confidence: float, open_margin: float
) -> dict[str, Any]:
    """Candidate ``i``'s fields of a ``RankedCandidate``, all but its rank."""
    sample_ratio = float(c.r[i] / c.r[c.ref])
    throughput_ratio = float(c.thr[i] / c.thr[c.ref])
    time_ratio = sample_ratio / throughput_ratio
    if i == c.ref:
        ratio_ci = (1.0, 1.0)
    elif math.isinf(c.r[i]):  # censored: only a lower bound, from the samples it consumed
        low = float(c.lo[i] / c.r[c.ref]) / throughput_ratio * math.exp(-halfwidths[c.ref][1])
        ratio_ci = (low, math.inf)
    else:
        ratio_ci = _ratio_ci(time_ratio, halfwidths[i], halfwidths[c.ref])
    return dict(
        name=c.names[i],
        batch_responses=float(c.batch[i]),
        samples_to_target=float(c.r[i]),
        samples_ci=(float(c.lo[i]), float(c.hi[i])),
        responses_per_s=float(c.thr[i]),
        time_to_target_s=float(c.r[i] / c.thr[i]),
        time_ci_s=(float(c.lo[i] / c.thr[i]), float(c.hi[i] / c.thr[i])),
        time_ratio=time_ratio,
        time_ratio_ci=ratio_ci,
        expected_time_s=expected_time(float(c.r[i] / c.thr[i]), halfwidths[i], confidence, open_margin),
        sample_ratio=sample_ratio,
        throughput_ratio=throughput_ratio,
        is_reference=i == c.ref,
    )


def _in_rank_order(rows: list[dict[str, Any]], tie_margin: float) -> tuple[RankedCandidate, ...]:
    """Expected time first, near-ties of the fastest by batch, censored last by their lower bound."""
    finite = [row["expected_time_s"] for row in rows if not math.isinf(row["samples_to_target"])]
    near = min(finite) * (1.0 + tie_margin) if finite else math.inf

    def order(row: dict[str, Any]) -> tuple:
        censored = math.isinf(row["samples_to_target"])
        t = row["time_ci_s"][0] if censored else row["expected_time_s"]
        if not censored and t <= near:  # a near-tie of the fastest: the smaller batch first
            return (False, 0, row["batch_responses"], t, row["name"])
        return (censored, 1, t, row["batch_responses"], row["name"])

    return tuple(RankedCandidate(rank=k + 1, **row) for k, row in enumerate(sorted(rows, key=order)))


def rank_time_to_target(
    names: Sequence[str],
    batch_responses: object,
    samples_to_target: object,
    samples_ci_low: object,
    samples_ci_high: object,
    responses_per_s: object,
    *,
    reference: str,
    confidence: float = 0.9,
    open_margin: float = 0.0,
    noun: str = "responses",
    tie_margin: float = 0.0,
    failed: Sequence[tuple[str, float]] = (),
) -> Ranking:
    """Rank candidates by expected ``T = R / Θ`` (module doc); censored candidates (``R = inf``) rank last.

    ``confidence`` is that of the ``samples_ci`` intervals; a candidate whose interval is open above
    ranks at its point times ``1 + open_margin`` (the recipe's tolerance, module doc). Ties go to
    the smaller batch (it costs less memory and probes faster), and so do near-ties: candidates whose
    expected time is within ``1 + tie_margin`` of the fastest expected time rank among themselves by
    batch, smallest first (throughput noise of a few % must not flip the pick). Censored candidates
    are ordered among themselves by the lower bound of their time (``ci_low / Θ``), the one that
    could still be fastest first. ``samples_ci_low`` of a censored run is the samples it consumed
    without reaching the target (a lower bound), its ``ci_high`` inf. ``noun``: what a sample is
    in the reason's words ("tokens" for pre-training); ``failed``: (name, batch) of candidates whose
    every run failed, named in the reason. The reference must have reached the target.
    """
    columns = (batch_responses, samples_to_target, samples_ci_low, samples_ci_high, responses_per_s)
    c = _checked(names, columns, reference)
    halfwidths = [_log_halfwidths(c.r[i], c.lo[i], c.hi[i]) for i in range(len(c.names))]
    rows = [_row(c, i, halfwidths, confidence, open_margin) for i in range(len(c.names))]
    ranked = _in_rank_order(rows, tie_margin)
    winner = ranked[0]
    if winner.censored:  # unreachable: the reference is finite; kept as an internal invariant
        raise AssertionError("a censored candidate ranked first")
    reason = _reason(ranked, winner, halfwidths, c.names, noun, tie_margin, failed)
    high, against = regret_bound(ranked, winner, halfwidths, c.names)
    return Ranking(ranked, reference, winner.name, reason, regret_high=high, regret_against=against)


def _vs_winner(
    cand: RankedCandidate, winner: RankedCandidate, halfwidths: list[tuple[float, float]], names: list[str]
) -> tuple[float, float, float]:
    """``T(cand) / T(winner)`` and its interval (both reached the target): what "within
    uncertainty" and the regret bound read."""
    vs = cand.time_to_target_s / winner.time_to_target_s
    low, high = _ratio_ci(vs, halfwidths[names.index(cand.name)], halfwidths[names.index(winner.name)])
    return vs, low, high


def regret_bound(
    ranked: Sequence[RankedCandidate],
    winner: RankedCandidate,
    halfwidths: list[tuple[float, float]],
    names: list[str],
) -> tuple[float, str | None]:
    """The largest ``T(winner) / T(c)`` over the other candidates ``c`` at the far end of its interval:
    how much faster than the winner a candidate could be at this evidence (1.0: none could), and
    which. Each comparison is the (1+c)/2 end of its own interval (``_ratio_ci``, as the reason's
    "within uncertainty"), not a simultaneous bound over candidates. A censored candidate counts at
    the lower bound of its time; an interval open above on the winner's side makes it inf (the
    winner could be any slower). A candidate with no interval (one seed) counts at its point."""
    hw_w = halfwidths[names.index(winner.name)]
    high, against = 1.0, None
    for cand in ranked:
        if cand.name == winner.name:
            continue
        if cand.censored:
            low = cand.time_ci_s[0] / winner.time_to_target_s * math.exp(-hw_w[1])
        else:
            low = _vs_winner(cand, winner, halfwidths, names)[1]
        could = 1.0 / low if low > 0 else math.inf
        if could > high:
            high, against = could, cand.name
    return high, against


def _ties(
    ranked: Sequence[RankedCandidate],
    winner: RankedCandidate,
    halfwidths: list[tuple[float, float]],
    names: list[str],
) -> list[tuple[RankedCandidate, float, float, float]]:
    """The candidates within uncertainty of the winner: ``(candidate, T/T_winner, low, high)`` for
    each other one that reached the target and whose interval of ``T/T_winner`` reaches 1 or below."""
    out = []
    for cand in ranked:
        if cand.name == winner.name or cand.censored:
            continue
        vs_winner, low, high = _vs_winner(cand, winner, halfwidths, names)
        if low <= 1.0:
            out.append((cand, vs_winner, low, high))
    return out


def within_uncertainty(ranking: Ranking) -> tuple[tuple[RankedCandidate, float, float, float], ...]:
    """The candidates the ranking's reason calls "within uncertainty" of its winner, as
    ``(candidate, T/T_winner, low, high)``, in rank order (``batchtune check`` reads the same set)."""
    ranked = ranking.candidates
    names = [c.name for c in ranked]
    halfwidths = [_log_halfwidths(c.samples_to_target, *c.samples_ci) for c in ranked]
    return tuple(_ties(ranked, ranking.by_name(ranking.winner), halfwidths, names))


def _reason(
    ranked: tuple[RankedCandidate, ...],
    winner: RankedCandidate,
    halfwidths: list[tuple[float, float]],
    names: list[str],
    noun: str = "responses",
    tie_margin: float = 0.0,
    failed: Sequence[tuple[str, float]] = (),
) -> str:
    """Why the winner won, in docs/method.md §1 terms: responses (``noun``) needed vs throughput,
    and, when the tie rule decided it, the quicker candidate that lost to a smaller batch."""
    if winner.is_reference:
        parts = [f"{winner.name} (the reference) reaches the target soonest."]
    else:
        parts = [
            f"{winner.name} reaches the target with {winner.sample_ratio:.2f}x the reference's {noun} at "
            f"{winner.throughput_ratio:.2f}x its throughput: {winner.time_ratio:.2f}x the time."
        ]
    above = [c for c in ranked if c.batch_responses > winner.batch_responses]
    larger = [c for c in above if not c.censored]
    if larger:
        next_batch = min(c.batch_responses for c in larger)
        best = min((c for c in larger if c.batch_responses == next_batch), key=lambda c: c.rank)
        parts.append(
            f"Larger batches ({best.name}) need {best.sample_ratio:.2f}x the {noun} for "
            f"{best.throughput_ratio:.2f}x the throughput: {best.time_ratio:.2f}x the time."
        )
    elif not winner.is_reference:  # the larger batches all censored or failed, or none measured
        done = "reached the target in" if above else "was measured in"
        bad = ", ".join(name for name, batch in failed if batch > winner.batch_responses)
        said = f"No larger batch {done} this sweep; a larger one may be faster still."
        if bad and not above:
            said = f"Every run of the larger batches measured ({bad}) failed, so none is ranked; one between "
            said += "them and the pick may be faster still."
        parts.append(said)

    ties = [
        f"{cand.name} ({vs_winner:.2f}x, CI {low:.2f}-{high:.2f})"
        for cand, vs_winner, low, high in _ties(ranked, winner, halfwidths, names)
    ]
    if ties:
        parts.append(f"Within uncertainty of {', '.join(ties)}.")
    reached = [c for c in ranked if not c.censored]
    fastest = min(reached, key=lambda c: (c.time_to_target_s, c.batch_responses))
    if fastest.name != winner.name:
        w = winner.time_to_target_s
        # which interval's skew decided it: the fastest one's, skewed slow, or the winner's, skewed fast
        if math.isinf(fastest.time_ci_s[1]):
            why = "its interval is open above (a seed or branch never reached the target in its budget)"
        elif fastest.expected_time_s > fastest.time_to_target_s:
            why = f"its seeds are skewed slow (up to {fastest.time_ci_s[1] / w:.2f}x)"
        else:
            why = f"the winner's seeds are skewed fast (down to {winner.time_ci_s[0] / w:.2f}x)"
        parts.append(
            f"{fastest.name} has the lowest median time ({fastest.time_to_target_s / w:.2f}x the "
            f"winner's) but {why}: its expected time is {fastest.expected_time_s / w:.2f}x the winner's "
            f"median, the winner's {winner.expected_time_s / w:.2f}x, so it ranks {fastest.rank}."
        )
    if censored := [c.name for c in ranked if c.censored]:
        parts.append(f"Never reached the target (ranked last): {', '.join(censored)}.")
    quicker = [c for c in ranked if not c.censored and c.expected_time_s < winner.expected_time_s]
    if quicker:
        q = min(quicker, key=lambda c: c.expected_time_s)
        parts.append(
            f"{q.name}'s expected time is {q.expected_time_s / winner.expected_time_s:.3f}x the winner's, "
            f"within the {tie_margin:.0%} tie margin: near-ties go to the smaller batch, so that noise in "
            "the throughput profile cannot flip the pick."
        )
    return " ".join(parts)
