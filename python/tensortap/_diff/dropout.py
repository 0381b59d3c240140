"""Whether a first divergence is dropout's: masks drawn differently on the two sides.

A port seeded once before its model is made draws the model's initial
weights from its own generator (or loads them: tensortap::load_params), so
its dropout masks come from another stream than the original's: the
`drop` activation differs at step 0 by most of its norm, and nothing said
why. A record whose exactly-zero elements are not the same set on both
sides, while the elements non-zero on both agree (within the floor, or the
tolerance without one), is two masks over one computation: the line says
`dropout masks differ (seed both sides after the model is made)`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .._base import RunError
from .dtype import coarser, judge
from .values import UNIT_ROUNDOFF, compare_quietly, is_float

if TYPE_CHECKING:
    from .compare import _Comparer

SAYS = "dropout masks differ (seed both sides after the model is made)"


def masks_differ(cmp: "_Comparer", pa: int) -> bool:
    """Whether A's record `pa` and its pair in B differ as two dropout masks
    over the same values do."""
    pb = int(cmp.align.match_b[pa])
    if pb < 0:
        return False
    _, _, dtype, shape, _ = cmp.a.meta(pa)
    _, _, dtype_b, shape_b, _ = cmp.b.meta(pb)
    if shape != shape_b or (dtype != dtype_b and coarser(dtype, dtype_b) is None):
        return False
    try:
        x, y = cmp.a.read(pa), cmp.b.read(pb)
        floors = cmp.floors.read(pa, x)[0] if cmp.floors is not None else []
    except RunError:
        return False
    x, y, floors, judged = judge(x, y, floors, dtype, dtype_b)
    dtype = judged or dtype
    if x.dtype.kind != "f" or x.dtype != y.dtype or not is_float(dtype):
        return False
    with np.errstate(all="ignore"):
        zero_a, zero_b = np.asarray(x) == 0, np.asarray(y) == 0
        if np.array_equal(zero_a, zero_b):
            return False
        both = ~zero_a & ~zero_b
        if not both.any():
            return False
        xs, ys = np.asarray(x)[both], np.asarray(y)[both]
        opts = cmp.opts
        st = compare_quietly(xs, ys, dtype, opts.rtol, opts.atol, None, full=False)
        if st.n_bad == 0:
            return True
        # Within the floor: the envelope of the floor runs, so within any one.
        u = UNIT_ROUNDOFF.get(dtype, math.nan)
        for x2 in floors:
            fl = compare_quietly(xs, ys, dtype, opts.rtol, opts.atol, np.asarray(x2)[both], full=True)
            if fl.noise(opts.factor, u):
                return True
    return False


__all__ = ["SAYS", "masks_differ"]
