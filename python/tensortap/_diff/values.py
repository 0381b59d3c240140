"""One aligned pair of records compared element by element (the rules are
tensortap/_diff.py's), with a third record, A2, for the noise floor.

How it is fast (a port check's runs are GiBs, every element differing): the arrays are walked in blocks of BLOCK
elements whose temporaries stay in a core's cache, through buffers made
once per comparison.

- `check` (what the command needs of a pair that may be equal) works in
  the values' own precision, float32 as float32, with a threshold lowered
  by a margin that covers float32's rounding; the few elements past it are
  judged again exactly, in float64, as the rules say.
- `full` (every statistic) converts each block to float64 once; the ULPs
  are counted only on the elements beyond tolerance.
- A block holding a NaN, an infinity, or a difference that overflows takes
  the exact path of its own (`_exact`); the others never look for them.
- Norms and the cosine are scaled sums: each block's sums of squares are
  kept as (sum, power of two), so that nothing overflows at 1e200 nor
  vanishes at 1e-200. Only float64 blocks can need the scaling (a float32's
  square is far inside float64's range), and only those whose sums came out
  infinite or tiny are summed again, scaled.
- The noise floor's sums below float64 are float32 dot products, redone in
  float64 where they overflowed, came out tiny or met a NaN: the floor is a
  norm to a few digits against a factor of 10.
- Integers are differenced as integers (uint64 differences), exact above
  2^53.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np

from .sums import PairStats, _int_abs_diff, _int_magnitude, _sumsq, _vdot, max_ulps, ulp_distance, ulp_keys  # noqa: F401
from .blocks import _Check, _check_block, _floor_block, _full_block

# Elements compared at once. 32 Ki elements: the float64 buffers of a block
# (256 KiB each) stay in the L2 cache of this project's machines, and the
# Python work per block is a small part of its time (bench/bench_diff_scale.py).
BLOCK = 1 << 15

# The unit roundoff u of each floating dtype (half an ulp of 1): the noise
# floor's allowance for records the perturbation does not reach is 4*u*||a||.
UNIT_ROUNDOFF: Dict[str, float] = {
    "float64": 2.0 ** -53, "complex128": 2.0 ** -53, "float32": 2.0 ** -24, "complex64": 2.0 ** -24,
    "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float8_e4m3fn": 2.0 ** -4, "float8_e4m3fnuz": 2.0 ** -4,
    "float8_e5m2": 2.0 ** -3, "float8_e5m2fnuz": 2.0 ** -3, "float8_e8m0fnu": 2.0 ** -1,
}


def is_float(dtype: str) -> bool:
    """Whether records of the index's `dtype` compare by the float rules
    (complex by their parts)."""
    return dtype in UNIT_ROUNDOFF


# -- scaled sums ------------------------------------------------------------


# -- units in the last place ----------------------------------------------


# -- the statistics of a pair ---------------------------------------------


class _Buffers:
    """Scratch space for one comparison's blocks."""

    def __init__(self, n: int, native: np.dtype) -> None:
        n = max(1, min(n, BLOCK))
        self.a = np.empty(n)
        self.b = np.empty(n)
        self.d = np.empty(n)
        self.t = np.empty(n)
        self.mask = np.empty(n, dtype=bool)
        self.na = np.empty(n, dtype=native)  # in the working precision
        self.nb = np.empty(n, dtype=native)
        self.nd = np.empty(n, dtype=native)
        self.nt = np.empty(n, dtype=native)


def _parts(x: np.ndarray) -> np.ndarray:
    """A complex array as its real and imaginary parts, interleaved."""
    return x.view(x.real.dtype) if x.dtype.kind == "c" else x


def _flat(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)  # a memmap's slices are slow to make; a plain view is not
    return x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two flat arrays of one dtype hold the same bytes. The first
    chunks are small: a pair that differs at all usually differs early."""
    va, vb = a.view(np.uint8), b.view(np.uint8)
    if va.size % 8 == 0:
        va, vb = va.view(np.uint64), vb.view(np.uint64)
    i, step = 0, 512
    while i < va.size:
        if not np.array_equal(va[i:i + step], vb[i:i + step]):
            return False
        i += step
        step = min(step * 4, BLOCK * 8)
    return True


def compare(a: np.ndarray, b: np.ndarray, dtype: str, rtol: float, atol: float, a2: Optional[np.ndarray] = None,
            full: bool = True) -> PairStats:
    """Compares two arrays of one shape and stored dtype (`dtype`: the
    index's, the tensor's own), and A with A2 when `a2` is given.

    full=False: the cheap check of a pair that is probably equal: n_bad is
    0 exactly when no element is beyond tolerance (otherwise it counts
    those of the first block that has one, and the statistics are left
    unfinished: compare again with full=True); with A2, an equal pair also
    gets aa, d2, floor_nonfinite and n_diff2, what the floor's summary needs
    of every record. full=True: every statistic."""
    with np.errstate(all="ignore"):  # NaN and infinity are handled, never warned about
        return compare_quietly(a, b, dtype, rtol, atol, a2, full)


# Below this many bytes a pair is compared as bytes objects: for a record of
# a few elements, fewer calls than the blocks' machinery.
_SMALL = 4096


def compare_quietly(a: np.ndarray, b: np.ndarray, dtype: str, rtol: float, atol: float,
                    a2: Optional[np.ndarray] = None, full: bool = True) -> PairStats:
    """compare(), for a caller that set np.errstate(all="ignore") already."""
    fa, fb = _flat(a), _flat(b)
    if fb.dtype != fa.dtype:  # the same dtype stored another way (byte order)
        fb = fb.astype(fa.dtype.newbyteorder("="))
    if fa.dtype.byteorder not in ("=", "|"):
        fa, fb = fa.astype(fa.dtype.newbyteorder("=")), fb.astype(fa.dtype.newbyteorder("="))
    st = PairStats(full)
    identical = fa.tobytes() == fb.tobytes() if fa.nbytes <= _SMALL else same_bytes(fa, fb)
    if identical and not full and a2 is None:
        return st
    f2 = None
    if a2 is not None:
        f2 = _flat(a2)
        if f2.dtype != fa.dtype:
            f2 = f2.astype(fa.dtype)
    if fa.dtype.kind in "fc":
        _float_pair(_parts(fa), _parts(fb), None if f2 is None else _parts(f2), dtype, rtol, atol, st, identical,
                    complex_=fa.dtype.kind == "c")
    else:
        _int_pair(fa, fb, f2, st, identical)
    return st


# -- floating point ---------------------------------------------------------


def _float_pair(a: np.ndarray, b: np.ndarray, a2: Optional[np.ndarray], dtype: str, rtol: float, atol: float,
                st: PairStats, identical: bool, complex_: bool) -> None:
    native = a.dtype
    # float16 is slow to compute on: its blocks are widened to float32, exactly.
    work = np.dtype(np.float32) if native.itemsize < 4 else native
    native64 = native == np.float64
    buf = _Buffers(a.size, work)
    n = a.size
    if identical:
        if a2 is not None or st.full:
            for i in range(0, n, BLOCK):
                _floor_block(a[i:i + BLOCK], None if a2 is None else a2[i:i + BLOCK], buf, native64, st,
                             add_a=True, equal_b=st.full)
        return
    check = _Check(work, rtol, atol)
    for i in range(0, n, BLOCK):
        x, y = a[i:i + BLOCK], b[i:i + BLOCK]
        x2 = None if a2 is None else a2[i:i + BLOCK]
        if st.full:
            _full_block(x, y, buf, dtype, rtol, atol, native64, st, complex_)
        else:
            st.n_bad += _check_block(x, y, buf, check, dtype, rtol, atol, complex_)
            if st.n_bad:
                return  # not equal: the caller compares again for every statistic
        if x2 is not None:
            # The full statistics summed ||a|| already.
            _floor_block(x, x2, buf, native64, st, add_a=not st.full, equal_b=False)


# -- integers and bool --------------------------------------------------------


def _int_pair(a: np.ndarray, b: np.ndarray, a2: Optional[np.ndarray], st: PairStats, identical: bool) -> None:
    if a.dtype == np.bool_:
        a, b = a.view(np.uint8), b.view(np.uint8)
        a2 = None if a2 is None else a2.view(np.uint8)
    signed = a.dtype.kind == "i"
    for i in range(0, a.size, BLOCK):
        x, y = a[i:i + BLOCK], b[i:i + BLOCK]
        x2 = None if a2 is None else a2[i:i + BLOCK]
        if x2 is not None:
            st.n_diff2 += int(np.count_nonzero(x != x2))
        if st.full or x2 is not None:
            a64 = x.astype(np.float64)
            sa, _ = _sumsq(a64, False)  # |x| < 2^64: squares and their sums stay in range
            st.aa.add(sa, 0)
            if x2 is not None:
                st.d2.add(float(np.sum(_int_abs_diff(x, x2, signed).astype(np.float64) ** 2)), 0)
            if st.full:
                b64 = y.astype(np.float64)
                st.bb.add(*_sumsq(b64, False))
                st.ab.add(_vdot(a64, b64), 0)
        if identical:
            continue
        changed = np.flatnonzero(x != y)
        if changed.size == 0:
            continue
        st.n_bad += int(changed.size)
        if not st.full:
            return  # not equal: the caller compares again for every statistic
        xa, yb = x[changed], y[changed]
        d = _int_abs_diff(xa, yb, signed)
        st.max_abs = max(st.max_abs, float(int(d.max())))
        mag = _int_magnitude(xa, signed).astype(np.float64)
        d64 = d.astype(np.float64)
        rel = np.divide(d64, mag, out=np.full_like(d64, math.inf), where=mag > 0)
        st.max_rel = max(st.max_rel, float(rel.max()))
        st.dd.add(_vdot(d64, d64), 0)


def ulps_within(a: np.ndarray, b: np.ndarray, dtype: str, ulps: int) -> Tuple[bool, str]:
    """Whether every element of B is within `ulps` of A's in `dtype` (NaN
    with NaN, an infinity with the same one); (False, what is not) otherwise."""
    fa, fb = _parts(_flat(a)), _parts(_flat(b))
    if fb.dtype != fa.dtype:
        fb = fb.astype(fa.dtype)
    if not is_float(dtype):
        n = int(np.count_nonzero(fa != fb))
        return n == 0, f"{n} element(s) differ"
    with np.errstate(all="ignore"):
        for i in range(0, fa.size, BLOCK):
            x, y = fa[i:i + BLOCK], fb[i:i + BLOCK]
            at = None  # the positions of x and y in the block, where some were left out
            bx, by = np.isfinite(x), np.isfinite(y)
            if not (bx.all() and by.all()):
                same = (x == y) | (np.isnan(x) & np.isnan(y))
                odd = ~same & ~(bx & by)
                if odd.any():
                    j = int(np.flatnonzero(odd)[0])
                    return False, f"element {i + j}: {float(x[j])!r} against {float(y[j])!r}"
                at = np.flatnonzero(bx & by)
                x, y = x[at], y[at]
            most = max_ulps(x, y, dtype)
            if most > ulps:
                j = int(np.argmax(ulp_distance(ulp_keys(x, dtype), ulp_keys(y, dtype))))
                return False, (f"element {i + (j if at is None else int(at[j]))} is {most} ulps from A's "
                               f"({float(x[j])!r} against {float(y[j])!r})")
    return True, ""
