"""Run: a run directory, one rank or several, in any format."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Literal, Optional, Sequence, Tuple, Union, overload

import numpy as np

from . import _index
from ._arrays import _read_many, _read_record
from ._base import KINDS, STATS_FIELDS, RunError, _safe, _warn
from ._compat import keyword_only
from ._files import _dumped_steps, _given_up_below, _rank_dumps, _read_json, _read_lines, stats_segments
from ._names import RUN_JSON, STATS_SERIES, STATS_TABLE
from ._npy import _read_stats_table
from ._paths import _find_ranks
from ._records import _Records, _series_problem

if TYPE_CHECKING:  # never imported at run time here: frames.py imports them when called
    import dask.array
    import pandas
    import xarray

PathLike = Union[str, "os.PathLike[str]"]


def open(path: PathLike, rank: Optional[int] = None) -> Run:  # noqa: A001 - the documented name
    """Opens the run directory `path`; `rank` restricts it to one rank."""
    return Run(path, rank=rank)


class Run:
    """A run directory written by tensortap, in either format, one rank or several."""

    path: str
    """The run directory, as given."""
    ranks: List[int]
    """The ranks of a multi-rank run (all, or the one asked for); [] for a single-rank run."""
    infos: Dict[Optional[int], Dict[str, Any]]
    """Each rank's run.json (None: a single-rank run's)."""
    info: Dict[str, Any]
    """run.json of the single-rank run, or of the lowest rank."""
    given_up_below: Dict[Optional[int], int]
    """The steps a disk budget gave up (Options::max_bytes with
    Budget::KeepLatest): {rank (None for a single-rank run): k}, for the
    ranks whose run.json has the marker "budget": {"given_up_below": k}.
    Every record of such a rank of a step below k is hidden from every view
    of the run (records, steps(), load(), series(), the frames, inspect,
    report, diff, tensorboard) and never read, its file deleted or about to
    be; but a step one of the rank's dumps wrote ("steps") is kept, each of
    its records whose file is still there. A marker that is not an integer
    >= 0 is ignored with a RunWarning. Taken when the Run is opened: on a
    run still going, a record listed then whose step the recorder gives up
    afterwards raises GivenUpError (a RunError) when it is read (load(),
    series(), the frames, inspect --check...): open the run again."""
    given_up_records: Dict[Optional[int], int]
    """How many indexed records given_up_below hid, per rank with a marker
    (0 once the recorder has deleted their index files, or none was there)."""

    def __init__(self, path: PathLike, rank: Optional[int] = None) -> None:
        self.path = os.fspath(path)
        ranks = _find_ranks(self.path)
        if rank is not None:
            if rank not in ranks:
                raise RunError(f"{self.path}: no rank {rank}; ranks: {sorted(r for r in ranks if r is not None)}")
            ranks = {rank: ranks[rank]}
        self._dirs = ranks  # rank (None for a single-rank run) -> directory
        self.ranks = sorted(r for r in ranks if r is not None)
        self.infos = {r: _read_json(os.path.join(d, RUN_JSON)) for r, d in ranks.items()}
        self.info = self.infos[min(self.infos, key=lambda r: -1 if r is None else r)]
        self.given_up_below = {}
        markers: Dict[Optional[int], _index.Marker] = {}
        for r, d in sorted(ranks.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
            k = _given_up_below(d, self.infos[r])
            if k is not None:
                self.given_up_below[r] = k
                markers[r] = (k, _dumped_steps(d, self.infos[r]))
        # Columns, not a dict per line: a million lines are tens of MB, not GB.
        # The records given up hidden here, once, for every view.
        self._index = _index.read(ranks, markers)
        self.given_up_records = dict(self._index.hidden)
        self._h5: Dict[str, Any] = {}
        self._h5_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"tensortap.Run({self.path!r}, {len(self._index)} records)"

    @property
    def records(self) -> Sequence[Dict[str, Any]]:
        """The index, one dict per record (with "rank" on a multi-rank run), in
        the order of the index files: a sequence that builds each dict when it
        is read, so that a run of a million records does not hold a million."""
        return _Records(self._index)

    @property
    def closed(self) -> bool:
        """Whether every rank closed its run cleanly (False after a crash or while running)."""
        # Only JSON's true: a damaged run.json's "false" (a string) is truthy.
        return all(i.get("closed", False) is True for i in self.infos.values())

    def kinds(self) -> List[str]:
        """The kinds present, in tensortap's order."""
        present = {k for k, _ in self._index.keys}
        return [k for k in KINDS if k in present]

    def names(self, kind: Optional[str] = None) -> List[str]:
        """The sorted names captured, of one kind or of all."""
        return sorted({n for k, n in self._index.keys if kind is None or k == kind})

    @keyword_only
    def steps(self, name: str, *, kind: str, rank: Optional[int] = None) -> List[int]:
        """The sorted steps at which `name` was captured as `kind` (on any rank, or on `rank`)."""
        by_rank = self._positions(name, kind)
        if rank is not None:
            return self._index.step[self._rank_records(by_rank, name, kind, rank)].tolist()
        return np.unique(self._index.step[np.concatenate(list(by_rank.values()))]).tolist()

    @keyword_only
    def load(self, name: str, step: int, *, kind: str, rank: Optional[int] = None, mmap: bool = True) -> np.ndarray:
        """The array of `name` at `step`; memory-mapped (.npy) unless mmap=False.
        On a multi-rank run, `rank` defaults to the lowest rank that has it.

        A memory-mapped array reads its file when used: if the file is
        truncated or deleted-and-shrunk afterwards (an `overwrite` rerun, a
        full disk's cleanup), touching the array kills Python with SIGBUS.
        Pass mmap=False (or copy the array) to keep it past such changes.

        GivenUpError (a RunError): the record's step was given up by the
        run's disk budget (Budget::KeepLatest) after the Run was opened."""
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

    @overload
    def series(self, name: str, *, kind: str, rank: Optional[int] = ...,
               lazy: Literal[False] = ...) -> np.ndarray: ...

    @overload
    def series(self, name: str, *, kind: str, rank: Optional[int] = ...,
               lazy: Literal[True]) -> dask.array.Array: ...

    @overload
    def series(self, name: str, *, kind: str, rank: Optional[int] = ...,
               lazy: bool = ...) -> Union[np.ndarray, dask.array.Array]: ...

    @keyword_only
    def series(self, name: str, *, kind: str, rank: Optional[int] = None,
               lazy: bool = False) -> Union[np.ndarray, dask.array.Array]:
        """Every captured step of `name` stacked into one array: [n_steps, *shape];
        on a multi-rank run without `rank`, [n_ranks, n_steps, *shape]. With
        lazy=True, a dask array of the same shape, one chunk per record, read
        (memory-mapped where the format allows) only when computed."""
        if lazy:
            from ._views import frames

            return frames.lazy_series(self, name, kind, rank)
        by_rank = self._lookup(name, kind)
        if rank is None and self.ranks:
            per_rank = [self._stack(self._rank_records(by_rank, name, kind, r), name, kind) for r in self.ranks]
            steps = [self.steps(name, kind=kind, rank=r) for r in self.ranks]
            if any(s != steps[0] for s in steps):
                raise RunError(f"{name!r} ({kind}) was captured at different steps on different ranks; "
                               "pass rank=")
            shapes = sorted({a.shape[1:] for a in per_rank})
            if len(shapes) > 1:
                raise RunError(f"{name!r} ({kind}) has different shapes on different ranks: {shapes}; pass rank=")
            return np.stack(per_rank)
        return self._stack(self._rank_records(by_rank, name, kind, rank), name, kind)

    @property
    def dumps(self) -> List[Dict[str, Any]]:
        """The flight recorder's dumps and the triggers' marks: dicts with "step",
        "reason" ("nan", "inf", "user" or the rule's kind) and "steps" (the steps
        written), and for a rule "kind", "name" and "trigger" (a rule with a window,
        spike and norm_jump, also "factor", "window", "value" and "median"; a
        training health rule, reason its name, also "value" and "threshold"); on
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

    def stats_table(self, rank: Optional[int] = None) -> Tuple[np.ndarray, Dict[int, Tuple[str, str]]]:
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
        table = _read_stats_segments(d, self.given_up_below.get(rank))
        series = {}
        series_path = os.path.join(d, STATS_SERIES)
        for lineno, line in _read_lines(series_path):
            problem = _series_problem(line)
            if problem:
                _warn(f"{series_path}:{lineno}: skipped: {problem}")
                continue
            series[line["series"]] = (line["kind"], line["name"])
        return table, series

    @keyword_only
    def stats(self, name: str, *, kind: str, rank: Optional[int] = None) -> Dict[str, np.ndarray]:
        """The statistics of `name` (of `kind`) over steps, as a dict of NumPy arrays
        with keys step, min, max, mean, std, norm, nan, posinf, neginf, zeros, numel,
        sorted by step. min, max, mean, std (ddof=0) and norm (L2) are over the finite
        values; nan, posinf, neginf and zeros are counts. On a multi-rank run without
        `rank`, each array has a leading rank axis."""
        if kind not in KINDS:
            raise RunError(f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
        if rank is None and self.ranks:
            per_rank = [self.stats(name, kind=kind, rank=r) for r in self.ranks]
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

    def index_frame(self) -> pandas.DataFrame:
        """A pandas.DataFrame of the index, one row per record: step, kind, name,
        dtype, shape, bytes, rank, file, dataset and row (HDF5)."""
        from ._views import frames

        return frames.index_frame(self)

    def stats_frame(self) -> pandas.DataFrame:
        """A pandas.DataFrame of the statistics of every rank: step, rank, kind,
        name, min, max, mean, std, norm, nan, posinf, neginf, zeros, numel; kind
        and name categorical. One kind's frame is ready for
        df.pivot(index="step", columns="name", values="norm")."""
        from ._views import frames

        return frames.stats_frame(self)

    def to_xarray(self, kind: str, names: Union[str, Iterable[str], None] = None,
                  lazy: bool = False) -> xarray.Dataset:
        """An xarray.Dataset of one kind: a variable per name (all, or `names`)
        over a shared "step" coordinate, a "rank" dimension on multi-rank runs,
        the tensortap dtype and original name in each variable's attrs;
        dask-backed with lazy=True."""
        from ._views import frames

        return frames.to_xarray(self, kind, names, lazy)

    def export_tensorboard(self, logdir: Optional[PathLike] = None, histograms_every: int = 100,
                           stats: Optional[Sequence[str]] = None) -> List[str]:
        """Writes the run as TensorBoard event files, one per rank; returns their
        paths: statistics as scalars `<kind>/<name>/<stat>` for each of `stats`
        (None: the run's own TensorBoardOptions::stats, or mean, std, min, max,
        norm) and `<kind>/<name>/nonfinite` from a tensor's first NaN or Inf
        (unless a count is named), a 0-d tensor record as the one scalar
        `tensor/<name>`, histograms `<kind>/<name>` of every other record at
        steps where step % histograms_every == 0 (0: none), dumps as text
        `tensortap/dumps`, and a custom scalars layout
        (writers/src/tensorboard/EVENTS.md). Into the run directory, refused
        (RunError) where the recorder wrote events already; or into
        logdir/<the run's folder name>/ (rank<r>/ per rank)."""
        from ._tensorboard.export import export_tensorboard

        return export_tensorboard(self, logdir, histograms_every, stats)

    def close(self) -> None:
        """Closes HDF5 files this run opened."""
        for f in self._h5.values():
            f.close()
        self._h5.clear()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
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

        arrays = _read_many(progress(recs, desc=f"reading {_safe(name)}"), self._h5, self._h5_lock)
        shapes = sorted({a.shape for a in arrays})
        if len(shapes) > 1:
            raise RunError(f"{name!r} ({kind}) changes shape between steps: {shapes}; use load() per step")
        if not arrays:
            return np.empty((0,))
        return np.stack(arrays)

    def _read(self, rec, mmap):
        """The array of one record of self.records."""
        return _read_record(rec, mmap, self._h5, self._h5_lock)


# The recorder's statistics header: rows follow it (writers/src/stats_file.cpp).
_STATS_HEADER_BYTES = 512


def _read_stats_segments(directory, given_up_below):
    """The statistics table of the run in `directory`: stats.npy, or under
    Budget::KeepLatest its segments (stats.npy, stats.<n>.npy) in order, the
    rows of steps below the marker `given_up_below` left out (their step was
    given up with its records). A segment given up while it is read is
    skipped: its steps are below the marker now."""
    paths = stats_segments(directory)
    if not paths:
        raise RunError(f"{directory}: no statistics (stats.npy); the run was made without Options::stats_every")
    tables = []
    for i, path in enumerate(paths):
        try:
            # The newest segment shorter than its header is one being made
            # (or one a crash cut there): it holds no row yet.
            if (i == len(paths) - 1 and os.path.basename(path) != STATS_TABLE
                    and os.stat(path).st_size < _STATS_HEADER_BYTES):
                continue
            tables.append(_read_stats_table(path))
        except FileNotFoundError:
            continue
    if not tables:
        raise RunError(f"{directory}: no statistics rows yet (the first segment kept is being made, or every "
                       "segment was given up while it was read)")
    table = tables[0] if len(tables) == 1 else np.concatenate(tables)
    if given_up_below is not None:
        table = table[table["step"] >= given_up_below]
    return table
