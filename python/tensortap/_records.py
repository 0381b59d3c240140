"""Index records and stats_series.jsonl lines: what makes a JSON value one,
and the records as Run.records gives them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Union, overload

from ._base import KINDS, _is_int, _is_int64, _json_type, _short

if TYPE_CHECKING:
    from ._index_columns import Columns

# The members every index line has; HDF5 records add "dataset" and "row",
# packed ones "offset" and "nbytes".
_REQUIRED = ("step", "kind", "name", "dtype", "shape", "file")


def _record_problem(rec: Any) -> Optional[str]:
    """Why the JSON value `rec` is not an index record, or None."""
    if not isinstance(rec, dict):
        return f"{_json_type(rec)}, not an object"
    missing = [k for k in _REQUIRED if k not in rec]
    if "dataset" in rec and "row" not in rec:
        missing.append("row")
    if ("offset" in rec) != ("nbytes" in rec):
        missing.append("nbytes" if "offset" in rec else "offset")
    if missing:
        return "no " + ", ".join(f'"{k}"' for k in missing)
    if not _is_int(rec["step"]):
        return f'"step" is {_json_type(rec["step"])}, not an integer'
    if not _is_int64(rec["step"]):
        return f'"step" {rec["step"]} is out of the 64-bit range'
    if not isinstance(rec["kind"], str) or rec["kind"] not in KINDS:
        return f'unknown kind {_short(rec["kind"])}'
    for k in ("name", "dtype", "file"):
        if not isinstance(rec[k], str):
            return f'"{k}" is {_json_type(rec[k])}, not a string'
    if not rec["file"]:
        return '"file" is empty'
    shape = rec["shape"]
    if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        return '"shape" is not an array of sizes'
    # LibTorch counts elements in int64: more is no tensor, and would overflow
    # the byte counts of `inspect`. Stopped early, so that a forged shape of
    # many huge sizes costs no big-number product.
    # 16 bytes an element at most (complex128): the record's bytes fit too.
    if 0 not in shape:
        numel = 1
        for n in shape:
            numel *= n
            if numel >= 1 << 59:
                return '"shape" has 2**59 elements or more'
    if "dataset" in rec:
        if not isinstance(rec["dataset"], str):
            return f'"dataset" is {_json_type(rec["dataset"])}, not a string'
        if not _is_int64(rec["row"]) or rec["row"] < 0:
            return '"row" is not a row number'
    if "offset" in rec:
        for k in ("offset", "nbytes"):
            if not _is_int64(rec[k]) or rec[k] < 0:
                return f'"{k}" is not a byte count'
    return None


def _series_problem(line: Any) -> Optional[str]:
    """Why the JSON value `line` is not a stats_series.jsonl line, or None."""
    if not isinstance(line, dict):
        return f"{_json_type(line)}, not an object"
    missing = [k for k in ("series", "kind", "name") if k not in line]
    if missing:
        return "no " + ", ".join(f'"{k}"' for k in missing)
    if not _is_int(line["series"]):
        return f'"series" is {_json_type(line["series"])}, not an integer'
    if not 0 <= line["series"] < (1 << 31):
        return f'"series" {line["series"]} is not a series number'
    if not isinstance(line["kind"], str) or line["kind"] not in KINDS:
        return f'unknown kind {_short(line["kind"])}'
    if not isinstance(line["name"], str):
        return f'"name" is {_json_type(line["name"])}, not a string'
    return None


class _Record(dict):
    """An index line. It equals the dict of the line; it also remembers the line,
    so that a refusal can name it, and the rank directory its file must lie in."""

    __slots__ = ("index", "lineno", "root")
    index: str   # the index file's path
    lineno: int  # the line's number in it
    root: str    # the real path of the rank directory its file must lie in


class _Records(Sequence[_Record]):
    """Run.records: the index's records as dicts (_Record), each built when it
    is read. It equals a list of the same dicts."""

    def __init__(self, index: Columns) -> None:
        self._index = index

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def __getitem__(self, i: int) -> _Record: ...

    @overload
    def __getitem__(self, i: slice) -> List[_Record]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[_Record, List[_Record]]:
        if isinstance(i, slice):
            return [self._index.record(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("record index out of range")
        return self._index.record(i % n)

    def __iter__(self) -> Iterator[_Record]:
        return map(self._index.record, range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, tuple, _Records)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        if len(self) > 10:
            return f"<{len(self)} records: {self[0]!r}, ..., {self[-1]!r}>"
        return repr(list(self))
