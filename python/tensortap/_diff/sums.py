"""The arithmetic of a comparison, exact where it must be: sums of squares
kept as (mantissa, exponent) (_Sum), dot products, ULP distances, and a
pair's statistics (PairStats)."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from .._float8 import FORMATS as FLOAT8, table as float8_table


# Sums of squares of float64 blocks outside [2^-900, 2^900) are redone
# scaled: above, a square may have overflowed; below, squares may have
# vanished into subnormals.
_SUM_LO, _SUM_HI = 2.0 ** -900, 2.0 ** 900

# A float32 sum of squares is kept when it is finite and at least this: its
# terms then neither overflowed nor lost what matters to underflow.
_SUM32_LO = 2.0 ** -60


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


def _finite_sumsq(x: np.ndarray, native64: bool) -> Tuple[float, int]:
    """_sumsq over the finite elements of `x`."""
    s, e = _sumsq(x, native64)
    if math.isfinite(s):
        return s, e
    return _sumsq(x[np.isfinite(x)], native64)


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
