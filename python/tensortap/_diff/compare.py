"""Two runs side by side (docs/design.md#two-runs-side-by-side): `tensortap.diff(a, b)`
and `tensortap diff A B`. A port check: does the C++ model compute what the
Python one did, and if not, where does it first differ, and is the
difference more than rounding?

Records align by (rank, kind, name, step); a repeat (`name#1`) is a name of
its own, as on disk. A single-rank run is rank 0. A is the reference.

The rules, element by element (a "bad" element is one beyond tolerance):
- Floating-point values compare as numbers: -0 equals +0; a NaN equals a NaN
  at the same place, whatever its payload or sign; an infinity equals only
  the infinity of the same sign; a NaN or an infinity against anything else
  is bad. Finite values are within tolerance when
  |a - b| <= atol + rtol * |a| (defaults 0: exact), evaluated in float64.
- Integers and bool compare exactly, whatever the tolerance, and are
  differenced as integers (exact above 2^53).
- A complex value compares as its real and imaginary parts, each by the
  float rules; it is bad when either part is.
- A shape or dtype (the index's) that differs is a "mismatch": no value is
  compared, a difference; but two floating dtypes of one family are judged
  at the coarser precision (tensortap/_diff_dtype.py).
- A record that cannot be read (a missing or damaged file, one that holds
  another shape or dtype than its index line says) is "unreadable": it
  counts as a difference, and the comparison goes on.

Per pair: max_abs = max |a - b| and max_rel = max |a - b| / |a| over the
finite elements (a 0 in A against a non-zero in B: max_rel inf); a NaN or
infinity that disagrees makes both inf. max_ulp is the largest distance in
units in the last place of the record's own dtype (bfloat16's and float8's,
although the files hold them as float32 and bytes: the count of
representable values between the two, -0 and +0 one value) over the
elements beyond tolerance (every differing element when exact), 0 when none
is, inf where a non-finite value disagrees; NaN for integers and bool.
n_bad counts the bad elements. Over the elements finite in both, as scaled
sums (no overflow at 1e200, no underflow at 1e-200): cosine, the cosine
similarity of the two as vectors (complex: of their parts; two zero vectors
1, a zero vector against another 0); rel_norm = ||a - b|| / ||a|| (0 when
both are 0).

The noise floor (`floor=A2`, `--floor A2`): A2 is A's program run again with
its initial parameters moved by `tensortap.torch.perturb(model, ulps, seed)`,
so that it differs from A by rounding alone. A record of A, B and A2 that is
not equal is "noise" (an agreement) when
||a - b|| <= factor * max(||a - a2||, 4 * u * ||a||), u the unit roundoff of
its dtype, and no NaN or infinity of A and B disagrees; an integer or bool
record when at most factor times as many elements differ as A2 has
differing. floor_rel_norm = ||a - a2|| / ||a|| (NaN without a floor). A
record A2 lacks is judged by the tolerance ("without floor"). Several floor
runs: their envelope is the floor (tensortap/_diff_floor.py); records in two
dtypes, dropout masks: tensortap/_diff_dtype.py, _diff_dropout.py. A2 is refused
(ValueError, exit 2) unless every record of A2 is one of A's with its shape
and dtype, and A's step-0 `param` records, which A must have, are A2's within
`ulps` ulps.

Status: "equal" (no bad element), "noise", "differ", "mismatch",
"unreadable", "only_a", "only_b".

A run whose disk budget gave up its oldest steps (Budget::KeepLatest,
Run.given_up_below: k per rank) shows no record below k but its dumped
steps'. The command says so in a "note:" line first, and a record on one
side only whose step the other run gave up is counted apart ("given up by
B: N records of A"), not as "only in": it does not make the exit status 1.
The DataFrame keeps them as "only_a" / "only_b".

The first divergence is the earliest step holding a "differ" or "mismatch",
and within it the first such record in A's index order (ARCHITECTURE.md,
"Order": within a thread, records are in the order of their captures; the
Python twin writes in the order of its hooks, which is the same for the same
model: a step's parameters and buffers, its activations and the loss in
forward order, activation gradients in backward order, then its parameter
gradients). Where it arises is read from what agrees around it (_arises).

Memory stays bounded: the runs' records are aligned on the reader's index
columns (tensortap/_diff_align.py), pairs are read one at a time,
memory-mapped where the format allows, and compared in blocks
(tensortap/_diff_values.py). The command keeps a byte per record (two with
a floor, and a float32) beyond the alignment's arrays; `tensortap.diff()`
builds a DataFrame, a row per record.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._base import RunError
from .align import Alignment, Selection
from .dtype import coarser, judge
from .floor import Floors, check_all, envelope, spread
from .values import UNIT_ROUNDOFF, PairStats, compare_quietly, is_float
# The names the page, the command and the tests take from here.
from .side import COLUMNS, Options, PathOrRun, _empty_row, _open, _Side  # noqa: F401
from .tally import Tally, describe  # noqa: F401
from .text import esc  # noqa: F401

if TYPE_CHECKING:
    import pandas


# -- text -------------------------------------------------------------------


# -- options ----------------------------------------------------------------


# -- the runs ---------------------------------------------------------------


# -- one pair ---------------------------------------------------------------


class _Comparer:
    """Reads and compares the aligned pairs of two runs (and A2)."""

    def __init__(self, a: _Side, b: _Side, floors: Sequence[_Side], opts: Options, full: bool) -> None:
        self.a, self.b = a, b
        self.a2 = floors[0] if floors else None  # the first floor run
        self.opts = opts
        self.full = full
        self.align = Alignment(a.index, b.index, None if self.a2 is None else self.a2.index, opts.select)
        self.floors = Floors(a, floors, self.align) if floors else None

    def close(self) -> None:
        self.a.close()
        self.b.close()
        if self.floors is not None:
            self.floors.close()

    def rows(self) -> Iterator[Dict[str, Any]]:
        """A row per record of A in A's index order, then one per record only
        B has, in B's."""
        for pa in self.align.a_positions():
            yield self.pair(pa)
        for pb in self.align.b_only_positions():
            kind, name, _, _, _ = self.b.meta(pb)
            row = _empty_row(self.b.rank(pb), kind, name, self.b.step(pb), "only_b")
            row["_b"], row["_dtype_b"] = pb, self.b.meta(pb)[2]
            yield row

    def pair(self, pa: int, full: Optional[bool] = None) -> Dict[str, Any]:
        """The row of A's record `pa` (full: every statistic, whatever
        self.full says)."""
        full = self.full if full is None else full
        kind, name, dtype, shape, _ = self.a.meta(pa)
        pb = int(self.align.match_b[pa])
        row = _empty_row(self.a.rank(pa), kind, name, self.a.step(pa), "only_a" if pb < 0 else "equal")
        row["_a"], row["_b"], row["_dtype_a"] = pa, pb, dtype
        if pb < 0:
            return row
        _, _, dtype_b, shape_b, _ = self.b.meta(pb)
        row["_dtype_b"] = dtype_b
        if shape_b != shape or (dtype_b != dtype and coarser(dtype, dtype_b) is None):
            row["status"] = "mismatch"
            row["_detail"] = f"A {esc(dtype)} {list(shape)}, B {esc(dtype_b)} {list(shape_b)}"
            return row
        try:
            x = self.a.read(pa)
            y = self.b.read(pb)
        except RunError as e:
            row["status"] = "unreadable"
            row["_detail"] = esc(e)
            return row
        xs2: List[np.ndarray] = []
        if self.floors is not None:
            xs2, why = self.floors.read(pa, x)
            if why:
                row["_detail"] = why
        # Two dtypes, or a float32 quantity carried in a float64: judged at
        # the coarser precision (tensortap/_diff_dtype.py).
        x, y, xs2, judged = judge(x, y, xs2, dtype, dtype_b)
        if x.dtype.kind != y.dtype.kind or x.dtype.itemsize != y.dtype.itemsize:
            row["status"] = "unreadable"
            row["_detail"] = f"A holds {x.dtype}, B holds {y.dtype} for the index's {esc(dtype)}"
            return row
        x2 = xs2[0] if xs2 else None
        ulp_dtype = judged or (dtype if is_float(dtype) or x.dtype.kind not in "fc" else x.dtype.name)
        opts = self.opts
        st = compare_quietly(x, y, ulp_dtype, opts.rtol, opts.atol, x2, full=full)
        if not full and st.n_bad:
            # Not equal: what its description prints, every statistic.
            st = compare_quietly(x, y, ulp_dtype, opts.rtol, opts.atol, x2, full=True)
        lo = envelope(st, x, xs2[1:], ulp_dtype) if len(xs2) > 1 else math.nan
        del x, y, xs2
        self._fill(row, st, x2 is not None, ulp_dtype)
        if not math.isnan(lo):
            row["_spread"] = spread(row, lo)
        return row

    def _fill(self, row: Dict[str, Any], st: PairStats, floor: bool, dtype: str) -> None:
        floating = is_float(dtype)
        row["n_bad"] = st.n_bad
        row["_floor"] = floor
        row["_u"] = UNIT_ROUNDOFF.get(dtype, math.nan) if floating else math.nan
        if st.full:
            row["max_abs"], row["max_rel"] = st.max_abs, st.max_rel
            row["max_ulp"] = st.max_ulp if floating else math.nan
            row["cosine"], row["rel_norm"] = st.cosine(), st.rel_norm()
        if floor:
            row["floor_rel_norm"] = st.floor_rel_norm()
            row["_a_zero"] = st.aa.value == 0.0
        if st.n_bad == 0:
            row["status"] = "equal"
        elif floor and st.noise(self.opts.factor, UNIT_ROUNDOFF.get(dtype) if floating else None):
            row["status"] = "noise"
        else:
            row["status"] = "differ"


# -- the summary ------------------------------------------------------------


# -- entry points -------------------------------------------------------------


class _Session:
    """Runs opened (and closed) for one diff."""

    def __init__(self, a: PathOrRun, b: PathOrRun, floor: Union[None, PathOrRun, Sequence[PathOrRun]]) -> None:
        self.opened: List[Any] = []
        self.runs: List[Any] = []
        for what, run in (("a", a), ("b", b)) + tuple(("floor", f) for f in floor_list(floor) or [None]):
            if run is None:
                self.runs.append(None)
                continue
            r, mine = _open(run, what)
            if mine:
                self.opened.append(r)
            self.runs.append(r)

    def __enter__(self) -> "_Session":
        return self

    def __exit__(self, *exc: object) -> None:
        for r in self.opened:
            r.close()


def floor_list(floor: Union[None, PathOrRun, Sequence[PathOrRun]]) -> List[PathOrRun]:
    """The floor runs a `floor=` argument names: one, a list or tuple, or none."""
    if floor is None:
        return []
    if isinstance(floor, (list, tuple)):
        if not floor:
            raise ValueError("tensortap.diff: floor is an empty list (None: no floor)")
        return list(floor)
    return [floor]


def _comparer(runs: Sequence[Any], opts: Options, full: bool) -> Tuple[_Comparer, Optional[str]]:
    a = _Side(runs[0], "A")
    b = _Side(runs[1], "B")
    given = [r for r in runs[2:] if r is not None]
    floors = [_Side(r, "A2" if len(given) == 1 else f"A2 #{k + 1}") for k, r in enumerate(given)]
    cmp = _Comparer(a, b, floors, opts, full)
    note = check_all(cmp.floors, opts.ulps) if cmp.floors is not None else None
    return cmp, note


def run_command(runs: Sequence[Any], opts: Options, common_only: bool = False,
                on_row: Optional[Callable[[Dict[str, Any]], None]] = None) -> Tuple[List[str], int, Tally]:
    """What `tensortap diff` prints and its exit status (0 agree, 1 differ),
    streaming: each pair is compared, tallied and dropped (`on_row`, the
    page's, sees each row first). `runs`: A, B and the floor runs A2, A2',
    ... (none, or None), open."""
    cmp, note = _comparer(runs, opts, full=on_row is not None)
    tally = Tally(cmp)
    tally.note = note
    # NaN and infinity are handled by the rules, never warned about; set
    # once here rather than per pair.
    try:
        with np.errstate(all="ignore"):
            for row in cmp.rows():
                if on_row is not None:
                    on_row(row)
                tally.add(row)
            lines = tally.lines(common_only)
    finally:
        cmp.close()
    return lines, 1 if tally.failed(common_only) else 0, tally


def diff(a: PathOrRun, b: PathOrRun, rtol: float = 0.0, atol: float = 0.0, *,
         floor: Union[None, PathOrRun, Sequence[PathOrRun]] = None,
         factor: float = 10.0, ulps: int = 1, steps: Tuple[Optional[int], Optional[int]] = (None, None),
         kinds: Optional[Sequence[str]] = None, exclude: Optional[str] = None) -> "pandas.DataFrame":
    """Compares run `a` (the reference) with run `b`: a pandas DataFrame, one
    row per aligned record (columns: rank, kind, name, step, status, max_abs,
    max_rel, max_ulp, n_bad, cosine, rel_norm, floor_rel_norm), in A's index
    order, then the records only B has.

    floor: A2, A's program run with its initial parameters perturbed
    (tensortap.torch.perturb), or a list of them (seeds 0, 1, 2: their
    envelope is the floor): a record that differs from A no more than
    `factor` times A2 does is "noise"; A2's step-0 params must be within
    `ulps` of A's (ValueError otherwise). steps (lo, hi), kinds and exclude
    (a regular expression searched in names) choose the records compared.

    attrs: "first_divergence" ({"rank", "kind", "name", "step", "arises"} of
    the first differing record, or None), "details" (by row: what a mismatch
    or an unreadable record is), "dtypes" (by row: (A's dtype, B's) where they
    differ), "dropout_masks_differ" (the first divergence is two dropout
    masks over the same values), "rtol", "atol"; with a floor also "factor", "ulps",
    "floor_saturated_step" (or None), "uninformative" (a list of {"rank",
    "kind", "name", "step"}), "without_floor" (a count),
    "floor_disagrees_step" (the first step where the floor runs disagree by
    more than `factor`, or None) and "floor_disagrees" ({"rank", "kind",
    "name", "step", "ratio"} or None). The rules are tensortap._diff's."""
    import pandas as pd

    opts = Options(rtol, atol, factor, ulps, Selection(steps, kinds, exclude))
    columns: Dict[str, List[Any]] = {c: [] for c in COLUMNS}
    details: Dict[int, str] = {}
    dtypes: Dict[int, Tuple[str, str]] = {}

    def keep(row: Dict[str, Any]) -> None:
        if row["_detail"]:
            details[len(columns["rank"])] = row["_detail"]
        if row["_dtype_a"] and row["_dtype_b"] and row["_dtype_a"] != row["_dtype_b"]:
            dtypes[len(columns["rank"])] = (row["_dtype_a"], row["_dtype_b"])
        for c in COLUMNS:
            columns[c].append(row[c])

    with _Session(a, b, floor) as session:
        _, _, tally = run_command(session.runs, opts, on_row=keep)
        first = tally.first_divergence()
        saturated = tally.saturated_step()
        useless = tally.uninformative()
        disagree = tally.floor_disagrees()
    df = pd.DataFrame(columns, columns=list(COLUMNS))
    # Not compared (mismatch, unreadable, one side only): <NA>, not a count.
    df["n_bad"] = df["n_bad"].astype("Int64")
    df.attrs["first_divergence"] = first
    df.attrs["details"] = details
    df.attrs["dtypes"] = dtypes
    df.attrs["dropout_masks_differ"] = tally.dropout()
    df.attrs["rtol"], df.attrs["atol"] = opts.rtol, opts.atol
    if floor is not None:
        df.attrs["factor"], df.attrs["ulps"] = opts.factor, opts.ulps
        df.attrs["floor_saturated_step"] = saturated
        df.attrs["uninformative"] = useless
        df.attrs["without_floor"] = tally.n_without_floor
        df.attrs["floor_disagrees_step"] = None if disagree is None else disagree["step"]
        df.attrs["floor_disagrees"] = disagree
    return df


__all__ = ["diff", "describe", "run_command", "Options", "Tally", "COLUMNS", "RunError", "esc"]
