"""What the diff's page says of one record pair beyond the statistics: its
cosine, and hints at the kind of difference (a transpose, a scale, a sign,
a shift)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .._diff.text import _num
from .frame import _bins

VIEW_ELEMENTS = 1 << 22  # elements a view reads at most, evenly taken


def record_facts(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> Dict[str, Any]:
    """What a record's view says: the first element beyond tolerance (text),
    hints (B transposed, scaled, offset, shifted), a histogram of b - a
    ((counts, edges) or (None, None)) and how many elements were sampled (0:
    all)."""
    shape = a.shape
    fa, fb = a.reshape(-1), b.reshape(-1)
    if fa.dtype.kind == "c":
        fa, fb = fa.view(fa.real.dtype), fb.view(fb.real.dtype)
    out: Dict[str, Any] = {"first": None, "hints": [], "histogram": (None, None), "sampled": 0}
    with np.errstate(all="ignore"):
        x, y = fa.astype(np.float64), fb.astype(np.float64)
        both = np.isfinite(x) & np.isfinite(y)
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        bad = ~same & (~both | (np.abs(x - y) > atol + rtol * np.abs(x)))
        if fa.dtype.kind not in "fc":
            bad = fa != fb
        hit = np.flatnonzero(bad)
        if hit.size:
            i = int(hit[0])
            element = i // 2 if a.dtype.kind == "c" else i
            part = (" (imaginary part)" if i % 2 else " (real part)") if a.dtype.kind == "c" else ""
            index = list(np.unravel_index(element, shape)) if shape else []
            out["first"] = f"{index}{part}: A {_num(float(x[i]), 9)}, B {_num(float(y[i]), 9)}"
        xs, ys = x[both], y[both]
        if xs.size > VIEW_ELEMENTS:
            take = np.linspace(0, xs.size - 1, VIEW_ELEMENTS).astype(np.int64)
            xs, ys = xs[take], ys[take]
            out["sampled"] = VIEW_ELEMENTS
        d = ys - xs
        if d.size and np.isfinite(d).all():
            lo, hi = float(d.min()), float(d.max())
            counts, edges = np.histogram(d, bins=_bins(lo, hi))
            out["histogram"] = (counts, edges)
        if a.dtype.kind in "fc" and fa.size > 1 and np.isfinite(x).all() and np.isfinite(y).all():
            out["hints"] = _hints(x.reshape(-1), y.reshape(-1), shape if a.dtype.kind == "f" else None)
    return out


def _cos(u: np.ndarray, v: np.ndarray) -> float:
    # Scaled, so that large values do not overflow the sums.
    su, sv = float(np.max(np.abs(u))), float(np.max(np.abs(v)))
    if su == 0 or sv == 0:
        return 1.0 if su == sv else 0.0
    u, v = u / su, v / sv
    return float(np.dot(u, v) / (math.sqrt(float(np.dot(u, u))) * math.sqrt(float(np.dot(v, v)))))


def _hints(x: np.ndarray, y: np.ndarray, shape: Optional[Tuple[int, ...]]) -> List[str]:
    """What B looks like, said where it fits far better than B = A does."""
    m = max(float(np.max(np.abs(x))), float(np.max(np.abs(y))))
    if m == 0 or not math.isfinite(m):
        return []
    x, y = x / m, y / m  # one scale for both: the ratios below do not change, nothing overflows
    out: List[str] = []
    base = _cos(x, y)
    if shape is not None and len(shape) >= 2 and base < 0.999:
        t = x.reshape(shape).swapaxes(-1, -2).reshape(-1)  # transposed, read in A's shape if not square
        c = _cos(t, y)
        if c > 0.999:
            kind = "transposed" if shape[-1] == shape[-2] else "transposed (its last two axes), read in A's shape"
            out.append(f"B looks like A {kind}: cosine with A's transpose {_num(c, 6)}, with A {_num(base, 6)}")
    xx = float(np.dot(x, x))
    if xx > 0:
        scale = float(np.dot(x, y)) / xx
        if abs(scale - 1) > 1e-3 and float(np.linalg.norm(y - scale * x)) <= 1e-3 * float(np.linalg.norm(y)):
            out.append(f"B looks like A scaled: B = {_num(scale, 6)} * A")
    diff = y - x
    norm = float(np.linalg.norm(diff))
    if norm > 0:
        offset = float(diff.mean())
        if offset != 0 and float(np.linalg.norm(diff - offset)) <= 1e-3 * norm:
            out.append(f"B looks like A offset: B = A + {_num(offset * m, 6)}")
    if base < 0.999 and x.size > 2:
        rows = x.reshape(shape) if shape is not None and len(shape) >= 2 else None
        for k in (1, -1, 2, -2):
            if _cos(np.roll(x, k), y) > 0.999:
                out.append(f"B looks like A shifted by {k} element{'s' if abs(k) > 1 else ''} (in A's flat order)")
                break
            if rows is not None and rows.shape[0] > abs(k) and _cos(np.roll(rows, k, axis=0).reshape(-1), y) > 0.999:
                out.append(f"B looks like A shifted by {k} along its first axis")
                break
    return out
