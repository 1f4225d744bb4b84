"""Which token batches to add where B_opt sits between two grid points (issue 32 item 4, in part).

On a doubling grid the measured B_opt is only known to its bracket, the grid neighbours of the
measured minimum (analysis/pretrain/batch.py); the same estimator was within 1-3% of the known law
on a 2^(1/4) grid and within 15% in 13 of 55 cases on a doubling one (docs/pretraining.md). So the
refinement is: while the grid spacing on either side of the measured minimum is wider than
2^(1/4), add the geometric midpoints between the minimum and its neighbours (2^(1/2) steps on a
doubling grid, then 2^(1/4)), in whole sequences. This module says which batches to add; the
probe does not add them by itself (not built: rerun the probe with them in
``pretrain.batches_tokens``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

FINE_STEP = 2.0**0.25  # a grid this fine around B_opt needs no more points (module doc)


def batches_to_add(
    batches: Sequence[float], measured: float | None, seq_len: int = 1, fine_step: float = FINE_STEP
) -> tuple[int, ...]:
    """The batches (tokens, multiples of ``seq_len``) to add around ``measured``, the grid batch with
    the fewest tokens to target, among ``batches``: the geometric midpoint towards each neighbour
    whose ratio to it is wider than ``fine_step``; () when the grid is fine enough there, or when
    there is no measured minimum. A minimum at an end of the grid gets the midpoint on its inner
    side only (past the grid, the batch to add is the next doubling, which the bracket says)."""
    grid = sorted({float(b) for b in batches if b > 0})
    if measured is None or not math.isfinite(measured) or measured not in grid:
        return ()
    i = grid.index(measured)
    out: set[int] = set()
    for j in (i - 1, i + 1):
        if not 0 <= j < len(grid):
            continue
        lo, hi = sorted((grid[j], measured))
        if hi / lo <= fine_step * 1.01:  # 1%: batches rounded to whole sequences
            continue
        mid = round(math.sqrt(lo * hi) / seq_len) * seq_len
        if lo < mid < hi:
            out.add(int(mid))
    return tuple(sorted(out))


def refine_note(batches: Sequence[float], measured: float | None, seq_len: int = 1) -> str | None:
    """One line saying which batches to add to pin B_opt down, or None when none are needed."""
    add = batches_to_add(batches, measured, seq_len)
    if not add:
        return None
    listed = ", ".join(f"{b:,}" for b in add)
    return (
        f"B_opt lies between grid points: add batches {listed} tokens (geometric midpoints beside the "
        f"measured minimum {measured:,.0f}) and rerun; repeat until the spacing there is 2^(1/4)"
    )
