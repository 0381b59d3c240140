"""A run's index as columns.

A run of a million records has a million index lines. As a dict each they
took 1.2 KB apiece (1.2 GB) and 7 s to read. Here a record is a row of a
few NumPy arrays (step, offset, nbytes, line) and integer codes into tables
of what repeats: a "meta" (kind, name, dtype, shape, the file's directory)
per name, file names (one per step for .npy, one per segment for packed),
HDF5 datasets. A record's dict is built only when asked for
(Index.record).

Lines in the exact form tensortap's writer prints them
(writers/src/lines_file.cpp: no spaces, members in a fixed order) are read a
block at a time by one regular expression, and what repeats in them is
decoded and checked once per distinct text. A block with any other line
(written by hand, damaged, torn) is read line by line with json.loads and
_record_problem, with the same warnings as ever.

A rank's index may be in several files (Budget::KeepLatest): index.jsonl,
then index.1.jsonl, index.2.jsonl, ... in the order of their numbers, any of
them deleted by the recorder once all its steps were given up. Their
records are read in that order, each remembering its file (the column
"part"). run.json's budget marker "given_up_below" k hides, when the index
is built, every record of a step below k but those of the steps a dump
kept whose files are still there (Index.give_up): no view of the run sees the
records given up, nor opens their files.
"""

from __future__ import annotations

import json
import os
import re
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

from ._base import _reason, _warn
from . import _files
from ._names import INDEX, index_segment_name, index_segment_number
from ._index_columns import OPTIONAL, Columns, Marker, Meta  # noqa: F401
from ._records import _Record, _record_problem

_T = TypeVar("_T")

# Bytes read at a time: bounds what a block's parse holds (its match tuples
# take about three times the text), however long the index.
_BLOCK = 4 << 20

# A JSON string's body, escapes included but no raw quote or newline;
# possessive, so that a line that does not match fails fast. (Not a
# possessive repeat of a group holding possessive repeats: Python 3.11.2
# matches those wrongly.)
_STR = rb'[^"\\\n]*+(?:\\.[^"\\\n]*+)*+'
# A JSON integer that fits in int64 without checking: 18 digits at most.
_UINT = rb'(0|[1-9][0-9]{0,17})'
# One index line as the writer prints it. Groups: step; the meta (kind, name,
# dtype, shape and the file's directory, as JSON text); the file's last
# component; offset and nbytes (packed); dataset and row (HDF5).
_LINE = re.compile(
    rb'^\{"step":(-?(?:0|[1-9][0-9]{0,17})),'
    rb'("kind":"[a-z_]*+","name":"' + _STR + rb'","dtype":"' + _STR + rb'","shape":\[[0-9,]*+\],'
    rb'"file":"(?:[^"\\\n/]*+(?:\\.[^"\\\n/]*+)*+/)*)'
    rb'([^"\\\x00-\x1f/]*+)"'
    rb'(?:,"offset":' + _UINT + rb',"nbytes":' + _UINT +
    rb'|,"dataset":"(' + _STR + rb')","row":' + _UINT + rb')?\}\n', re.M)

# The members a record's columns hold; a line with others keeps its dict.
_MEMBERS = frozenset(("step", "kind", "name", "dtype", "shape", "file", "offset", "nbytes", "dataset", "row"))
# Columns only some formats have (Columns, with Meta and Marker, where the
# Run and the tests look for them).
_OPTIONAL = OPTIONAL


class Index(Columns):
    """The index files of a run read into columns (Columns says what they
    hold): sized once from above (`capacity` records), each file appended
    by read(part), then give_up() and finish()."""

    def __init__(self, capacity: int, sources: List[Tuple[str, str, Optional[int]]],
                 parts: Optional[List[Tuple[str, int]]] = None) -> None:
        self.n = 0
        self.capacity = capacity
        # Sized once, from above, and cut to size at the end: built by
        # appending blocks and joining them, the columns left their blocks'
        # holes in the heap, and kept twice their size.
        # A line number is below the files' bytes, capacity * _SHORTEST_RECORD.
        line_type = np.int32 if capacity * _SHORTEST_RECORD < (1 << 31) else np.int64
        self.cols: Dict[str, np.ndarray] = {
            "step": np.empty(capacity, np.int64), "meta": np.empty(capacity, np.int32),
            "base": np.empty(capacity, np.int32), "line": np.empty(capacity, line_type),
            "source": np.empty(capacity, np.min_scalar_type(max(1, len(sources))))}
        # (index file, source): a rank's index.jsonl, then its segments.
        self.parts = parts if parts is not None else [(path, s) for s, (path, _, _) in enumerate(sources)]
        # Room for the segments a live run adds while it is read (read()).
        self.cols["part"] = np.empty(capacity, np.min_scalar_type(max(1, len(self.parts) + _LATE_SEGMENTS)))
        self.types = {"offset": np.int64, "nbytes": np.int64, "dataset": np.int32, "row": np.int64}
        self.sources = sources  # (index path, real rank directory, rank)
        self.metas: List[Meta] = []
        self.bases: List[str] = []      # a file's last component
        self.datasets: List[str] = []   # HDF5 dataset paths
        self.extra: Dict[int, _Record] = {}  # position -> its record, for lines with members of their own
        self.hidden: Dict[Optional[int], int] = {}
        self._meta_code: Dict[Meta, int] = {}
        self._base_code: Dict[str, int] = {}
        self._dataset_code: Dict[str, int] = {}

    # -- reading ------------------------------------------------------------

    def read(self, part: int) -> None:
        """Appends the records of the index file parts[part]; a file that
        does not exist (or no longer: the recorder deletes a segment whose
        steps it gave up) holds none. A segment (index.<n>.jsonl) is opened
        only as a regular file, never through a symbolic link (RunError, as
        index.jsonl that is not a regular file)."""
        path = self.parts[part][0]
        segment = os.path.basename(path) != INDEX
        if not segment and not os.path.exists(path):
            return
        try:
            f = _files._open_regular(path, follow=not segment)
        except FileNotFoundError:
            return
        tokens = _Tokens()
        lineno = 1  # of the block's first line
        with f:
            pieces = []  # of a line not ended yet: joined once it is, not per read
            while True:
                data = f.read(_BLOCK)
                if not data:
                    break
                cut = data.rfind(b"\n") + 1
                if cut == 0:  # a line longer than a block
                    pieces.append(data)
                    continue
                block = b"".join(pieces) + data[:cut] if pieces else data[:cut]
                pieces = [data[cut:]] if cut < len(data) else []
                n = block.count(b"\n")
                if not self._fast_block(block, n, lineno, part, tokens):
                    self._slow_lines(block.split(b"\n")[:-1], lineno, part, last=False)
                lineno += n
            rest = b"".join(pieces)
            if rest:
                # No newline after it: a line torn by a crash (skipped without a
                # word), or a last line written whole but not ended (kept).
                self._slow_lines([rest], lineno, part, last=True)

    def _fast_block(self, block: bytes, n: int, lineno: int, part: int, tokens: _Tokens) -> bool:
        """Appends a block of whole lines if every one is in the writer's form
        and checks out; False, appending nothing, if one is not."""
        rows = _LINE.findall(block)
        if len(rows) != n:
            return False
        steps, metas, bases, offsets, nbytes, datasets, hrows = zip(*rows)
        meta = tokens.codes(metas, tokens.meta, self._fast_meta)
        base = tokens.codes(bases, tokens.base, self._fast_base)
        if meta is None or base is None:
            return False
        dataset = None
        if datasets.count(b"") != n:
            dataset = tokens.codes(datasets, tokens.dataset, self._fast_dataset)
            if dataset is None:
                return False
        # "file" is the meta's directory and the base: both empty is no file.
        empty = self._base_code.get("")
        if empty is not None and any(self.metas[m][4] == "" for m in set(meta[base == empty].tolist())):
            return False
        cols = {"step": _ints(steps), "meta": meta, "base": base, "line": np.arange(lineno, lineno + n)}
        if offsets.count(b"") != n:
            cols["offset"], cols["nbytes"] = _ints(offsets, -1), _ints(nbytes, -1)
        if dataset is not None:
            cols["dataset"], cols["row"] = dataset, _ints(hrows, -1)
        self._append(cols, n, part)
        return True

    def _fast_meta(self, token: bytes) -> Optional[int]:
        """The code of a line's meta text, or None if it is not valid."""
        try:
            d = json.loads((b"{" + token + b'"}').decode("utf-8"))
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return None
        # The checks of a whole line; step and the file's base are checked apart.
        if _record_problem(dict(d, step=0, file=d["file"] + "x")) is not None:
            return None
        return self._meta(d["kind"], d["name"], d["dtype"], d["shape"], d["file"])

    def _fast_base(self, token: bytes) -> Optional[int]:
        try:
            return self._base(token.decode("utf-8"))
        except UnicodeDecodeError:
            return None

    def _fast_dataset(self, token: bytes) -> Optional[int]:
        if not token:
            return -1  # a line without one, in a block with some
        try:
            return self._dataset(json.loads(b'"' + token + b'"'))
        except (ValueError, RecursionError):
            return None

    def _slow_lines(self, lines: List[bytes], lineno: int, part: int, last: bool) -> None:
        """Lines read one by one with json.loads and _record_problem: a
        RunWarning for each bad one but a torn last line (a crash tears it)."""
        path, source = self.parts[part]
        _, root, rank = self.sources[source]
        cols: Dict[str, List[int]] = {k: [] for k in ("step", "meta", "base", "line") + _OPTIONAL}
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            where = f"{path}:{lineno + i}"
            try:
                value = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                if not last:
                    _warn(f"{where}: skipped: not UTF-8")
                continue
            except (ValueError, RecursionError) as e:
                if not last:
                    _warn(f"{where}: skipped: not a JSON line ({_reason(e)})")
                continue
            problem = _record_problem(value)
            if problem:
                _warn(f"{where}: skipped: {problem}")
                continue
            if not set(value) <= _MEMBERS:
                rec = _Record(value)
                rec.index, rec.lineno, rec.root = path, lineno + i, root
                if rank is not None:
                    rec["rank"] = rank
                self.extra[self.n + len(cols["step"])] = rec
            head, sep, tail = value["file"].rpartition("/")
            cols["step"].append(value["step"])
            cols["meta"].append(self._meta(value["kind"], value["name"], value["dtype"], value["shape"],
                                           head + sep))
            cols["base"].append(self._base(tail))
            cols["line"].append(lineno + i)
            cols["offset"].append(value.get("offset", -1))
            cols["nbytes"].append(value.get("nbytes", -1))
            cols["dataset"].append(self._dataset(value["dataset"]) if "dataset" in value else -1)
            cols["row"].append(value.get("row", -1))
        n = len(cols["step"])
        if n:
            self._append({k: np.array(v, dtype=np.int64) for k, v in cols.items()
                          if k not in _OPTIONAL or any(x >= 0 for x in v)}, n, part)

    def _append(self, cols: Dict[str, np.ndarray], n: int, part: int) -> None:
        if self.n + n > self.capacity:
            # More records than the bytes allowed for: the file grew since.
            # New arrays that own their memory (np.resize may return a view,
            # which finish() cannot cut to size in place): a live run's
            # index grows while it is read.
            self.capacity = max(2 * self.capacity, self.n + n)
            grown = {}
            for k, v in self.cols.items():
                grown[k] = np.empty(self.capacity, v.dtype)
                grown[k][:self.n] = v[:self.n]
            self.cols = grown
        at = slice(self.n, self.n + n)
        for k, v in cols.items():
            if k not in self.cols:
                # Written up to here only: the pages past it are not touched yet.
                self.cols[k] = np.empty(self.capacity, self.types[k])
                self.cols[k][:self.n] = -1
            self.cols[k][at] = v
        for k in _OPTIONAL:
            if k in self.cols and k not in cols:
                self.cols[k][at] = -1
        self.cols["source"][at] = self.parts[part][1]
        self.cols["part"][at] = part
        self.n += n

    @staticmethod
    def _intern(codes: Dict[_T, int], values: List[_T], value: _T) -> int:
        # The code of `value` in `values`, appended on first sight.
        code = codes.get(value)
        if code is None:
            code = codes[value] = len(values)
            values.append(value)
        return code

    def _meta(self, kind: str, name: str, dtype: str, shape: Sequence[int], directory: str) -> int:
        return self._intern(self._meta_code, self.metas, (kind, name, dtype, tuple(shape), directory))

    def _base(self, base: str) -> int:
        return self._intern(self._base_code, self.bases, base)

    def _dataset(self, dataset: str) -> int:
        return self._intern(self._dataset_code, self.datasets, dataset)

class _Tokens:
    """Texts already decoded while reading one index file: meta, base and
    dataset texts to their codes."""

    def __init__(self) -> None:
        self.meta: Dict[bytes, int] = {}
        self.base: Dict[bytes, int] = {}
        self.dataset: Dict[bytes, int] = {}

    @staticmethod
    def codes(tokens: Sequence[bytes], memo: Dict[bytes, int],
              make: Callable[[bytes], Optional[int]]) -> Optional[np.ndarray]:
        """The codes of `tokens` as an int32 array, a new text's made by `make`
        (None: not valid); None if a text is not valid."""
        codes = list(map(memo.get, tokens))
        if None in codes:
            for t in set(tokens).difference(memo):
                code = make(t)
                if code is None:
                    return None
                memo[t] = code
            codes = list(map(memo.__getitem__, tokens))
        return np.array(codes, dtype=np.int32)


def _ints(texts: Sequence[bytes], missing: Optional[int] = None) -> np.ndarray:
    """int64 of the digit strings `texts`; b"" (a group that did not match) as
    `missing`."""
    if missing is not None and b"" in texts:
        return np.fromiter((int(t) if t else missing for t in texts), np.int64, len(texts))
    return np.fromiter(map(int, texts), np.int64, len(texts))


# No index line that is a record is shorter than this many bytes (the
# shortest, {"step":0,"kind":"grad","name":"","dtype":"","shape":[],"file":"x"},
# takes 68 with its newline): columns sized from the files' bytes over it
# hold every record, and their pages never written never take memory.
_SHORTEST_RECORD = 48


def _capacity(paths: Iterable[str]) -> int:
    size = 0
    for path in paths:
        try:
            # A segment is never followed through a link: not sized by one either.
            size += os.stat(path, follow_symlinks=os.path.basename(path) == INDEX).st_size
        except OSError:
            pass  # no index: no records
    return size // _SHORTEST_RECORD + 16


# Segments that appeared while a live run's index was read, read at most.
_LATE_SEGMENTS = 8


def segments(directory: str) -> List[str]:
    """The paths of a rank directory's index files past index.jsonl,
    index.<n>.jsonl, in the order of n (10 after 9); names that only look
    like one (index.01.jsonl, index.0.jsonl, index.1.jsonl.tmp) are not."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    numbers = sorted(n for n in map(index_segment_number, names) if n is not None)
    return [os.path.join(directory, index_segment_name(n)) for n in numbers]


def read(dirs: Dict[Optional[int], str], markers: Optional[Dict[Optional[int], Marker]] = None) -> Columns:
    """The Index of the run directories {rank: directory}, ranks in order
    (None, a single-rank run, first), each rank's index.jsonl then its
    segments; the records given up under `markers` ({rank: (k, the steps its
    dumps kept)}, Index.give_up) hidden."""
    ordered = sorted(dirs.items(), key=lambda kv: -1 if kv[0] is None else kv[0])
    sources = [(os.path.join(d, INDEX), os.path.realpath(d), rank) for rank, d in ordered]
    parts = []
    for s, (rank, d) in enumerate(ordered):
        parts.append((sources[s][0], s))
        parts.extend((path, s) for path in segments(d))
    index = Index(_capacity(path for path, _ in parts), sources, parts)
    for part in range(len(parts)):
        index.read(part)
    # A live run under KeepLatest may roll to a new segment and give up the
    # listed ones while they are read: the newest lines are then in a
    # segment listed after. Read those too, so that an open never shows the
    # run emptier than it was (a live reader saw an empty run otherwise).
    listed = len(parts)
    while len(parts) - listed < _LATE_SEGMENTS:
        known = {path for path, _ in parts}
        late = [(path, s) for s, (rank, d) in enumerate(ordered) for path in segments(d) if path not in known]
        if not late:
            break
        for item in late[:_LATE_SEGMENTS - (len(parts) - listed)]:
            parts.append(item)
            index.read(len(parts) - 1)
    markers = markers or {}
    index.give_up({s: markers[rank] for s, (_, _, rank) in enumerate(sources) if rank in markers})
    return index.finish()
