"""A run's side of a comparison (_Side: its records read as arrays, a small
record whole, a large one in segments), the comparison's options and its
rows' columns and statuses."""

from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from .. import _float8
from .._arrays import _given_up
from .._base import NUMPY_DTYPES, GivenUpError, RunError
from .align import Selection
from .._npy import _cached_header, _read_npy
from .._files import _open_regular
from .._packed import _packed_layout
from .._paths import _resolve


COLUMNS = ("rank", "kind", "name", "step", "status", "max_abs", "max_rel", "max_ulp", "n_bad", "cosine",
           "rel_norm", "floor_rel_norm")


# A status per record of A, one byte: what the summary reads back at the end.
_CODE = {"equal": 1, "noise": 2, "differ": 3, "mismatch": 4, "unreadable": 5, "only_a": 6}


_AGREE = (1, 2)


_DIVERGE = (3, 4)          # where the first divergence may be


_DIFFERENCES = ("differ", "mismatch", "unreadable")


PathOrRun = Union[str, "os.PathLike[str]", Any]


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


def _empty_row(rank: int, kind: str, name: str, step: int, status: str) -> Dict[str, Any]:
    return {"rank": rank, "kind": kind, "name": name, "step": step, "status": status, "max_abs": math.nan,
            "max_rel": math.nan, "max_ulp": math.nan, "n_bad": None, "cosine": math.nan, "rel_norm": math.nan,
            "floor_rel_norm": math.nan, "_a": -1, "_b": -1, "_detail": "", "_floor": False, "_u": math.nan,
            "_a_zero": False, "_spread": math.nan, "_dtype_a": None, "_dtype_b": None}
