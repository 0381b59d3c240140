"""The values an export shows: histograms binned as the recorder bins them
(the same fixed buckets, sums in the recorder's order, block by block) and a
0-d tensor's scalar. writers/src/tensorboard/EVENTS.md.
"""

from __future__ import annotations

import math
import sys
from typing import List, Optional

import numpy as np


# -- histograms ------------------------------------------------------------------


def _bucket_limits():
    positive = []
    v = 1e-12
    while v < 1e20:
        positive.append(v)
        v *= 1.1
    positive.append(sys.float_info.max)
    return np.array([-x for x in reversed(positive)] + [0.0] + positive, dtype=np.float64)


BUCKET_LIMITS = _bucket_limits()
"""The fixed bucket limits: the negated positive limits in reverse, 0.0, the
positive limits (1e-12 times 1.1 repeatedly, in float64, while below 1e20;
then DBL_MAX)."""


class Histogram:
    """A HistogramProto's fields: min, max, num, sum, sum_squares and the
    written buckets (bucket_limit, bucket), empty runs collapsed."""

    __slots__ = ("min", "max", "num", "sum", "sum_squares", "bucket_limit", "bucket")
    min: float
    max: float
    num: float
    sum: float
    sum_squares: float
    bucket_limit: List[float]
    bucket: List[float]

    def __repr__(self):
        return (f"Histogram(min={self.min!r}, max={self.max!r}, num={self.num!r}, sum={self.sum!r}, "
                f"sum_squares={self.sum_squares!r}, {len(self.bucket)} buckets)")


def element_values(array) -> np.ndarray:
    """The finite elements of `array` as float64, each as for statistics:
    complex as its modulus (in double), bool as 0 or 1."""
    a = np.asarray(array)
    if a.dtype.kind == "c":
        v = np.abs(a.astype(np.complex128)).ravel()
    else:
        v = a.astype(np.float64).ravel()
    return v[np.isfinite(v)]


# Elements binned at once: memory stays a few MiB whatever the record's
# size (the recorder bins in blocks too: HistogramAccumulator).
HISTOGRAM_BLOCK = 1 << 18


def histogram(array) -> Optional[Histogram]:
    """The histogram of `array`'s finite elements, or None if it has none.
    An element v falls in the first bucket whose limit is greater than v
    (bisect_right); DBL_MAX itself, above every limit but the last's equal,
    in the last bucket. Each nonempty bucket is written as (limit, count),
    each run of empty buckets as (the limit of its last bucket, 0). Binned
    block by block; sum and sum_squares are added element by element in the
    elements' order, as the recorder adds them (not NumPy's pairwise sum),
    so that both give the same bits."""
    a = np.asarray(array).reshape(-1)
    limits = BUCKET_LIMITS
    counts = np.zeros(len(limits), dtype=np.int64)
    lo, hi, num, total, squares = math.inf, -math.inf, 0, 0.0, 0.0
    for start in range(0, a.size, HISTOGRAM_BLOCK):
        v = element_values(a[start:start + HISTOGRAM_BLOCK])
        if v.size == 0:
            continue
        where = np.searchsorted(limits, v, side="right")
        np.minimum(where, len(limits) - 1, out=where)
        counts += np.bincount(where, minlength=len(limits))
        lo, hi, num = min(lo, float(v.min())), max(hi, float(v.max())), num + v.size
        with np.errstate(over="ignore", invalid="ignore"):  # past DBL_MAX: inf, as in C++
            total = float(np.cumsum(np.concatenate((np.array([total]), v)))[-1])
            squares = float(np.cumsum(np.concatenate((np.array([squares]), v * v)))[-1])
    if num == 0:
        return None
    out_limits, out_counts = [], []
    last = -1  # the last nonempty bucket written
    for k in np.flatnonzero(counts).tolist():
        if k > last + 1:
            out_limits.append(limits[k - 1])
            out_counts.append(0.0)
        out_limits.append(limits[k])
        out_counts.append(float(counts[k]))
        last = k
    if last < len(limits) - 1:
        out_limits.append(limits[-1])
        out_counts.append(0.0)
    h = Histogram()
    h.min, h.max = lo, hi
    h.num = float(num)
    h.sum, h.sum_squares = total, squares
    h.bucket_limit, h.bucket = out_limits, out_counts
    return h


def scalar_value(array) -> Optional[bytes]:
    """The element of a 0-d `array` as a little-endian float32 (bool: 0 or
    1), or None for a complex one: its value as for statistics (a double),
    then rounded to float32, as the recorder does. (An integer beyond 2**53
    is rounded twice so: 2**62 + 2**38 + 1 gives 2**62, not 2**62 + 2**39.)"""
    a = np.asarray(array)
    if a.dtype.kind == "c" or a.size != 1:
        return None
    with np.errstate(over="ignore", invalid="ignore"):  # past FLT_MAX: inf, as C++'s cast gives
        return a.reshape(()).astype(np.float64).astype("<f4").tobytes()
