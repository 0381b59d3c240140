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

from .._float8 import FORMATS as FLOAT8, table as float8_table

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

# Sums of squares of float64 blocks outside [2^-900, 2^900) are redone
# scaled: above, a square may have overflowed; below, squares may have
# vanished into subnormals.
_SUM_LO, _SUM_HI = 2.0 ** -900, 2.0 ** 900


def is_float(dtype: str) -> bool:
    """Whether records of the index's `dtype` compare by the float rules
    (complex by their parts)."""
    return dtype in UNIT_ROUNDOFF


# -- scaled sums ------------------------------------------------------------


class _Sum:
    """A sum of products kept as value * 2**exp, exp an integer, so that
    adding blocks of very different magnitudes neither overflows nor
    underflows."""

    __slots__ = ("value", "exp")

    def __init__(self) -> None:
        self.value = 0.0
        self.exp = 0

    def add(self, value: float, exp: int) -> None:
        if value == 0.0:
            return
        if self.value == 0.0:
            self.value, self.exp = value, exp
        elif exp > self.exp:
            self.value = math.ldexp(self.value, self.exp - exp) + value
            self.exp = exp
        else:
            self.value += math.ldexp(value, exp - self.exp)

    def sqrt(self) -> Tuple[float, float]:
        """sqrt of the sum as (m, e): sqrt = m * 2**e, e possibly fractional."""
        return math.sqrt(max(self.value, 0.0)), self.exp / 2.0


def ratio(num: _Sum, den: _Sum) -> float:
    """sqrt(num) / sqrt(den), each a sum of squares: 0 when both are 0, inf
    when only the denominator is."""
    if num.value == 0.0:
        return 0.0
    if den.value == 0.0:
        return math.inf
    e = num.exp - den.exp
    q = num.value / den.value
    if 0.0 < q < math.inf and abs(e) < 1800:
        return math.sqrt(q) * 2.0 ** (e / 2.0)  # a product past the largest float is inf, as it should be
    # Far apart: in logarithms.
    log = 0.5 * (math.log2(num.value) - math.log2(den.value) + e)
    return math.inf if log > 1024 else 0.0 if log < -1075 else 2.0 ** log


def _norm_le(lhs: _Sum, rhs: _Sum, factor: float) -> bool:
    """sqrt(lhs) <= factor * sqrt(rhs), compared as scaled numbers: no overflow."""
    if lhs.value == 0.0:
        return True
    if rhs.value == 0.0 or factor == 0.0:
        return False
    try:
        bound = math.ldexp(factor * factor * rhs.value, rhs.exp - lhs.exp)
    except OverflowError:
        return True
    return lhs.value <= bound


def _vdot(x: np.ndarray, y: np.ndarray) -> float:
    """sum(x*y) of two flat arrays of one dtype, accumulated in it. Not
    np.dot: where NumPy is linked to the reference BLAS (Debian's default),
    its scalar loop takes three times as long as einsum's vectorized one."""
    return float(np.einsum("i,i->", x, y))


def _sumsq(x: np.ndarray, native64: bool) -> Tuple[float, int]:
    """(s, e): sum(x*x) = s * 2**e; `x` float64."""
    s = _vdot(x, x)
    if not native64 or (_SUM_LO <= s < _SUM_HI) or (s == 0.0 and not x.any()):
        return s, 0
    k = _scale_exp(x)
    xs = np.ldexp(x, -k)
    return _vdot(xs, xs), 2 * k


def _scale_exp(x: np.ndarray) -> int:
    """The power of two that brings max |x| near 1 (0 for a zero block)."""
    m = float(np.max(np.abs(x))) if x.size else 0.0
    return math.frexp(m)[1] if m > 0 else 0


def _dot(x: np.ndarray, y: np.ndarray, ex: int, ey: int) -> Tuple[float, int]:
    """(s, e): sum(x*y) = s * 2**e, `x` scaled by 2**-ex and `y` by 2**-ey
    first when either is not 0 (the exponents _sumsq chose, halved)."""
    if ex == 0 and ey == 0:
        return _vdot(x, y), 0
    return _vdot(np.ldexp(x, -ex), np.ldexp(y, -ey)), ex + ey


# -- units in the last place ----------------------------------------------


def _ordered(bits: np.ndarray, sign_mask: int) -> np.ndarray:
    """Sign-and-magnitude float bits as integers in the floats' order, -0
    and +0 both 0 (int64)."""
    b = bits.astype(np.int64) if bits.dtype.itemsize < 8 else bits.view(np.int64)
    if bits.dtype.itemsize < 8:
        neg = (b & sign_mask) != 0
        mag = b & (sign_mask - 1)
    else:
        neg = b < 0
        mag = b & np.int64(0x7FFFFFFFFFFFFFFF)
    return np.where(neg, -mag, mag)


def ulp_keys(x: np.ndarray, dtype: str) -> np.ndarray:
    """Integer keys whose differences count representable values of `dtype`
    (bfloat16's and float8's too, held as float32)."""
    if dtype in ("float64", "complex128"):
        return _ordered(np.ascontiguousarray(x, dtype=np.float64).view(np.int64), 0)
    if dtype in ("float32", "complex64"):
        return _ordered(np.ascontiguousarray(x, dtype=np.float32).view(np.uint32), 1 << 31)
    if dtype == "float16":
        return _ordered(np.ascontiguousarray(x, dtype=np.float16).view(np.uint16), 1 << 15)
    if dtype == "bfloat16":  # float32 in the file, exactly a bfloat16: its top 16 bits
        return _ordered(np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16, 1 << 15)
    if dtype in FLOAT8:
        values = float8_table(dtype).astype(np.float64)
        finite = np.unique(values[np.isfinite(values)])  # -0 and +0 one value
        return np.searchsorted(finite, np.asarray(x, dtype=np.float64)).astype(np.int64)
    raise ValueError(dtype)


def ulp_distance(ka: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """|ka - kb| as uint64: exact even where a difference of int64s would overflow."""
    ua, ub = ka.astype(np.uint64), kb.astype(np.uint64)
    return np.where(ka >= kb, ua - ub, ub - ua)


# The signed integer as wide as each stored float, for its bits.
_BITS = {2: np.int16, 4: np.int32, 8: np.int64}


def max_ulps(x: np.ndarray, y: np.ndarray, dtype: str) -> int:
    """The largest distance in ulps of `dtype` between finite x and y.

    Two floats of one sign are |bits(x) - bits(y)| ulps apart (their bits
    as signed integers are in their order), which needs no wider integer;
    only the pairs whose signs differ take the general keys."""
    if x.size == 0:
        return 0
    if dtype in FLOAT8:
        return int(ulp_distance(ulp_keys(x, dtype), ulp_keys(y, dtype)).max())
    if dtype == "bfloat16":
        bx = np.right_shift(np.ascontiguousarray(x, dtype=np.float32).view(np.int32), 16)
        by = np.right_shift(np.ascontiguousarray(y, dtype=np.float32).view(np.int32), 16)
    else:
        bits = _BITS[x.dtype.itemsize]
        bx, by = x.view(bits), y.view(bits)
    mixed = (bx ^ by) < 0
    if not mixed.any():
        return int(np.abs(bx - by).max())
    best = int(ulp_distance(ulp_keys(x[mixed], dtype), ulp_keys(y[mixed], dtype)).max())
    same = ~mixed
    if same.any():
        best = max(best, int(np.abs(bx[same] - by[same]).max()))
    return best


# -- the statistics of a pair ---------------------------------------------


class PairStats:
    """What one comparison found. Norms are sums of squares (_Sum):
    aa = ||a||^2, bb, dd = ||a-b||^2, ab = a.b, d2 = ||a-a2||^2 (with A2);
    over the elements finite in both. `nonfinite`: a NaN or infinity of A
    and B disagree; `floor_nonfinite`: of A and A2. For integers and bool,
    `n_diff2` counts the elements where A2 differs from A."""

    __slots__ = ("n_bad", "max_abs", "max_rel", "max_ulp", "aa", "bb", "dd", "ab", "d2", "nonfinite",
                 "floor_nonfinite", "n_diff2", "full")

    def __init__(self, full: bool) -> None:
        self.n_bad = 0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.max_ulp = 0.0
        self.aa, self.bb, self.dd, self.ab, self.d2 = _Sum(), _Sum(), _Sum(), _Sum(), _Sum()
        self.nonfinite = False
        self.floor_nonfinite = False
        self.n_diff2 = 0
        self.full = full

    def cosine(self) -> float:
        """The cosine of A and B as vectors (their parts for complex): 1 for two
        zero vectors, 0 for a zero vector against another."""
        if self.aa.value == 0.0 and self.bb.value == 0.0:
            return 1.0
        if self.aa.value == 0.0 or self.bb.value == 0.0:
            return 0.0
        (ma, ea), (mb, eb) = self.aa.sqrt(), self.bb.sqrt()
        c = self.ab.value / (ma * mb) * 2.0 ** (self.ab.exp - ea - eb) if self.ab.value else 0.0
        return float(max(-1.0, min(1.0, c)))

    def rel_norm(self) -> float:
        """||a-b|| / ||a||: 0 when both are 0."""
        return ratio(self.dd, self.aa)

    def floor_rel_norm(self) -> float:
        """||a-a2|| / ||a|| (inf where A2's non-finite values disagree with A's)."""
        if self.floor_nonfinite:
            return math.inf
        return ratio(self.d2, self.aa)

    def noise(self, factor: float, u: Optional[float]) -> bool:
        """The floor's rule (docs/diff.md) for a pair that is not
        equal: floating (u, the dtype's unit roundoff, given):
        ||a-b|| <= factor * max(||a-a2||, 4*u*||a||), never across a NaN or an
        infinity that disagrees; integers and bool: at most factor times as
        many differing elements as A2 has."""
        if u is None:
            return self.n_bad <= factor * self.n_diff2
        if self.nonfinite or self.floor_nonfinite:
            return False
        allowance = _Sum()
        allowance.add(self.aa.value * (4.0 * u) ** 2, self.aa.exp)
        floor = self.d2 if _norm_le(allowance, self.d2, 1.0) else allowance
        return _norm_le(self.dd, floor, factor)


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


def _finite_sumsq(x: np.ndarray, native64: bool) -> Tuple[float, int]:
    """_sumsq over the finite elements of `x`."""
    s, e = _sumsq(x, native64)
    if math.isfinite(s):
        return s, e
    return _sumsq(x[np.isfinite(x)], native64)


# A float32 sum of squares is kept when it is finite and at least this: its
# terms then neither overflowed nor lost what matters to underflow.
_SUM32_LO = 2.0 ** -60


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


def _narrow_sumsq(x: np.ndarray, finite: bool = True) -> Tuple[float, int]:
    """sum(x*x) of a float32 block as a float32 dot product where that is
    safe, else in float64 (over the finite elements when `finite`; NaN when
    not and the block holds one)."""
    s = _vdot(x, x)
    if math.isfinite(s) and (s >= _SUM32_LO or (s == 0.0 and not x.any())):
        return s, 0
    x64 = x.astype(np.float64)
    if finite:
        return _finite_sumsq(x64, False)
    return _sumsq(x64, False)


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


def _int_abs_diff(x: np.ndarray, y: np.ndarray, signed: bool) -> np.ndarray:
    """|x - y| exactly, as uint64 (the true difference is below 2^64)."""
    if signed:
        ix, iy = x.astype(np.int64), y.astype(np.int64)
        ux, uy = ix.view(np.uint64), iy.view(np.uint64)
        return np.where(ix >= iy, ux - uy, uy - ux)
    ux, uy = x.astype(np.uint64), y.astype(np.uint64)
    return np.where(ux >= uy, ux - uy, uy - ux)


def _int_magnitude(x: np.ndarray, signed: bool) -> np.ndarray:
    """|x| as uint64 (|int64 min| = 2^63 included)."""
    if signed:
        ix = x.astype(np.int64)
        ux = ix.view(np.uint64)
        return np.where(ix < 0, np.uint64(0) - ux, ux)
    return x.astype(np.uint64)


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
