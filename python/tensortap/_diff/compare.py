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
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _float8
from .._arrays import _given_up
from .._base import NUMPY_DTYPES, GivenUpError, RunError
from .align import Alignment, Selection
from .text import SATURATED, UNINFORMATIVE, _num, _where, esc  # noqa: F401 - diff_page and __main__ import them from here
from .dropout import SAYS as DROPOUT, masks_differ
from .dtype import coarser, judge
from .floor import Floors, check_all, disagreement, disagreement_line, envelope, spread
from .values import UNIT_ROUNDOFF, PairStats, compare_quietly, is_float
from .._npy import _cached_header, _read_npy
from .._files import _open_regular
from .._packed import _packed_layout
from .._paths import _resolve

if TYPE_CHECKING:
    import pandas

COLUMNS = ("rank", "kind", "name", "step", "status", "max_abs", "max_rel", "max_ulp", "n_bad", "cosine",
           "rel_norm", "floor_rel_norm")

# A status per record of A, one byte: what the summary reads back at the end.
_CODE = {"equal": 1, "noise": 2, "differ": 3, "mismatch": 4, "unreadable": 5, "only_a": 6}
_AGREE = (1, 2)
_DIVERGE = (3, 4)          # where the first divergence may be
_DIFFERENCES = ("differ", "mismatch", "unreadable")


PathOrRun = Union[str, "os.PathLike[str]", Any]


# -- text -------------------------------------------------------------------


# -- options ----------------------------------------------------------------


class Options:
    """What a diff compares and how (checked once)."""

    def __init__(self, rtol: float = 0.0, atol: float = 0.0, factor: float = 10.0, ulps: int = 1,
                 select: Optional[Selection] = None) -> None:
        for n, v in (("rtol", rtol), ("atol", atol), ("factor", factor)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"tensortap.diff: {n} must be a finite number >= 0, not {v!r}")
        if isinstance(ulps, bool) or not isinstance(ulps, int) or ulps < 0:
            raise ValueError(f"tensortap.diff: ulps must be an integer >= 0, not {ulps!r}")
        self.rtol, self.atol, self.factor, self.ulps = float(rtol), float(atol), float(factor), ulps
        self.select = select or Selection()


def _check_tolerance(rtol: Any, atol: Any) -> None:
    Options(rtol, atol)


# -- the runs ---------------------------------------------------------------


def _open(run: PathOrRun, what: str) -> Tuple[Any, bool]:
    from .._run import Run

    if isinstance(run, Run):
        return run, False
    if not isinstance(run, (str, os.PathLike)):
        raise TypeError(f"tensortap.diff: {what} is a path or a tensortap.Run, not {type(run).__name__}")
    return Run(run), True


# Records up to this many bytes are read whole, with what the reader shares
# across records kept (a directory's real path, a header parsed once, a
# packed segment opened once): a record of a few bytes costs microseconds,
# not the tens an np.load takes. Larger ones are memory-mapped. A packed
# record is read (pread), not mapped: a mapped segment's pages would stay in
# the process's memory, as much as the whole run by the end.
SMALL_RECORD = 1 << 20
# Packed segments kept open (the last ones used: a run's records come in
# order of its segments).
_SEGMENTS = 4


class _Side:
    """One run as the diff reads it: its index's columns and records."""

    def __init__(self, run: Any, label: str) -> None:
        self.run = run
        self.index = run._index
        self.label = label
        self._dirs: Dict[Any, str] = {}
        self._headers: Dict[bytes, Any] = {}
        self._segments: Dict[Tuple[str, str], Tuple[Any, int]] = {}

    def meta(self, i: int) -> Tuple[str, str, str, Tuple[int, ...], str]:
        return self.index.metas[self.index.meta[i]]

    def rank(self, i: int) -> int:
        r = self.index.sources[self.index.source[i]][2]
        return 0 if r is None else int(r)

    def step(self, i: int) -> int:
        return int(self.index.step[i])

    def read(self, i: int) -> np.ndarray:
        """Record i's array, checked against its index line; RunError, naming
        what and why, if it cannot be read."""
        rec = self.index.record(i)
        where = rec.get("file", "?") + (f" {rec['dataset']}" if "dataset" in rec else "")
        try:
            a = self._array(rec)
        except (GivenUpError, FileNotFoundError) as e:
            # Given up since the run was opened (Budget::KeepLatest on a live
            # run): said as run._read says it, for this side's own reads too.
            given_up = e if isinstance(e, GivenUpError) else _given_up(rec)
            if given_up is None:
                raise RunError(f"{self.label}: cannot be read from {where}: {e}") from None
            raise GivenUpError(f"{self.label}: {given_up}", given_up.kind, given_up.name, given_up.step,
                               given_up.rank, given_up.given_up_below) from None
        except (ValueError, OSError, KeyError, TypeError, EOFError) as e:  # a RunError is a ValueError
            raise RunError(f"{self.label}: cannot be read from {where}: {e}") from None
        if list(a.shape) != list(rec["shape"]):
            raise RunError(f"{self.label}: {where} holds shape {list(a.shape)}, the index says {list(rec['shape'])}")
        want = NUMPY_DTYPES.get(rec["dtype"])
        if want is not None and a.dtype.newbyteorder("=") != np.dtype(want):
            raise RunError(f"{self.label}: {where} holds {a.dtype}, the index says {rec['dtype']}")
        return a

    def close(self) -> None:
        for f, _ in self._segments.values():
            f.close()
        self._segments.clear()

    def _array(self, rec: Any) -> np.ndarray:  # a _Record: a dict with the index line's place
        stored = NUMPY_DTYPES.get(rec["dtype"])
        count = 1
        for n in rec["shape"]:
            count *= n
        if "dataset" in rec or stored is None or count * np.dtype(stored).itemsize > SMALL_RECORD:
            return self.run._read(rec, True)
        if "offset" in rec:
            # A segment holds many records: resolved, checked and opened once.
            key = (rec.root, rec["file"])
            seg = self._segments.get(key)
            if seg is None:
                if len(self._segments) >= _SEGMENTS:
                    self._segments.pop(next(iter(self._segments)))[0].close()
                f = _open_regular(_resolve(rec, self._dirs))
                seg = self._segments[key] = (f, os.fstat(f.fileno()).st_size)
            f, size = seg
            start = rec["offset"]
            buf = np.frombuffer(os.pread(f.fileno(), min(rec["nbytes"], max(0, size - start)), start), np.uint8)
            shape, order, dtype, at, n = _packed_layout(
                rec, size, lambda offset: _cached_header(buf, offset - start, self._headers))
            a = buf[at - start:at - start + n * dtype.itemsize].view(dtype).reshape(shape, order=order)
        else:
            a = _read_npy(_resolve(rec, self._dirs), self._headers)
        if rec["dtype"] in _float8.FORMATS:
            a = _float8.widen(a, rec["dtype"], f"{rec.index}:{rec.lineno}")
        return a


# -- one pair ---------------------------------------------------------------


def _empty_row(rank: int, kind: str, name: str, step: int, status: str) -> Dict[str, Any]:
    return {"rank": rank, "kind": kind, "name": name, "step": step, "status": status, "max_abs": math.nan,
            "max_rel": math.nan, "max_ulp": math.nan, "n_bad": None, "cosine": math.nan, "rel_norm": math.nan,
            "floor_rel_norm": math.nan, "_a": -1, "_b": -1, "_detail": "", "_floor": False, "_u": math.nan,
            "_a_zero": False, "_spread": math.nan, "_dtype_a": None, "_dtype_b": None}


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


class Tally:
    """What the command prints, gathered as the rows stream by: a byte per
    record of A (its status), a float32 with a floor (its floor_rel_norm),
    the counts, and the first few rows of each list."""

    def __init__(self, cmp: _Comparer, listed: int = 10) -> None:
        self.cmp = cmp
        n = len(cmp.a.index)
        self.status = np.zeros(n, dtype=np.uint8)
        self.floor = cmp.a2 is not None
        self.frn = np.full(n, np.nan, dtype=np.float32) if self.floor else None
        # Several floor runs: how far apart they are at each record (_diff_floor.spread).
        several = cmp.floors is not None and len(cmp.floors.sides) > 1
        self.spread = np.full(n, np.nan, dtype=np.float32) if several else None
        # Records A and B hold in two dtypes: {(A's, B's): [count, the first row]}.
        self.dtypes: Dict[Tuple[str, str], List[Any]] = {}
        self._dropout: Optional[bool] = None
        self.listed = listed
        self.counts = {s: 0 for s in ("equal", "noise", "differ", "mismatch", "unreadable", "only_a", "only_b")}
        self.first: Optional[Dict[str, Any]] = None
        self.differing: List[Dict[str, Any]] = []
        self.only: Dict[str, List[Dict[str, Any]]] = {"only_a": [], "only_b": []}
        self.only_kinds: Dict[str, Dict[str, int]] = {"only_a": {}, "only_b": {}}
        self.without_floor: List[Dict[str, Any]] = []
        self.n_without_floor = 0
        self.ranks = bool(cmp.a.run.ranks) or bool(cmp.b.run.ranks)
        self.note: Optional[str] = None
        # The other run's budget markers {rank (0 for a single-rank run): k}:
        # a record on one side only below the other's k was given up there.
        self.given_up = {"only_a": _markers(cmp.b.run), "only_b": _markers(cmp.a.run)}
        self.n_given_up = {"only_a": 0, "only_b": 0}

    def add(self, row: Dict[str, Any]) -> None:
        status = row["status"]
        self.counts[status] += 1
        pa = row["_a"]
        if status in ("only_a", "only_b"):
            k = self.given_up[status].get(row["rank"])
            if k is not None and row["step"] < k:
                # Not a difference: the other run's budget gave that step up.
                self.counts[status] -= 1
                self.n_given_up[status] += 1
            else:
                self._only(row, status)
            if status == "only_a":
                self.status[pa] = _CODE[status]
            return
        self.status[pa] = _CODE[status]
        if self.frn is not None and row["_floor"] and not row["_a_zero"]:
            # A record that is 0 in A (a bias initialised to zero) has a
            # floor_rel_norm of inf or 0, a ratio to nothing: it is left out
            # of the step's median and of the uninformative records.
            self.frn[pa] = row["floor_rel_norm"]
            if self.spread is not None:
                self.spread[pa] = row["_spread"]
        if row["_dtype_b"] != row["_dtype_a"] and status != "mismatch":
            seen = self.dtypes.setdefault((row["_dtype_a"], row["_dtype_b"]), [0, row])
            seen[0] += 1
        if self.floor and not row["_floor"] and status not in ("mismatch", "unreadable"):
            self.n_without_floor += 1
            if len(self.without_floor) < self.listed:
                self.without_floor.append(row)
        if status in _DIFFERENCES:
            if len(self.differing) < self.listed:
                self.differing.append(row)
            if status != "unreadable" and (self.first is None or row["step"] < self.first["step"]):
                self.first = row

    def _only(self, row: Dict[str, Any], status: str) -> None:
        if len(self.only[status]) < self.listed:
            self.only[status].append(row)
        kinds = self.only_kinds[status]
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1

    @property
    def differ(self) -> int:
        return sum(self.counts[s] for s in _DIFFERENCES)

    @property
    def compared(self) -> int:
        return sum(v for k, v in self.counts.items() if k not in ("only_a", "only_b"))

    def failed(self, common_only: bool) -> bool:
        return self.differ > 0 or (not common_only and (self.counts["only_a"] + self.counts["only_b"]) > 0)

    def describe(self, row: Dict[str, Any]) -> str:
        return describe(row, row.get("_detail", ""), self.ranks)

    def where(self, row: Dict[str, Any]) -> str:
        return _where(row["kind"], row["name"], row["step"], row["rank"], self.ranks)

    def name_of(self, pa: int) -> str:
        kind, name, _, _, _ = self.cmp.a.meta(pa)
        return _where(kind, name, self.cmp.a.step(pa), self.cmp.a.rank(pa), self.ranks)

    # -- the first divergence ----------------------------------------------

    def first_divergence(self) -> Optional[Dict[str, Any]]:
        """{"rank", "kind", "name", "step", "arises"} of the first divergence, or None."""
        if self.first is None:
            return None
        r = self.first
        return {"rank": r["rank"], "kind": r["kind"], "name": r["name"], "step": r["step"],
                "arises": self.arises(r["_a"])}

    def dropout(self) -> bool:
        """Whether the first divergence is two dropout masks (_diff_dropout)."""
        if self._dropout is None:
            self._dropout = self.first is not None and masks_differ(self.cmp, self.first["_a"])
        return self._dropout

    def floor_disagrees(self) -> Optional[Dict[str, Any]]:
        """Where the floor runs first disagree (_diff_floor.disagreement), or None."""
        return disagreement(self)

    def arises(self, pa: int) -> str:
        """Where the first divergence (A's record `pa`) arises, read from the
        statuses of the records of its rank around it (docs/diff.md)."""
        a = self.cmp.a
        index = a.index
        kinds = np.array([m[0] for m in index.metas] or ["tensor"])
        kind, name, _, shape, _ = a.meta(pa)
        step = a.step(pa)
        on_rank = index.source == index.source[pa]
        steps = index.step[on_rank]
        first_step = int(steps.min()) if steps.size else step
        earlier = steps[steps < step]
        prev = int(earlier.max()) if earlier.size else None
        here = np.flatnonzero(on_rank & (index.step == step))
        here_kind = kinds[index.meta[here]]
        here_status = self.status[here]
        diverging = np.isin(here_status, _DIVERGE)

        def label(i: int) -> str:
            k, n, _, _, _ = a.meta(i)
            return f"{k} {esc(n)}"

        def between(phase: str, among: Optional[Tuple[str, ...]] = None) -> str:
            agree = (here < pa) & np.isin(here_status, _AGREE)
            if among is not None:
                agree &= np.isin(here_kind, among)
            before = here[agree]
            if before.size:
                return f"in the {phase} between {label(int(before[-1]))} and {kind} {esc(name)}"
            return f"in the {phase} before {kind} {esc(name)}"

        if kind in ("param", "buffer") and step == first_step:
            return "in the initial state"
        if prev is not None:
            if kind == "buffer":
                return f"in a buffer: {esc(name)} between steps {prev} and {step}"
            if kind == "param" or bool((diverging & (here_kind == "param")).any()):
                return f"in the update between steps {prev} and {step}"
            if not ((here_kind == "param") & (here_status > 0)).any():
                return (f"between steps {prev} and {step} (record kind param to tell the update from the "
                        "forward)")
        activations_differ = bool((diverging & (here_kind == "activation")).any())
        if kind == "activation":
            # The step's parameters and buffers come before its forward in A's
            # order but are no part of it: the model's last buffer agreeing says
            # nothing of where the forward went wrong.
            return between("forward", ("activation", "tensor"))
        if kind == "tensor":
            ahead = here[here < pa]
            ahead_kind = kinds[index.meta[ahead]]
            lossy = len(shape) == 0 and not activations_differ \
                and not np.isin(ahead_kind, ("activation_grad", "grad")).any() \
                and (bool((ahead_kind == "activation").any()) or "loss" in name.lower())
            return "in the loss" if lossy else f"in a captured tensor {esc(name)}"
        if kind in ("activation_grad", "grad"):
            if activations_differ:
                later = here[diverging & (here_kind == "activation")]
                return f"in the forward (activation {esc(a.meta(int(later[0]))[1])} differs, recorded after it)"
            return between("backward")
        # A param or buffer at the first step is handled above; what is left
        # is a param or buffer with no earlier step on a rank that has one.
        return "in the initial state"

    # -- the floor's findings ---------------------------------------------------

    def saturated_step(self) -> Optional[int]:
        """The first step whose median floor_rel_norm passes SATURATED, or None."""
        if self.frn is None:
            return None
        has = np.flatnonzero(~np.isnan(self.frn))
        if has.size == 0:
            return None
        steps = self.cmp.a.index.step[has]
        values = self.frn[has].astype(np.float64)
        order = np.lexsort((values, steps))
        steps, values = steps[order], values[order]
        starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
        ends = np.r_[starts[1:], len(steps)]
        lo, hi = (starts + ends - 1) // 2, (starts + ends) // 2
        with np.errstate(invalid="ignore"):
            medians = (values[lo] + values[hi]) / 2  # inf + inf is inf; never inf - inf
        past = np.flatnonzero(medians > SATURATED)
        return int(steps[starts[past[0]]]) if past.size else None

    def uninformative(self) -> List[Dict[str, Any]]:
        """The series (rank, kind, name) whose floor_rel_norm is at least
        UNINFORMATIVE at their first step with a floor, in A's order."""
        if self.frn is None:
            return []
        index = self.cmp.a.index
        has = np.flatnonzero(~np.isnan(self.frn))
        if has.size == 0:
            return []
        group = index.meta_key[index.meta[has]].astype(np.int64) * (len(index.sources) + 1) + index.source[has]
        order = np.lexsort((has, index.step[has], group))
        firsts = has[order][np.r_[True, group[order][1:] != group[order][:-1]]]
        firsts = np.sort(firsts[self.frn[firsts] >= UNINFORMATIVE])
        out = []
        for i in firsts.tolist():
            kind, name, _, _, _ = self.cmp.a.meta(i)
            out.append({"rank": self.cmp.a.rank(i), "kind": kind, "name": name, "step": self.cmp.a.step(i)})
        return out

    # -- the lines --------------------------------------------------------------

    def given_up_notes(self) -> List[str]:
        """A line per run whose disk budget gave up steps: which, and that
        they are compared from there."""
        notes = []
        for label, side in (("A", self.cmp.a), ("B", self.cmp.b)):
            below = side.run.given_up_below
            if not below:
                continue
            ks = sorted(set(below.values()))
            where = f"steps below {ks[0]}" if len(ks) == 1 else \
                "steps below " + ", ".join(f"{k} on rank {r}" for r, k in sorted(_markers(side.run).items()))
            notes.append(f"note: {label} gave up {where} (disk budget, KeepLatest): compared from there, "
                         "and at the steps it dumped")
        return notes

    def lines(self, common_only: bool = False) -> List[str]:
        lines: List[str] = self.given_up_notes()
        first = self.first
        if first is not None:
            arises = self.arises(first["_a"])
            where = _where(first["kind"], first["name"], first["step"], first["rank"], self.ranks)
            said = f"{DROPOUT}; " if self.dropout() else ""
            lines.append(f"first divergence: {where}: arises {arises}; {said}{_what(first, first['_detail'])}")
            pa = first["_a"]
            agreeing = np.flatnonzero(np.isin(self.status[:pa], _AGREE))
            if agreeing.size:
                lines.append("  last agreeing before it: " + self.name_of(int(agreeing[-1])))
            codes = [_CODE[s] for s in _DIFFERENCES]
            after = pa + 1 + np.flatnonzero(np.isin(self.status[pa + 1:], codes))[:3]
            for i in after.tolist():
                lines.append("  then: " + self.describe(self.cmp.pair(i, full=True)))
        differ = self.differ
        if differ > 1 or (differ and first is None):
            lines.append(f"differing records ({differ}, in A's order):")
            lines.extend("  " + self.describe(r) for r in self.differing)
            if differ > len(self.differing):
                lines.append(f"  ... and {differ - len(self.differing)} more")
        for (dtype_a, dtype_b), (n, row) in self.dtypes.items():
            judged = coarser(dtype_a, dtype_b)
            lines.append(f"dtype {esc(dtype_a)} vs {esc(dtype_b)} (A's vs B's, judged as {judged}): {n} "
                         f"record{'s' if n != 1 else ''}, e.g. {self.where(row)}")
        if self.floor:
            if self.note:
                lines.extend(self.note.splitlines())
            if self.n_without_floor:
                lines.append(f"without floor ({self.n_without_floor}: not in A2, judged by --rtol/--atol):")
                lines.extend("  " + self.where(r) for r in self.without_floor)
                if self.n_without_floor > len(self.without_floor):
                    lines.append(f"  ... and {self.n_without_floor - len(self.without_floor)} more")
            k = self.saturated_step()
            if k is not None:
                lines.append(f"floor saturated from step {k}: the median floor_rel_norm passes {SATURATED:g}; "
                             "differences after it are no longer resolved")
            disagree = self.floor_disagrees()
            if disagree is not None:
                lines.append(disagreement_line(disagree, self.ranks))
            useless = self.uninformative()
            if useless:
                e = useless[0]
                lines.append(f"uninformative (rounding noise in A itself): {len(useless)} records, "
                             f"e.g. {e['kind']} {esc(e['name'])}")
        side_runs = {"only_a": ("A", "B", self.cmp.b), "only_b": ("B", "A", self.cmp.a)}
        for status, (mine, other, other_side) in side_runs.items():
            rows = self.only[status]
            total = self.counts[status]
            if not total:
                continue
            lines.append(f"only in {mine} ({total}):")
            lines.extend("  " + self.where(r) for r in rows)
            if total > len(rows):
                lines.append(f"  ... and {total - len(rows)} more")
            # A kind the other run does not record at all: say how to record it.
            present = {k for k, _ in other_side.index.keys}
            for kind, n in self.only_kinds[status].items():
                if kind not in present:
                    lines.append(f"only in {mine}: {n} {kind} record{'s' if n != 1 else ''} (record kind {kind} "
                                 f"in {other}: Options::kinds, or tensortap.torch.watch(kinds=...))")
        for status, (mine, other) in (("only_a", ("A", "B")), ("only_b", ("B", "A"))):
            n = self.n_given_up[status]
            if n:
                lines.append(f"given up by {other}: {n} record{'s' if n != 1 else ''} of {mine}, of steps {other}'s "
                             f"disk budget gave up (not counted as only in {mine})")
        noise = f", noise {self.counts['noise']}" if self.floor else ""
        lines.append(f"compared {self.compared}, differ {differ}{noise}, only in A {self.counts['only_a']}, "
                     f"only in B {self.counts['only_b']}")
        return lines


def _markers(run: Any) -> Dict[int, int]:
    """A run's budget markers {rank (0 for a single-rank run): k}, as the
    diff names ranks."""
    return {0 if r is None else int(r): k for r, k in getattr(run, "given_up_below", {}).items()}


def describe(row: Dict[str, Any], detail: str = "", ranks: bool = False) -> str:
    """One record's comparison in words, for the command and the page;
    `ranks`: the runs have several (the rank is named)."""
    return _where(row["kind"], row["name"], row["step"], row["rank"], ranks) + ": " + _what(row, detail)


def _what(row: Dict[str, Any], detail: str) -> str:
    status = row["status"]
    if status == "mismatch":
        return f"shape or dtype differs ({detail})"
    if status == "unreadable":
        return f"unreadable: {detail}"
    if status == "only_a":
        return "only in A"
    if status == "only_b":
        return "only in B"
    text = (f"{row['n_bad']} element(s) beyond tolerance, max |a-b| {_num(row['max_abs'])}, "
            f"max rel {_num(row['max_rel'])}")
    if not math.isnan(row["max_ulp"]):
        text += f", max ulp {_num(row['max_ulp'])}"
    text += f", cosine {_num(row['cosine'], 9)}, rel_norm {_num(row['rel_norm'])}"
    if not math.isnan(row.get("floor_rel_norm", math.nan)):
        text += f", floor_rel_norm {_num(row['floor_rel_norm'])}"
    dtype_a, dtype_b = row.get("_dtype_a"), row.get("_dtype_b")
    if dtype_a and dtype_b and dtype_a != dtype_b:
        text += f", dtype {esc(dtype_a)} vs {esc(dtype_b)}"
    if status == "noise":
        text += " (noise)"
    return text


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
