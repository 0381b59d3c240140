"""A block of a pair compared: the tolerance check, the exact path for
integers and identical bytes, the norms and the floor's sums."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import numpy as np

from .sums import PairStats, _dot, _finite_sumsq, _narrow_sumsq, _sumsq, max_ulps

if TYPE_CHECKING:
    from .values import _Buffers


class _Check:
    """The lowered threshold of `check`: an element is a candidate when
    |a-b| >= max(rtol'*|a| + atol', tiny) in the working precision, where
    rtol' and atol' are rtol and atol lowered by a relative margin far above
    that precision's rounding (2^-16 for float32) and by three of its
    smallest subnormals (the absolute error of a subnormal result), and
    tiny is its smallest subnormal (a difference of 0 is never a candidate).
    Every element beyond tolerance is a candidate; the candidates are then
    judged exactly."""

    def __init__(self, work: np.dtype, rtol: float, atol: float) -> None:
        info = np.finfo(work)
        margin = 1.0 - 2.0 ** -16 if work.itemsize == 4 else 1.0 - 2.0 ** -45
        sub = float(info.smallest_subnormal)
        self.exact_zero = rtol == 0.0 and atol == 0.0
        # Each lowered constant is rounded down into the working dtype.
        self.rtol = _round_down(rtol * margin, work)
        self.atol = _round_down(atol * margin - 3 * sub, work)
        self.tiny = work.type(sub)


def _round_down(v: float, dtype: np.dtype) -> np.generic:
    r = dtype.type(v)
    if float(r) > v:
        r = np.nextafter(r, dtype.type(-np.inf))
    return r


def _check_block(x: np.ndarray, y: np.ndarray, buf: _Buffers, check: _Check, dtype: str, rtol: float, atol: float,
                 complex_: bool) -> int:
    """The number of elements of one block beyond tolerance (complex: of
    elements with a part beyond), exactly."""
    m = x.size
    if x.dtype != buf.nd.dtype:  # float16, widened exactly
        np.copyto(buf.na[:m], x)
        np.copyto(buf.nb[:m], y)
        x, y = buf.na[:m], buf.nb[:m]
    d = buf.nd[:m]
    np.subtract(x, y, out=d)
    np.abs(d, out=d)
    if not math.isfinite(float(d.max())):
        # A NaN or an infinity, or a difference that overflowed: exactly.
        return _bad_elements(np.flatnonzero(_exact(x, y, dtype, rtol, atol, None, complex_)), complex_)
    if check.exact_zero:
        # a - b is 0 exactly when a == b (subnormals kept: NumPy never flushes them).
        if not complex_:
            return int(np.count_nonzero(d))
        return _bad_elements(np.flatnonzero(d), complex_)
    t = buf.nt[:m]
    np.abs(x, out=t)
    np.multiply(t, check.rtol, out=t)
    np.add(t, check.atol, out=t)
    np.maximum(t, check.tiny, out=t)
    mask = buf.mask[:m]
    np.greater_equal(d, t, out=mask)
    if not mask.any():
        return 0
    cand = np.flatnonzero(mask)
    # The candidates judged exactly, in float64, as the rules say.
    xa, yb = x[cand].astype(np.float64), y[cand].astype(np.float64)
    return _bad_elements(cand[np.abs(xa - yb) > atol + rtol * np.abs(xa)], complex_)


def _bad_elements(parts: np.ndarray, complex_: bool) -> int:
    """The number of elements among bad positions (a complex's two parts one element)."""
    if not complex_:
        return int(parts.size)
    return int(np.unique(parts // 2).size)


def _exact(x: np.ndarray, y: np.ndarray, dtype: str, rtol: float, atol: float, st: Optional[PairStats],
           complex_: bool) -> np.ndarray:
    """The rules on one block, in float64, whatever it holds: returns the bad
    mask; with `st`, adds the block's statistics (max_abs, max_rel, max_ulp,
    the norms over the elements finite in both, and whether a non-finite
    value disagrees)."""
    a64, b64 = x.astype(np.float64), y.astype(np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)
    both = fa & fb
    same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))  # -0 and +0, infinities of one sign, NaN with NaN
    diff = np.abs(np.where(both, a64, 0.0) - np.where(both, b64, 0.0))
    absa = np.abs(a64)
    thr = atol + rtol * absa
    bad = ~same & (~both | (diff > thr))
    over = both & np.isinf(diff)  # finite values whose difference overflows float64
    if over.any():
        # Halved, exactly for such large numbers: |a/2 - b/2| against the threshold halved.
        half = np.abs(a64[over] * 0.5 - b64[over] * 0.5)
        bad[over] = half > atol * 0.5 + rtol * (absa[over] * 0.5)
    if st is None:
        return bad
    nonfinite = bool((bad & ~both).any())
    if nonfinite:
        st.nonfinite = True
        st.max_abs = st.max_rel = st.max_ulp = math.inf
    if both.any():
        fin_d = diff[both]
        st.max_abs = max(st.max_abs, float(fin_d.max()))
        rel = np.divide(diff, absa, out=np.zeros_like(diff), where=both & (absa > 0))
        if over.any():
            rel[over] = np.abs(a64[over] * 0.5 - b64[over] * 0.5) / (absa[over] * 0.5)
        st.max_rel = max(st.max_rel, float(rel.max()))
        if bool((both & (absa == 0) & (diff > 0)).any()):
            st.max_rel = math.inf
        bad_fin = bad & both
        if bad_fin.any():
            st.max_ulp = max(st.max_ulp, float(max_ulps(x[bad_fin], y[bad_fin], dtype)))
        # Norms over the elements finite in both; the difference halved
        # where it overflowed, then scaled back into the sum.
        native64 = x.dtype == np.float64
        ab_, bb_ = a64[both], b64[both]
        _add_norms(st, ab_, bb_, None, native64)
        dd = np.where(over[both], 0.0, diff[both])
        st.dd.add(*_sumsq(dd, native64))
        if over.any():
            half = np.abs(a64[over] * 0.5 - b64[over] * 0.5)
            s, e = _sumsq(half, True)
            st.dd.add(s, e + 2)
    return bad


def _add_norms(st: PairStats, a64: np.ndarray, b64: np.ndarray, d64: Optional[np.ndarray], native64: bool) -> None:
    sa, ea = _sumsq(a64, native64)
    sb, eb = _sumsq(b64, native64)
    st.aa.add(sa, ea)
    st.bb.add(sb, eb)
    ds, de = _dot(a64, b64, ea // 2, eb // 2)
    st.ab.add(ds, de)
    if d64 is not None:
        st.dd.add(*_sumsq(d64, native64))


def _full_block(x: np.ndarray, y: np.ndarray, buf: _Buffers, dtype: str, rtol: float, atol: float, native64: bool,
                st: PairStats, complex_: bool) -> None:
    """Every statistic of one block, in float64."""
    m = x.size
    if native64:
        a64, b64 = x, y
    else:
        a64, b64 = buf.a[:m], buf.b[:m]
        np.copyto(a64, x)
        np.copyto(b64, y)
    d = buf.d[:m]
    np.subtract(a64, b64, out=d)
    np.abs(d, out=d)
    dmax = float(d.max())
    if not math.isfinite(dmax):
        bad = _exact(x, y, dtype, rtol, atol, st, complex_)
        st.n_bad += _bad_elements(np.flatnonzero(bad), complex_)
        return
    _add_norms(st, a64, b64, d, native64)
    st.max_abs = max(st.max_abs, dmax)
    absa = buf.t[:m]
    np.abs(a64, out=absa)
    mask = buf.mask[:m]
    if rtol == 0.0 and atol == 0.0:
        np.greater(d, 0.0, out=mask)
    else:
        thr = buf.a[:m]  # A's values are not needed past |a|
        np.multiply(absa, rtol, out=thr)
        if atol:
            np.add(thr, atol, out=thr)
        np.greater(d, thr, out=mask)
    # max |a-b| / |a|: x/0 is inf (a 0 in A against a non-zero in B), 0/0 is NaN (equal zeros), left out.
    np.divide(d, absa, out=absa)
    rmax = float(absa.max())
    if math.isnan(rmax):
        rmax = float(np.fmax.reduce(absa))
        rmax = 0.0 if math.isnan(rmax) else rmax
    st.max_rel = max(st.max_rel, rmax)
    if mask.any():
        bad = np.flatnonzero(mask)
        st.n_bad += _bad_elements(bad, complex_)
        if bad.size == m:
            st.max_ulp = max(st.max_ulp, float(max_ulps(x, y, dtype)))
        else:
            st.max_ulp = max(st.max_ulp, float(max_ulps(x[bad], y[bad], dtype)))


def _floor_block(x: np.ndarray, x2: Optional[np.ndarray], buf: _Buffers, native64: bool, st: PairStats,
                 add_a: bool, equal_b: bool) -> None:
    """||a||^2 when `add_a` (and ||b||^2, a.b: `equal_b`, B equal to A bit
    for bit), and ||a - a2||^2 with A2, of one block.

    What the floor's rule and findings need is a norm to a few digits (a
    factor of 10, thresholds of 1e-3 and 0.1): below float64, the sums are
    float32 dot products (relative error under 1e-4 for a block), redone in
    float64 where they overflowed, came out tiny, or met a NaN."""
    m = x.size
    narrow = not native64
    if narrow and x.dtype != buf.nd.dtype:  # float16, widened exactly
        np.copyto(buf.na[:m], x)
        x = buf.na[:m]
        if x2 is not None:
            np.copyto(buf.nb[:m], x2)
            x2 = buf.nb[:m]
    if add_a:
        s, e = _narrow_sumsq(x) if narrow else _finite_sumsq(x, True)
        st.aa.add(s, e)
        if equal_b:
            st.bb.add(s, e)
            st.ab.add(s, e)
    if x2 is None:
        return
    d = buf.nd[:m] if narrow else buf.d[:m]
    np.subtract(x, x2, out=d)
    s, e = _narrow_sumsq(d, finite=False) if narrow else _sumsq(d, True)
    if math.isfinite(s):
        st.d2.add(s, e)
        return
    # A NaN or an infinity (or an overflow): A and A2 by the rules, the
    # difference of their finite elements summed.
    a64, b64 = x.astype(np.float64), x2.astype(np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)
    both = fa & fb
    same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
    if bool((~same & ~both).any()):
        st.floor_nonfinite = True
    if both.any():
        pa, pb = a64[both], b64[both]
        diff = pa - pb
        over = np.isinf(diff)
        if over.any():
            s, e = _sumsq(pa[over] * 0.5 - pb[over] * 0.5, True)
            st.d2.add(s, e + 2)
            diff = diff[~over]
        st.d2.add(*_sumsq(diff, native64))
