"""The diff's words: how a value, a name and a record's place are written
(terminal and page alike), and the floor's thresholds. Apart from _diff so
that its helpers (_diff_floor) use them without importing _diff back."""
from __future__ import annotations

import functools
import math
from typing import Any

from .._base import _safe

# The floor's findings (docs/diff.md).
SATURATED = 1e-3      # the median floor_rel_norm of a step past which differences are not resolved
UNINFORMATIVE = 0.1   # a series whose floor_rel_norm is this at its first step is rounding noise itself


# _safe, cached: the diff writes the same names on many lines.
esc = functools.lru_cache(maxsize=4096)(_safe)


def _num(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, float) and v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.{digits}g}"


def _where(kind: str, name: str, step: int, rank: int, ranks: bool = True) -> str:
    return f"{kind} {esc(name)} step {step}" + (f" rank {rank}" if ranks and rank else "")
