"""Two runs side by side (DESIGN.md section 9): `tensortap.diff(a, b)` and
`tensortap diff A B`. A port check: does the C++ model compute what the
Python one did, and if not, where does it first differ?

Records align by (rank, kind, name, step); a repeat (`name#1`) is a name of
its own, as on disk. A single-rank run is rank 0. A is the reference.

The rules, element by element (a "bad" element is one beyond tolerance):
- Floating-point values compare as numbers: -0 equals +0; a NaN equals a NaN
  at the same place, whatever its payload or sign; an infinity equals only
  the infinity of the same sign; a NaN or an infinity against anything else
  is bad. Finite values are within tolerance when
  |a - b| <= atol + rtol * |a| (defaults 0: exact).
- Integers and bool compare exactly, whatever the tolerance.
- A complex value compares as its real and imaginary parts, each by the
  float rules; it is bad when either part is.
- A shape or dtype (the index's, the tensor's own) that differs is a
  "mismatch": no value is compared, and it counts as a difference.

Per pair: max_abs = max |a - b| and max_rel = max |a - b| / |a| over the
finite elements (a 0 in A against a non-zero in B: max_rel inf); a NaN or
infinity that disagrees makes both inf. max_ulp is the largest distance in
units in the last place of the record's own dtype (bfloat16's and float8's,
although the files hold them as float32 and bytes: the count of
representable values between the two, -0 and +0 one value), over the finite
elements, inf where a non-finite value disagrees; NaN for integers and bool.
n_bad counts the bad elements. cosine is the cosine similarity of the two
as vectors of float64 (complex: of their parts), over the elements finite
in both; two zero vectors have cosine 1, a zero vector against another 0.

Status: "equal" (no bad element), "differ", "mismatch", "only_a", "only_b".

The first divergence is the earliest step holding a "differ" or "mismatch",
and within it the first such record in A's index order (ARCHITECTURE.md,
"Order": within a thread, records are in the order of their captures; the
Python twin writes in the order of its hooks, which is the same for the same
model: a step's parameters, its activations and the loss in forward order,
activation gradients in backward order, then its parameter gradients).

Memory stays bounded: one pair of records at a time, memory-mapped where
the format allows, compared in blocks of a few million elements. A pair
whose bytes are identical is equal without more work.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from ._base import RunError
from ._float8 import FORMATS as FLOAT8, table as float8_table

if TYPE_CHECKING:
    import pandas

COLUMNS = ("rank", "kind", "name", "step", "status", "max_abs", "max_rel", "max_ulp", "n_bad", "cosine")
_BLOCK = 1 << 22  # elements compared at once

Key = Tuple[int, str, str, int]


def _open(run):
    from ._run import Run

    if isinstance(run, Run):
        return run, False
    if not isinstance(run, (str, os.PathLike)):
        raise TypeError(f"tensortap.diff: a run is a path or a tensortap.Run, not {type(run).__name__}")
    return Run(run), True


def _records(run) -> Dict[Key, Dict[str, Any]]:
    """{(rank, kind, name, step): record}, in the run's index order (the last
    line of a record indexed twice, as the reader does)."""
    out: Dict[Key, Dict[str, Any]] = {}
    for rec in run.records:
        rank = rec.get("rank")
        out[(0 if rank is None else int(rank), rec["kind"], rec["name"], int(rec["step"]))] = rec
    return out


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


def _ulp_keys(x: np.ndarray, dtype: str) -> np.ndarray:
    """Integer keys whose differences count representable values of `dtype`."""
    if dtype == "float64":
        return _ordered(np.ascontiguousarray(x, dtype=np.float64).view(np.int64), 0)
    if dtype == "float32":
        return _ordered(np.ascontiguousarray(x, dtype=np.float32).view(np.uint32), 1 << 31)
    if dtype == "float16":
        return _ordered(np.ascontiguousarray(x, dtype=np.float16).view(np.uint16), 1 << 15)
    if dtype == "bfloat16":  # float32 in the file, exactly a bfloat16: its top 16 bits
        return _ordered(np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16, 1 << 15)
    if dtype in FLOAT8:
        values = float8_table(dtype).astype(np.float64)
        finite = np.unique(values[np.isfinite(values)])  # -0 and +0 one value
        return np.searchsorted(finite, x.astype(np.float64)).astype(np.int64)
    raise ValueError(dtype)


def _ulp_distance(ka: np.ndarray, kb: np.ndarray) -> np.ndarray:
    # Exact in uint64: the true distance is below 2**64 even where a
    # difference of int64s would overflow.
    ua, ub = ka.astype(np.uint64), kb.astype(np.uint64)
    return np.where(ka >= kb, ua - ub, ub - ua)


# -- one pair ---------------------------------------------------------------


class _Acc:
    """The statistics of one pair, gathered block by block."""

    def __init__(self) -> None:
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.max_ulp = 0.0
        self.n_bad = 0
        self.dot = 0.0
        self.na = 0.0
        self.nb = 0.0

    def cosine(self) -> float:
        if self.na == 0.0 and self.nb == 0.0:
            return 1.0
        if self.na == 0.0 or self.nb == 0.0:
            return 0.0
        return float(max(-1.0, min(1.0, self.dot / (math.sqrt(self.na) * math.sqrt(self.nb)))))


def _raw(x: np.ndarray) -> np.ndarray:
    """The elements' bits, one unsigned integer per element (a complex's
    parts: two)."""
    if x.dtype.kind == "c":
        x = x.view(x.real.dtype)
    return x.view(f"u{x.dtype.itemsize}") if x.dtype.itemsize in (1, 2, 4, 8) else x.view(np.uint8)


def _dots(a: np.ndarray, b: np.ndarray, acc: _Acc) -> None:
    # Over the elements finite in both, in float64.
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    both = np.isfinite(a64) & np.isfinite(b64)
    if not both.all():
        a64, b64 = a64[both], b64[both]
    acc.dot += float(np.dot(a64, b64))
    acc.na += float(np.dot(a64, a64))
    acc.nb += float(np.dot(b64, b64))


def _float_rules(a: np.ndarray, b: np.ndarray, dtype: str, rtol: float, atol: float, acc: _Acc) -> np.ndarray:
    """The float rules on elements whose bits differ; returns their bad mask.
    Elements with the same bits are equal, at distance 0."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)
    both = fa & fb
    same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))  # -0 and +0, infinities of one sign, NaN with NaN
    diff = np.abs(a64 - b64, where=both, out=np.zeros_like(a64))
    absa = np.abs(a64)
    bad = ~same & (~both | (diff > atol + rtol * absa))
    if both.any():
        acc.max_abs = max(acc.max_abs, float(diff.max()))
        rel = np.divide(diff, absa, where=both & (absa > 0), out=np.zeros_like(a64))
        acc.max_rel = max(acc.max_rel, float(rel.max()))
        if bool((both & (absa == 0) & (diff > 0)).any()):
            acc.max_rel = math.inf
        d = _ulp_distance(_ulp_keys(a[both], dtype), _ulp_keys(b[both], dtype))
        if d.size:
            acc.max_ulp = max(acc.max_ulp, float(d.max()))
    if bool((bad & ~both).any()):
        acc.max_abs = acc.max_rel = acc.max_ulp = math.inf
    return bad


def _compare_block(a: np.ndarray, b: np.ndarray, dtype: str, rtol: float, atol: float, acc: _Acc) -> None:
    _dots(a.view(a.real.dtype) if a.dtype.kind == "c" else a, b.view(b.real.dtype) if b.dtype.kind == "c" else b,
          acc)
    changed = np.flatnonzero(_raw(a) != _raw(b))
    if changed.size == 0:
        return
    if a.dtype.kind == "c":
        pa, pb = a.view(a.real.dtype)[changed], b.view(b.real.dtype)[changed]
        bad = _float_rules(pa, pb, a.real.dtype.name, rtol, atol, acc)
        # An element is bad when either of its parts is.
        acc.n_bad += int(np.unique(changed[bad] // 2).size)
    elif a.dtype.kind == "f":
        acc.n_bad += int(np.count_nonzero(_float_rules(a[changed], b[changed], dtype, rtol, atol, acc)))
    else:
        # Integers and bool: exactly; a changed bit is a changed value.
        acc.n_bad += int(changed.size)
        a64, b64 = a[changed].astype(np.float64), b[changed].astype(np.float64)
        d = np.abs(a64 - b64)
        absa = np.abs(a64)
        acc.max_abs = max(acc.max_abs, float(d.max()))
        rel = np.divide(d, absa, where=absa > 0, out=np.full_like(d, math.inf))
        acc.max_rel = max(acc.max_rel, float(rel.max()))


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    va, vb = a.view(np.uint8), b.view(np.uint8)
    if va.size % 8 == 0:
        va, vb = va.view(np.uint64), vb.view(np.uint64)
    for i in range(0, va.size, _BLOCK):
        if not np.array_equal(va[i:i + _BLOCK], vb[i:i + _BLOCK]):
            return False
    return True


def _flat(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)


def compare_arrays(a: np.ndarray, b: np.ndarray, dtype: str, rtol: float = 0.0, atol: float = 0.0) -> Dict[str, Any]:
    """The statistics of one aligned pair of equal shape and dtype (`dtype`:
    the index's, the tensor's own): max_abs, max_rel, max_ulp, n_bad, cosine."""
    fa, fb = _flat(a), _flat(b)
    if fb.dtype != fa.dtype:  # the same dtype stored another way (byte order)
        fb = fb.astype(fa.dtype)
    ulps = fa.dtype.kind in "fc"
    if _same_bytes(fa, fb):
        # Bit for bit: equal, and no statistic needs the values.
        return {"max_abs": 0.0, "max_rel": 0.0, "max_ulp": 0.0 if ulps else math.nan, "n_bad": 0, "cosine": 1.0}
    acc = _Acc()
    for i in range(0, fa.size, _BLOCK):
        _compare_block(np.asarray(fa[i:i + _BLOCK]), np.asarray(fb[i:i + _BLOCK]), dtype, rtol, atol, acc)
    return {"max_abs": acc.max_abs, "max_rel": acc.max_rel, "max_ulp": acc.max_ulp if ulps else math.nan,
            "n_bad": acc.n_bad, "cosine": acc.cosine()}


# -- two runs ---------------------------------------------------------------


def _check_tolerance(rtol, atol):
    for n, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"tensortap.diff: {n} must be a finite number >= 0, not {v!r}")


def _nan_row(key: Key, status: str) -> Dict[str, Any]:
    rank, kind, name, step = key
    return {"rank": rank, "kind": kind, "name": name, "step": step, "status": status, "max_abs": math.nan,
            "max_rel": math.nan, "max_ulp": math.nan, "n_bad": None, "cosine": math.nan}


def iter_pairs(run_a: Any, run_b: Any, rtol: float = 0.0, atol: float = 0.0) -> Iterator[Tuple[Dict[str, Any], str]]:
    """(row, detail) for every record of A in index order, then every record
    only B has; `detail` says what a mismatch is ("" otherwise)."""
    rec_a, rec_b = _records(run_a), _records(run_b)
    for key, ra in rec_a.items():
        rb = rec_b.get(key)
        if rb is None:
            yield _nan_row(key, "only_a"), ""
            continue
        sa, sb = tuple(ra["shape"]), tuple(rb["shape"])
        if ra["dtype"] != rb["dtype"] or sa != sb:
            yield _nan_row(key, "mismatch"), f"A {ra['dtype']} {list(sa)}, B {rb['dtype']} {list(sb)}"
            continue
        a = _read(run_a, ra, key)
        b = _read(run_b, rb, key)
        stats = compare_arrays(a, b, ra["dtype"], rtol, atol)
        del a, b
        rank, kind, name, step = key
        row = {"rank": rank, "kind": kind, "name": name, "step": step,
               "status": "equal" if stats["n_bad"] == 0 else "differ", **stats}
        yield row, ""
    for key in rec_b:
        if key not in rec_a:
            yield _nan_row(key, "only_b"), ""


def _read(run, rec, key):
    try:
        return run._read(rec, True)
    except (ValueError, OSError) as e:  # a RunError is a ValueError
        where = rec.get("file", "?") + (f" {rec['dataset']}" if "dataset" in rec else "")
        raise RunError(f"{run.path}: {key[1]} {key[2]!r} step {key[3]} cannot be read from {where}: {e}") from None


def first_divergence(rows: List[Dict[str, Any]]) -> Optional[int]:
    """The position in `rows` of the first divergence: the earliest step
    holding a "differ" or "mismatch", the first such row in A's order."""
    best = None
    for i, r in enumerate(rows):
        if r["status"] in ("differ", "mismatch") and (best is None or r["step"] < rows[best]["step"]):
            best = i
    return best


def diff(a: Union[str, os.PathLike, Any], b: Union[str, os.PathLike, Any], rtol: float = 0.0,
         atol: float = 0.0) -> "pandas.DataFrame":
    """Compares run `a` (the reference) with run `b`: a pandas DataFrame, one
    row per aligned record (columns: rank, kind, name, step, status, max_abs,
    max_rel, max_ulp, n_bad, cosine), in A's index order, then the records
    only B has. `.attrs["first_divergence"]` is {"rank", "kind", "name",
    "step"} of the first differing record, or None; `.attrs["details"]`
    says, by row, what a mismatch is. The rules are tensortap._diff's."""
    import pandas as pd

    _check_tolerance(rtol, atol)
    run_a, close_a = _open(a)
    try:
        run_b, close_b = _open(b)
        try:
            rows, details = [], {}
            for i, (row, detail) in enumerate(iter_pairs(run_a, run_b, rtol, atol)):
                rows.append(row)
                if detail:
                    details[i] = detail
        finally:
            if close_b:
                run_b.close()
    finally:
        if close_a:
            run_a.close()
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    # Not compared (mismatch, one side only): <NA>, not a count.
    df["n_bad"] = df["n_bad"].astype("Int64")
    first = first_divergence(rows)
    df.attrs["first_divergence"] = (None if first is None else
                                    {k: rows[first][k] for k in ("rank", "kind", "name", "step")})
    df.attrs["details"] = details
    df.attrs["rtol"], df.attrs["atol"] = rtol, atol
    return df


def _describe(row: Dict[str, Any], detail: str = "", ranks: bool = False) -> str:
    """One record's comparison in words, for the command and the page;
    `ranks`: the runs have several (the rank is named)."""
    from .summary import _safe

    where = f"{row['kind']} {_safe(row['name'])} step {row['step']}"
    if ranks:
        where += f" rank {row['rank']}"
    status = row["status"]
    if status == "mismatch":
        return f"{where}: shape or dtype differs ({detail})"
    if status == "only_a":
        return f"{where}: only in A"
    if status == "only_b":
        return f"{where}: only in B"
    text = (f"{where}: {row['n_bad']} element(s) beyond tolerance, max |a-b| {_num(row['max_abs'])}, "
            f"max rel {_num(row['max_rel'])}")
    if not math.isnan(row["max_ulp"]):
        text += f", max ulp {_num(row['max_ulp'])}"
    return text + f", cosine {_num(row['cosine'], 9)}"


describe = _describe


def _num(v, digits=4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, float) and v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.{digits}g}"


def summary_lines(rows: List[Dict[str, Any]], details: Dict[int, str], common_only: bool = False,
                  listed: int = 10) -> Tuple[List[str], int]:
    """What `tensortap diff` prints, and its exit status (0 agree, 1 differ)."""
    lines: List[str] = []
    first = first_divergence(rows)
    differing = [i for i, r in enumerate(rows) if r["status"] in ("differ", "mismatch")]
    only_a = [i for i, r in enumerate(rows) if r["status"] == "only_a"]
    only_b = [i for i, r in enumerate(rows) if r["status"] == "only_b"]
    compared = len(rows) - len(only_a) - len(only_b)
    ranks = any(r["rank"] != 0 for r in rows)

    def describe(row, detail=""):  # noqa: F811 - the runs' ranks, once
        return _describe(row, detail, ranks)
    if first is not None:
        lines.append("first divergence: " + describe(rows[first], details.get(first, "")))
        # Where a user starts looking: what still agreed just before it in
        # A's order, and what differs next.
        before = [i for i in range(first) if rows[i]["status"] == "equal"]
        if before:
            lines.append("  last agreeing before it: " + describe(rows[before[-1]]).split(":")[0])
        after = [i for i in differing if i > first][:3]
        for i in after:
            lines.append("  then: " + describe(rows[i], details.get(i, "")))
    if len(differing) > 1 or (differing and first is None):
        lines.append(f"differing records ({len(differing)}, in A's order):")
        for i in differing[:listed]:
            lines.append("  " + describe(rows[i], details.get(i, "")))
        if len(differing) > listed:
            lines.append(f"  ... and {len(differing) - listed} more")
    for label, which in (("only in A", only_a), ("only in B", only_b)):
        if which:
            lines.append(f"{label} ({len(which)}):")
            for i in which[:listed]:
                lines.append("  " + describe(rows[i]).split(":")[0])
            if len(which) > listed:
                lines.append(f"  ... and {len(which) - listed} more")
    lines.append(f"compared {compared}, differ {len(differing)}, only in A {len(only_a)}, only in B {len(only_b)}")
    failed = bool(differing) or (not common_only and bool(only_a or only_b))
    return lines, 1 if failed else 0


__all__ = ["diff", "describe", "summary_lines", "compare_arrays", "iter_pairs", "first_divergence", "COLUMNS", "RunError"]
