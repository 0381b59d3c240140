"""The diff's words: how a value, a name and a record's place are written
(terminal and page alike), and the floor's thresholds. Apart from _diff so
that its helpers (_diff_floor) use them without importing _diff back."""
from __future__ import annotations

import functools
import math
import unicodedata
from typing import Any

from .._base import _safe

# The floor's findings (docs/diff.md).
SATURATED = 1e-3      # the median floor_rel_norm of a step past which differences are not resolved
UNINFORMATIVE = 0.1   # a series whose floor_rel_norm is this at its first step is rounding noise itself


@functools.lru_cache(maxsize=4096)
def esc(value: Any) -> str:
    """`value` as text safe for a terminal or a page: control characters as
    _safe shows them, and format characters too (bidi overrides such as
    U+202E, which would reorder the rest of a line, zero-width ones, line
    and paragraph separators) as \\uXXXX."""
    text = _safe(value)
    if text.isascii():
        return text
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in ("Cf", "Zl", "Zp") else c for c in text)


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
