"""Read tensortap runs with NumPy (and h5py for HDF5 runs).

    import tensortap
    run = tensortap.open("runs/exp1")
    run.kinds()                                   # ['activation', 'grad', ...]
    run.names("grad")                             # ['fc1.bias', 'fc1.weight', ...]
    run.steps("fc1.weight", kind="grad")          # [0, 10, 20, ...]
    g = run.load("fc1.weight", 10, kind="grad")   # np.ndarray, memory-mapped (.npy)
    w = run.series("fc1.weight", kind="grad")     # [n_steps, 128, 32]
    run.records                                   # the index, one dict per record
    st = run.stats("fc1.weight", "grad")          # {"step": [...], "min": [...], "nan": [...], ...}
    run.dumps                                     # the flight recorder's dumps (dumps.jsonl, run.json)
    run.index_frame(), run.stats_frame()          # pandas DataFrames (python3-pandas)
    run.series("hidden", "activation", lazy=True) # a dask array, read when computed (python3-dask)
    run.to_xarray("grad", lazy=True)              # an xarray Dataset (python3-xarray)

A run written by several ranks (rank<r>/ directories) opens as one: pass
rank=r to look at one rank; series() without a rank stacks them all on a
leading rank axis.

A damaged index line (torn by a full disk, garbage, not a record) is skipped
with a RunWarning naming the file and line; an index line whose file lies
outside its run directory is refused with a RunError when it is read.
"""

import builtins
import io
import json
import mmap
import os
import re
import stat
import threading
import warnings
from collections.abc import Sequence

import numpy as np

from . import _index
from . import _float8

__all__ = ["open", "Run", "KINDS", "STATS_FIELDS", "RunError", "RunWarning"]
__version__ = "0.1.0"

KINDS = ("activation", "activation_grad", "param", "buffer", "grad", "tensor")

# The columns of stats.npy after "step" and "series", in order.
STATS_FIELDS = ("min", "max", "mean", "std", "norm", "nan", "posinf", "neginf", "zeros", "numel")

# NumPy dtypes of the arrays the reader returns, by the index's dtype.
# bfloat16 is stored as float32; a float8 is stored as its bytes (uint8) and
# returned widened to float32 (_float8.py); both exactly.
NUMPY_DTYPES = {
    "bool": "bool", "uint8": "uint8", "int8": "int8", "int16": "int16", "int32": "int32",
    "int64": "int64", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "float32": "float32", "float64": "float64",
    "complex64": "complex64", "complex128": "complex128", "bfloat16": "float32",
    "float8_e4m3fn": "float32", "float8_e5m2": "float32", "float8_e4m3fnuz": "float32",
    "float8_e5m2fnuz": "float32", "float8_e8m0fnu": "float32",
}


class RunError(ValueError):
    """A run directory that cannot be read as asked."""


class RunWarning(UserWarning):
    """A damaged line of a run directory, skipped; the rest of the run is read."""


def open(path, rank=None):  # noqa: A001 - the documented name
    """Opens the run directory `path`; `rank` restricts it to one rank."""
    return Run(path, rank=rank)


class Run:
    """A run directory written by tensortap, in either format, one rank or several."""

    def __init__(self, path, rank=None):
        self.path = os.fspath(path)
        ranks = _find_ranks(self.path)
        if rank is not None:
            if rank not in ranks:
                raise RunError(f"{self.path}: no rank {rank}; ranks: {sorted(r for r in ranks if r is not None)}")
            ranks = {rank: ranks[rank]}
        self._dirs = ranks  # rank (None for a single-rank run) -> directory
        self.ranks = sorted(r for r in ranks if r is not None)
        self.infos = {r: _read_json(os.path.join(d, "run.json")) for r, d in ranks.items()}
        self.info = self.infos[min(self.infos, key=lambda r: -1 if r is None else r)]
        # Columns, not a dict per line: a million lines are tens of MB, not GB.
        self._index = _index.read(ranks)
        self._h5 = {}
        self._h5_lock = threading.Lock()

    def __repr__(self):
        return f"tensortap.Run({self.path!r}, {len(self._index)} records)"

    @property
    def records(self):
        """The index, one dict per record (with "rank" on a multi-rank run), in
        the order of the index files: a sequence that builds each dict when it
        is read, so that a run of a million records does not hold a million."""
        return _Records(self._index)

    @property
    def closed(self):
        """Whether every rank closed its run cleanly (False after a crash or while running)."""
        # Only JSON's true: a damaged run.json's "false" (a string) is truthy.
        return all(i.get("closed", False) is True for i in self.infos.values())

    def kinds(self):
        """The kinds present, in tensortap's order."""
        present = {k for k, _ in self._index.keys}
        return [k for k in KINDS if k in present]

    def names(self, kind=None):
        """The sorted names captured, of one kind or of all."""
        return sorted({n for k, n in self._index.keys if kind is None or k == kind})

    def steps(self, name, kind, rank=None):
        """The sorted steps at which `name` was captured as `kind` (on any rank, or on `rank`)."""
        by_rank = self._positions(name, kind)
        if rank is not None:
            return self._index.step[self._rank_records(by_rank, name, kind, rank)].tolist()
        return np.unique(self._index.step[np.concatenate(list(by_rank.values()))]).tolist()

    def load(self, name, step, kind, rank=None, mmap=True):
        """The array of `name` at `step`; memory-mapped (.npy) unless mmap=False.
        On a multi-rank run, `rank` defaults to the lowest rank that has it.

        A memory-mapped array reads its file when used: if the file is
        truncated or deleted-and-shrunk afterwards (an `overwrite` rerun, a
        full disk's cleanup), touching the array kills Python with SIGBUS.
        Pass mmap=False (or copy the array) to keep it past such changes."""
        by_rank = self._positions(name, kind)
        ranks = [rank] if rank is not None else sorted(by_rank, key=lambda r: -1 if r is None else r)
        for r in ranks:
            pos = self._rank_records(by_rank, name, kind, r)
            # Compared in Python, as the index's values: step may be any number.
            for i, s in zip(pos.tolist(), self._index.step[pos].tolist()):
                if s == step:
                    return self._read(self._index.record(i), mmap)
        raise KeyError(f"{self.path}: no {kind} record of {name!r} at step {step}"
                       + (f" on rank {rank}" if rank is not None else ""))

    def series(self, name, kind, rank=None, lazy=False):
        """Every captured step of `name` stacked into one array: [n_steps, *shape];
        on a multi-rank run without `rank`, [n_ranks, n_steps, *shape]. With
        lazy=True, a dask array of the same shape, one chunk per record, read
        (memory-mapped where the format allows) only when computed."""
        if lazy:
            from . import frames

            return frames.lazy_series(self, name, kind, rank)
        by_rank = self._lookup(name, kind)
        if rank is None and self.ranks:
            per_rank = [self._stack(self._rank_records(by_rank, name, kind, r), name, kind) for r in self.ranks]
            steps = [self.steps(name, kind, rank=r) for r in self.ranks]
            if any(s != steps[0] for s in steps):
                raise RunError(f"{name!r} ({kind}) was captured at different steps on different ranks; "
                               "pass rank=")
            shapes = sorted({a.shape[1:] for a in per_rank})
            if len(shapes) > 1:
                raise RunError(f"{name!r} ({kind}) has different shapes on different ranks: {shapes}; pass rank=")
            return np.stack(per_rank)
        return self._stack(self._rank_records(by_rank, name, kind, rank), name, kind)

    @property
    def dumps(self):
        """The flight recorder's dumps and the triggers' marks: dicts with "step",
        "reason" ("nan", "inf", "user" or the rule's kind) and "steps" (the steps
        written), and for a rule "kind", "name", "trigger", "value", "median"; on
        a multi-rank run each also has "rank". A closed run's come from
        run.json's "dumps", which close() writes whole; a run still going or
        cut short (a crash), from dumps.jsonl, where each dump is appended as it
        is made (a torn last line is skipped, another bad line skipped with a
        RunWarning); a run of a tensortap before dumps.jsonl, from run.json."""
        out = []
        for r, info in sorted(self.infos.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
            for d in _rank_dumps(self._dirs[r], info):
                out.append(dict(d, rank=r) if r is not None else dict(d))
        return out

    def stats_table(self, rank=None):
        """The whole statistics table of one rank: a structured array with fields
        step, series, min, max, mean, std, norm, nan, posinf, neginf, zeros, numel,
        and the series' names: {series: (kind, name)}. A stats.npy that is empty,
        truncated or not such a table raises RunError; a damaged line of
        stats_series.jsonl is skipped with a RunWarning."""
        if rank is None and self.ranks:
            raise RunError(f"{self.path} has ranks {self.ranks}: pass rank=")
        if rank not in self._dirs:
            raise RunError(f"{self.path}: no rank {rank}")
        d = self._dirs[rank]
        table_path = os.path.join(d, "stats.npy")
        if not os.path.exists(table_path):
            raise RunError(f"{d}: no statistics (stats.npy); the run was made without Options::stats_every")
        table = _read_stats_table(table_path)
        series = {}
        series_path = os.path.join(d, "stats_series.jsonl")
        for lineno, line in _read_lines(series_path):
            problem = _series_problem(line)
            if problem:
                _warn(f"{series_path}:{lineno}: skipped: {problem}")
                continue
            series[line["series"]] = (line["kind"], line["name"])
        return table, series

    def stats(self, name, kind, rank=None):
        """The statistics of `name` (of `kind`) over steps, as a dict of NumPy arrays
        with keys step, min, max, mean, std, norm, nan, posinf, neginf, zeros, numel,
        sorted by step. min, max, mean, std (ddof=0) and norm (L2) are over the finite
        values; nan, posinf, neginf and zeros are counts. On a multi-rank run without
        `rank`, each array has a leading rank axis."""
        if kind not in KINDS:
            raise RunError(f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
        if rank is None and self.ranks:
            per_rank = [self.stats(name, kind, rank=r) for r in self.ranks]
            if any(not np.array_equal(p["step"], per_rank[0]["step"]) for p in per_rank):
                raise RunError(f"statistics of {name!r} ({kind}) were taken at different steps on "
                               "different ranks; pass rank=")
            return {k: np.stack([p[k] for p in per_rank]) for k in per_rank[0]}
        table, series = self.stats_table(rank)
        ids = [i for i, key in series.items() if key == (kind, name)]
        if not ids:
            names = sorted(n for k, n in series.values() if k == kind)
            raise KeyError(f"{self.path}: no statistics of {kind} {name!r}; names with statistics: {names}")
        rows = table[table["series"] == ids[0]]
        rows = rows[np.argsort(rows["step"], kind="stable")]
        return {"step": rows["step"].copy(), **{f: rows[f].copy() for f in STATS_FIELDS}}

    def index_frame(self):
        """A pandas.DataFrame of the index, one row per record: step, kind, name,
        dtype, shape, bytes, rank, file, dataset and row (HDF5)."""
        from . import frames

        return frames.index_frame(self)

    def stats_frame(self):
        """A pandas.DataFrame of the statistics of every rank: step, rank, kind,
        name, min, max, mean, std, norm, nan, posinf, neginf, zeros, numel; kind
        and name categorical. One kind's frame is ready for
        df.pivot(index="step", columns="name", values="norm")."""
        from . import frames

        return frames.stats_frame(self)

    def to_xarray(self, kind, names=None, lazy=False):
        """An xarray.Dataset of one kind: a variable per name (all, or `names`)
        over a shared "step" coordinate, a "rank" dimension on multi-rank runs,
        the tensortap dtype and original name in each variable's attrs;
        dask-backed with lazy=True."""
        from . import frames

        return frames.to_xarray(self, kind, names, lazy)

    def close(self):
        """Closes HDF5 files this run opened."""
        for f in self._h5.values():
            f.close()
        self._h5.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals --------------------------------------------------------

    def _positions(self, name, kind):
        """{rank: positions in self._index of the records of `name` as `kind`, by step}."""
        if kind not in KINDS:
            raise RunError(f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
        key = self._index.key_code(kind, name)
        if key is None:
            names = self.names(kind)
            shown = ", ".join(repr(n) for n in names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
            raise KeyError(f"{self.path}: no {kind} records of {name!r}; names of that kind: "
                           f"{shown or 'none'}")
        return self._index.positions(key)

    def _lookup(self, name, kind):
        """{rank: the records (dicts) of `name` as `kind`, by step}."""
        return {r: [self._index.record(i) for i in pos.tolist()]
                for r, pos in self._positions(name, kind).items()}

    def _rank_records(self, by_rank, name, kind, rank):
        if rank not in by_rank:
            if rank is None and self.ranks:
                raise RunError(f"{self.path} has ranks {self.ranks}: pass rank=")
            raise KeyError(f"{self.path}: no {kind} records of {name!r} on rank {rank}")
        return by_rank[rank]

    def _stack(self, recs, name, kind):
        from ._optional import progress

        arrays = _read_many(progress(recs, desc=f"reading {_printable(name)}"), self._h5, self._h5_lock)
        shapes = sorted({a.shape for a in arrays})
        if len(shapes) > 1:
            raise RunError(f"{name!r} ({kind}) changes shape between steps: {shapes}; use load() per step")
        if not arrays:
            return np.empty((0,))
        return np.stack(arrays)

    def _read(self, rec, mmap):
        """The array of one record of self.records."""
        return _read_record(rec, mmap, self._h5, self._h5_lock)


def _read_record(rec, mmap, h5_files, h5_lock):
    """The array of one index record; HDF5 files are opened once into
    `h5_files` (guarded by `h5_lock`: dask reads from several threads)."""
    a = _read_stored(rec, mmap, h5_files, h5_lock)
    if rec["dtype"] in _float8.FORMATS:
        return _float8.widen(a, rec["dtype"], f"{rec.index}:{rec.lineno}")
    return a


def _read_stored(rec, mmap, h5_files, h5_lock):
    """The array of one index record as the file holds it."""
    path = _resolve(rec)
    if "dataset" in rec:
        with h5_lock:
            f = h5_files.get(path)
            if f is None:
                f = h5_files[path] = _open_h5(path)
        # A row is padded to the largest shape of its series: the index's
        # shape says which corner is this record.
        ds = _hdf5.dataset(f, rec["dataset"], path, RunError)
        if hasattr(ds, "refresh"):
            ds.refresh()  # rows appended since the file was opened (SWMR)
        return ds[(rec["row"],) + tuple(slice(0, n) for n in rec["shape"])]
    if "offset" in rec:
        return _read_packed(path, rec, mmap)
    # Never pickle: a planted .npy of objects would run code on load.
    if mmap:
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError:  # an empty array cannot be mapped
            pass
    return np.load(path, allow_pickle=False)


def _find_ranks(path):
    """{rank: directory} of the run in `path` ({None: path} for one rank).
    tensortap removes another run's files when it overwrites one; in a
    directory of an older tensortap, runs of two layouts can lie together (a
    single-rank run.json at the root beside rank folders, rank folders of a
    larger world). Then the newest run.json says which run is there: the
    root's, or the rank folders of its world size."""
    ranks = {}
    if os.path.isdir(path):
        for entry in os.listdir(path):
            m = re.fullmatch(r"rank(\d+)", entry)
            if m and os.path.isfile(os.path.join(path, entry, "run.json")):
                ranks[int(m.group(1))] = os.path.join(path, entry)
    root = os.path.join(path, "run.json")
    if os.path.isfile(root):
        if not ranks or _mtime(root) >= max(_mtime(os.path.join(d, "run.json")) for d in ranks.values()):
            return {None: path}
    if not ranks:
        raise RunError(f"{path}: not a tensortap run (no run.json, no rank<r>/run.json)")
    newest = max(ranks.values(), key=lambda d: _mtime(os.path.join(d, "run.json")))
    world = _world_size(newest)
    if world is None or world < 2:  # a rank folder's run.json says a multi-rank run, or cannot be trusted
        return ranks
    return {r: d for r, d in ranks.items() if r < world and _world_size(d) in (world, None)}


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _world_size(rank_dir):
    """run.json's world_size in `rank_dir`, or None where it cannot say."""
    try:
        w = _read_json(os.path.join(rank_dir, "run.json")).get("world_size")
    except (RunError, OSError):
        return None
    return w if _is_int(w) and w > 0 else None


class _Record(dict):
    """An index line. It equals the dict of the line; it also remembers the line,
    so that a refusal can name it, and the rank directory its file must lie in."""

    __slots__ = ("index", "lineno", "root")


class _Records(Sequence):
    """Run.records: the index's records as dicts (_Record), each built when it
    is read. It equals a list of the same dicts."""

    def __init__(self, index):
        self._index = index

    def __len__(self):
        return len(self._index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._index.record(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("record index out of range")
        return self._index.record(i % n)

    def __iter__(self):
        return map(self._index.record, range(len(self)))

    def __eq__(self, other):
        if not isinstance(other, (list, tuple, _Records)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self):
        if len(self) > 10:
            return f"<{len(self)} records: {self[0]!r}, ..., {self[-1]!r}>"
        return repr(list(self))


def _warn(message):
    warnings.warn(message, RunWarning, stacklevel=2)


def _json_type(value):
    for t, name in ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"),
                    (list, "an array"), (dict, "an object")):
        if isinstance(value, t):
            return name
    return "null"


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int64(value):
    return _is_int(value) and -(1 << 63) <= value < (1 << 63)


def _printable(text):
    """`text` with control characters and lone surrogates (a name's bytes
    that are not UTF-8) shown as escapes: safe for a terminal or a page."""
    from .summary import _safe

    return _safe(text)


def _read_packed(path, rec, mmap):
    """The .npy image of a Format::Packed record: `rec["nbytes"]` bytes at
    `rec["offset"]` of a segment file. The header is checked against them, so a
    damaged index line cannot make the reader map or read past its record."""
    with _open_regular(path) as f:
        def header_at(offset):
            f.seek(offset)
            shape, fortran, dtype = _npy_header(f)
            return shape, fortran, dtype, f.tell() - offset

        shape, order, dtype, data_at, count = _packed_layout(rec, os.fstat(f.fileno()).st_size, header_at)
        if mmap and count > 0 and shape:
            return np.memmap(path, dtype=dtype, mode="r", offset=data_at, shape=shape, order=order)
        f.seek(data_at)
        a = np.fromfile(f, dtype=dtype, count=count)
        if a.size != count:
            raise RunError(f"{_packed_where(rec)}: the file ended early (truncated?)")
        return a.reshape(shape, order=order)


def _packed_where(rec):
    return f"{rec.index}:{rec.lineno}: {_printable(rec['file'])} at offset {rec['offset']}"


def _packed_layout(rec, size, header_at):
    """(shape, order, dtype, offset of the data, element count) of a packed
    record in a segment of `size` bytes, its image's header read by
    header_at(offset) -> (shape, fortran_order, dtype, header bytes). RunError
    unless the header and the index agree."""
    offset, nbytes = rec["offset"], rec["nbytes"]
    if offset + nbytes > size:
        raise RunError(f"{_packed_where(rec)}: {nbytes} bytes run past the end of the file ({size} bytes)")
    try:
        shape, fortran, dtype, header = header_at(offset)
    except ValueError as e:
        raise RunError(f"{_packed_where(rec)}: not a .npy image: {_reason(e)}") from None
    if dtype.hasobject:
        raise RunError(f"{_packed_where(rec)}: an object array (never loaded: it could run code)")
    count = 1
    for n in shape:
        count *= n
    if header + count * dtype.itemsize != nbytes:
        raise RunError(f"{_packed_where(rec)}: the image's header and data take "
                       f"{header + count * dtype.itemsize} bytes, the index says {nbytes}")
    return shape, "F" if fortran else "C", dtype, offset + header, count


def _read_many(recs, h5_files, h5_lock):
    """The arrays of `recs`, each what _read_record(rec, mmap=False) reads (or a
    read-only view of it), for series(): per-record work is what a record
    needs alone. A segment is opened and mapped once for all its records, a
    header parsed once per distinct header (a name's are all alike), a
    directory resolved once for all its files."""
    segments = {}  # real path -> (size, its bytes: a uint8 array over a map)
    headers = {}   # header bytes -> (shape, fortran_order, dtype, header bytes)
    dirs = {}      # (rank directory, directory in the index) -> real directory
    files = {}     # (rank directory, file in the index) -> real path, for segments
    out = []
    for rec in recs:
        if "dataset" in rec:
            out.append(_read_record(rec, False, h5_files, h5_lock))
            continue
        if "offset" in rec:
            # A segment's records share its file: resolved, checked and
            # mapped once. A refusal still names the first record refused.
            key = (rec.root, rec["file"])
            path = files.get(key)
            if path is None:
                path = files[key] = _resolve(rec, dirs)
            seg = segments.get(path)
            if seg is None:
                seg = segments[path] = _map_segment(path)
            size, buf = seg
            shape, order, dtype, data_at, count = _packed_layout(
                rec, size, lambda offset: _cached_header(buf, offset, headers))
            a = buf[data_at:data_at + count * dtype.itemsize].view(dtype).reshape(shape, order=order)
        else:
            a = _read_npy(_resolve(rec, dirs), headers)
        # As _read_record: a float8's bytes come back widened to float32.
        if rec["dtype"] in _float8.FORMATS:
            a = _float8.widen(a, rec["dtype"], f"{rec.index}:{rec.lineno}")
        out.append(a)
    return out


def _map_segment(path):
    """(size, a read-only uint8 array over the whole file, memory-mapped)."""
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:  # an empty file cannot be mapped
            return 0, np.empty(0, np.uint8)
        # The array holds the map; it is unmapped when the last view goes.
        return size, np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)


def _cached_header(buf, offset, headers):
    """_npy_header of the image at `offset` of `buf`, with its length in bytes;
    parsed by NumPy once per distinct header text, found in `headers` after."""
    head = buf[offset:offset + 12].tobytes()
    if head[:6] == b"\x93NUMPY" and len(head) == 12 and head[6] == 1:
        length = 10 + int.from_bytes(head[8:10], "little")
    elif head[:6] == b"\x93NUMPY" and len(head) == 12:
        length = 12 + int.from_bytes(head[8:12], "little")
    else:
        length = len(head)  # not an image: NumPy's parser says why
    text = buf[offset:offset + length].tobytes()
    found = headers.get(text)
    if found is None:
        f = io.BytesIO(text)
        shape, fortran, dtype = _npy_header(f)
        found = headers[text] = (shape, fortran, dtype, f.tell())
    return found


def _read_npy(path, headers):
    """np.load(path, allow_pickle=False), with the header parsed once per
    distinct header text; any file NumPy would read otherwise (another version,
    an object array, too short) goes to np.load, for its result or its error."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        fd = None
    if fd is not None:
        try:
            st = os.fstat(fd)
            data = os.read(fd, st.st_size) if stat.S_ISREG(st.st_mode) else b""
        finally:
            os.close(fd)
        try:
            shape, fortran, dtype, length = _cached_header(np.frombuffer(data, np.uint8), 0, headers)
            count = 1
            for n in shape:
                count *= n
            if not dtype.hasobject and length + count * dtype.itemsize <= len(data):
                a = np.frombuffer(data, dtype=dtype, count=count, offset=length)
                return a.reshape(shape, order="F" if fortran else "C")
        except ValueError:
            pass
    # Never pickle: a planted .npy of objects would run code on load.
    return np.load(path, allow_pickle=False)


def _npy_header(f):
    """(shape, fortran_order, dtype) of the .npy image at f's position, read
    by NumPy's own parser; ValueError for a version tensortap does not write."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    raise ValueError(f".npy format version {version[0]}.{version[1]} is not one tensortap writes")


def _open_regular(path, follow=True):
    """An open binary file of `path`, refused unless it is a regular file: a FIFO
    or a device planted under a known name would block the reader or never end.
    With follow=False a symbolic link at `path` is refused too (RunError)."""
    # O_NONBLOCK so that opening a FIFO does not wait for a writer; it does not
    # change reads from a regular file.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if not follow and os.path.islink(path):
            raise RunError(f"{path}: a symbolic link, not a file tensortap writes") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RunError(f"{path}: not a regular file")
        return builtins.open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_json(path):
    with _open_regular(path) as f:
        data = f.read()
    try:
        info = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise RunError(f"{path}: not valid JSON (not UTF-8)") from None
    except (ValueError, RecursionError) as e:
        raise RunError(f"{path}: not valid JSON ({_reason(e)})") from None
    if not isinstance(info, dict):
        raise RunError(f"{path}: not a JSON object but {_json_type(info)}")
    return info


def _reason(e):
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg}, column {e.colno}"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e)


def _read_lines(path, follow=True):
    """(line number, value) for each JSON line of `path`, if it exists. Read as
    bytes and decoded line by line, so that a bad line (torn, garbage, invalid
    UTF-8) costs only itself. An unterminated last line that does not parse is a
    write torn by a crash: skipped silently. Other bad lines: a RunWarning.
    With follow=False a symbolic link at `path` is a RunError, not followed."""
    if not (os.path.exists(path) if follow else os.path.lexists(path)):
        return
    with _open_regular(path, follow) as f:
        lines = f.read().split(b"\n")
    last = len(lines) - 1  # b"" when the file ends with a newline
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            if i < last:
                _warn(f"{path}:{i + 1}: skipped: not UTF-8")
            continue
        except (ValueError, RecursionError) as e:
            if i < last:
                _warn(f"{path}:{i + 1}: skipped: not a JSON line ({_reason(e)})")
            continue
        yield i + 1, value


def _rank_dumps(directory, info):
    """The dumps of the run in `directory` whose run.json is `info`, as dicts:
    a closed run.json's "dumps" (close() lists every dump); otherwise
    dumps.jsonl's lines, if there is one (the run is going on, or it crashed
    and run.json was never rewritten); otherwise run.json's "dumps" (a run of
    a tensortap that rewrote run.json with each dump). dumps.jsonl is opened
    as only a regular file and never through a symbolic link: a FIFO or a
    link planted there is skipped with a RunWarning, never waited on or
    followed out of the run."""
    lines_path = os.path.join(directory, "dumps.jsonl")
    if info.get("closed", False) is not True and os.path.lexists(lines_path):
        out = []
        try:
            for lineno, d in _read_lines(lines_path, follow=False):
                if not isinstance(d, dict):
                    _warn(f"{lines_path}:{lineno}: skipped: {_json_type(d)}, not an object")
                    continue
                out.append(d)
        except (RunError, OSError) as e:
            _warn(f"{e}; its dumps are not read")
        return out
    dumps = info.get("dumps", [])
    where = os.path.join(directory, "run.json")
    if not isinstance(dumps, list):
        _warn(f"{where}: \"dumps\" is {_json_type(dumps)}, not an array; ignored")
        return []
    out = []
    for i, d in enumerate(dumps):
        if not isinstance(d, dict):
            _warn(f"{where}: dump {i} is {_json_type(d)}, not an object; skipped")
            continue
        out.append(d)
    return out


# The members every index line has; HDF5 records add "dataset" and "row",
# packed ones "offset" and "nbytes".
_REQUIRED = ("step", "kind", "name", "dtype", "shape", "file")


def _record_problem(rec):
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


def _series_problem(line):
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


def _short(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _resolve(rec, dirs=None):
    """The real path of the file a record names. Refused unless it lies inside the
    rank directory: an index is data, and a damaged or planted one must not make
    the reader open files elsewhere (another run's, /etc/...). The real path, not
    the index's, is what gets opened, so that a symlink is followed only once,
    here, where it was checked. `dirs` ({}: filled here) keeps the real paths of
    directories for the records that follow, for a series of files in one."""
    file = rec["file"]
    parts = file.replace(os.sep, "/").split("/")
    if "\0" in file:
        why = "it contains NUL"
    elif os.path.isabs(file):
        why = "it is absolute"
    elif ".." in parts:
        why = "it has a '..' component"
    else:
        real = _realpath(rec.root, file, dirs)
        try:
            mode = os.stat(real).st_mode
        except OSError:
            mode = None  # missing: opening it says so
        # Both are real paths: inside is under the root's prefix.
        if real == rec.root:
            why = "it is the run directory itself, not a file"
        elif not real.startswith(os.path.join(rec.root, "")):
            why = f"it resolves to {real!r}, outside {rec.root!r}"
        elif mode is not None and not stat.S_ISREG(mode):
            why = "it is not a regular file"
        else:
            return real
    raise RunError(f"{rec.index}:{rec.lineno}: refused path {file!r}: {why}")


def _realpath(root, file, dirs):
    """os.path.realpath(root/file); with `dirs`, the directory part's real path
    is taken from it (or put in it), and only the last component looked at."""
    path = os.path.join(root, file)
    head, tail = os.path.split(file)
    if dirs is None or not head or tail in ("", ".", ".."):
        return os.path.realpath(path)
    key = (root, head)
    real_dir = dirs.get(key)
    if real_dir is None:
        real_dir = dirs[key] = os.path.realpath(os.path.join(root, head))
    candidate = os.path.join(real_dir, tail)
    try:
        link = stat.S_ISLNK(os.lstat(candidate).st_mode)
    except OSError:
        link = True  # missing or unreadable: realpath says what it says
    return os.path.realpath(candidate) if link else candidate


# The columns stats.npy must have, and which of them hold floats.
_STATS_COLUMNS = ("step", "series") + STATS_FIELDS
_STATS_FLOATS = ("min", "max", "mean", "std", "norm")


def _read_stats_table(path):
    """stats.npy, checked before it is read: the header must describe a 1-D table
    with the statistics columns, and the file must hold every row it counts. A
    live run appends rows before it counts them, so more bytes are fine."""
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise RunError(f"{path}: empty file, no statistics table")
        try:
            shape, _, dtype = _npy_header(f)
        except ValueError as e:
            raise RunError(f"{path}: not a statistics table: {e}") from None
        names = dtype.names or ()
        missing = [c for c in _STATS_COLUMNS if c not in names]
        if missing:
            raise RunError(f"{path}: not a statistics table: no field {', '.join(missing)} (fields: {list(names)})")
        wrong = [c for c in _STATS_COLUMNS if dtype[c].kind not in ("f" if c in _STATS_FLOATS else "iu")]
        if wrong or dtype.hasobject:
            raise RunError(f"{path}: not a statistics table: field types {dtype}")
        if len(shape) != 1:
            raise RunError(f"{path}: not a statistics table: shape {shape}, not one row axis")
        rows, have = shape[0], size - f.tell()
        if have < rows * dtype.itemsize:
            raise RunError(f"{path}: truncated: the header counts {rows} rows ({rows * dtype.itemsize} bytes), "
                           f"the file holds {have} bytes after it")
        return np.fromfile(f, dtype=dtype, count=rows)


def _open_h5(path):
    from . import _hdf5  # only HDF5 runs need it (and h5py)

    return _hdf5.open_h5(path, RunError, RunWarning)
