"""The precision a pair of records is judged at (a port may record another dtype).

A port may hold a quantity in another dtype than its original: C++'s
`torch::nn::utils::clip_grad_norm_` returns a double where Python's returns
a float32 tensor. Compared as they are, the two differ in the float32
rounding of the original, and a floor measured in float64 (4u of float64
where A2 equals A exactly) calls one float32 ulp a difference. So:

- A and B hold a record in two floating dtypes of one family (real or
  complex): both, and the floor runs' records, are rounded to the coarser
  (the larger unit roundoff) and judged there: the ulps, the tolerance, the
  floor's 4u allowance. The summary says `dtype <a> vs <b>`.
- A float64 record whose values are all exactly float32 values in A and in
  B was a float32 quantity carried in a double: judged as float32.

Anything else that differs in dtype (an integer against a float, int32
against int64, a float8) stays a "mismatch".
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from .values import BLOCK, UNIT_ROUNDOFF

# The dtypes that can be rounded into one another, by family.
_REAL = ("float64", "float32", "float16", "bfloat16")
_COMPLEX = ("complex128", "complex64")


def coarser(dtype_a: str, dtype_b: str) -> Optional[str]:
    """The dtype two different floating dtypes of one family are judged at
    (the larger unit roundoff), None when they cannot be (a mismatch)."""
    for family in (_REAL, _COMPLEX):
        if dtype_a in family and dtype_b in family:
            return max((dtype_a, dtype_b), key=lambda d: UNIT_ROUNDOFF[d])
    return None


def _bfloat16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16's precision (to nearest, ties to even), held as
    float32 as the files hold bfloat16. NaN stays NaN; a value past
    bfloat16's largest rounds to infinity, as torch's conversion does."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    out = rounded.view(np.float32).reshape(f.shape)
    return np.where(np.isnan(f), f, out)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to `dtype` (one of _REAL or _COMPLEX), stored as the files
    store it (bfloat16 as float32)."""
    if dtype == "bfloat16":
        return _bfloat16(x)
    if x.dtype == np.dtype(dtype):
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x).astype(dtype)


def _float32_exact(x: np.ndarray) -> bool:
    """Whether every value of a float64 array is a float32 value (NaN and
    infinities included). In blocks, stopping at the first that is not: a
    large record (memory-mapped) is not copied whole, and a float64 record
    of float64 values costs one block."""
    flat = np.asarray(x).reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(0, flat.size, BLOCK):
            part = flat[i:i + BLOCK]
            back = part.astype(np.float32).astype(np.float64)
            if not np.all((back == part) | np.isnan(part)):
                return False
    return True


def judge(x: np.ndarray, y: np.ndarray, floors: List[np.ndarray], dtype_a: str, dtype_b: str
          ) -> Tuple[np.ndarray, np.ndarray, List[np.ndarray], Optional[str]]:
    """A's, B's and the floor runs' arrays of one record, rounded to the
    precision the pair is judged at, and that dtype's name (None: as the
    caller judges one dtype). `dtype_a`, `dtype_b`: the index's."""
    if dtype_a == dtype_b:
        if dtype_a == "float64" and x.dtype == np.float64 and y.dtype == np.float64 \
                and _float32_exact(x) and _float32_exact(y):
            return (x.astype(np.float32), y.astype(np.float32), [round_to(f, "float32") for f in floors],
                    "float32")
        return x, y, floors, None
    coarse = coarser(dtype_a, dtype_b)
    assert coarse is not None
    return round_to(x, coarse), round_to(y, coarse), [round_to(f, coarse) for f in floors], coarse


__all__ = ["coarser", "judge", "round_to"]
