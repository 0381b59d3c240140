"""A run as pandas DataFrames, dask arrays and xarray Datasets.

Run.index_frame(), Run.stats_frame(), Run.series(..., lazy=True) and
Run.to_xarray() call these; each imports its package only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Union

import math
import threading

import numpy as np

from .. import _float8
from .._arrays import _read_record
from .._base import KINDS, NUMPY_DTYPES, STATS_FIELDS, RunError, _is_int64
from .._files import has_statistics
from .._optional import need
from .._records import _Record

if TYPE_CHECKING:
    import pandas
    
    from .._run import Run

# HDF5 files the lazy arrays' tasks opened, per process: a task carries only
# its index record, so that dask's process and distributed schedulers can
# ship it (a Run, with its locks and open files, cannot be pickled).
_H5_FILES: dict = {}
_H5_LOCK = threading.Lock()


def _rank_of(run, rec):
    # A single-rank run's records carry no rank: its run.json says which.
    if "rank" in rec:
        return rec["rank"]
    rank = run.info.get("rank", 0)
    return rank if _is_int64(rank) else 0


def _itemsize(dtype):
    # The bytes as captured: a bfloat16 is two, even though NumPy gets float32
    # (and the .npy file holds four); a float8 is one (and so is its file's).
    if dtype == "bfloat16":
        return 2
    if dtype in _float8.FORMATS:
        return 1
    try:
        return np.dtype(NUMPY_DTYPES.get(dtype, dtype)).itemsize
    except TypeError:
        return 1  # a dtype NumPy does not know: counted as bytes


def index_frame(run: Run) -> pandas.DataFrame:
    """One row per record: step, kind, name, dtype, shape, bytes (as captured:
    two a bfloat16 element), rank, and where the record lives: file, and for
    HDF5 dataset and row, for Format::Packed offset and nbytes."""
    pd = need("pandas", "python3-pandas", "Run.index_frame()")
    index = run._index
    # Built from the index's columns and tables: per record, integer codes
    # and references to shared objects, never a dict.
    metas = index.metas

    def categorical(values, categories=None):
        """Per record, values[meta] of the record's meta, as a Categorical."""
        cats = sorted(set(values)) if categories is None else list(categories)
        code = {c: i for i, c in enumerate(cats)}
        per_meta = np.array([code[v] for v in values], dtype=np.int32)
        return pd.Categorical.from_codes(per_meta[index.meta], categories=cats)

    def objects(values):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    def nullable(column):
        """Int64 with NA where a record has no such member (-1 in the column)."""
        if column is None:
            return pd.arrays.IntegerArray(np.zeros(len(index), np.int64), np.ones(len(index), bool))
        return pd.arrays.IntegerArray(column, column < 0)

    meta_bytes = np.array([math.prod(m[3]) * _itemsize(m[2]) for m in metas], dtype=np.int64)
    rank_of_source = np.array([r if r is not None else _rank_of(run, {}) for _, _, r in index.sources],
                              dtype=np.int64)
    # A record's file is its meta's directory and its base: one string per
    # distinct pair (per segment for packed, per record for .npy).
    nb = max(1, len(index.bases))
    pairs, pair_of = np.unique(index.meta.astype(np.int64) * nb + index.base, return_inverse=True)
    files = objects([metas[p // nb][4] + index.bases[p % nb] for p in pairs.tolist()])
    if index.dataset is not None:
        datasets = objects(list(index.datasets) + [None])
        dataset = datasets[np.where(index.dataset < 0, len(index.datasets), index.dataset)]
    else:
        dataset = np.full(len(index), None, dtype=object)
    frame = pd.DataFrame({
        "step": index.step,
        "kind": categorical([m[0] for m in metas], KINDS),
        "name": categorical([m[1] for m in metas]),
        "dtype": categorical([m[2] for m in metas]),
        "shape": objects([m[3] for m in metas])[index.meta],
        "bytes": meta_bytes[index.meta],
        "rank": rank_of_source[index.source],
        "file": files[pair_of],
        "dataset": dataset,
        "row": nullable(index.row),
        "offset": nullable(index.offset),
        "nbytes": nullable(index.nbytes),
    })
    return frame


def stats_frame(run: Run) -> pandas.DataFrame:
    """The statistics table of every rank: step, rank, kind, name, min, max,
    mean, std, norm, nan, posinf, neginf, zeros, numel; kind and name are
    categorical. Rows whose series has no name (a damaged stats_series.jsonl
    line, already warned about) are left out, as are ranks without statistics.
    One kind and one rank of it pivot to a column per name."""
    pd = need("pandas", "python3-pandas", "Run.stats_frame()")
    parts = []
    ranks: List[Optional[int]] = list(run.ranks) if run.ranks else [None]
    for r in ranks:
        if run.ranks and not _has_stats(run, r):
            continue  # a rank without statistics: the others' still count
        table, series = run.stats_table(rank=r)
        ids = np.array(sorted(series), dtype=np.int64)
        table = table[np.isin(table["series"], ids)]
        parts.append((r if r is not None else _rank_of(run, {}), table, ids, series))
    if not parts:
        raise RunError(f"{run.path}: no statistics (stats.npy) on any rank; the run was made without "
                       "Options::stats_every")
    # Categorical columns built from codes: a million rows stay a few
    # integer arrays, never a million Python strings.
    names = sorted({n for _, _, _, series in parts for _, n in series.values()})
    name_code = {n: i for i, n in enumerate(names)}
    kind_code = {k: i for i, k in enumerate(KINDS)}
    columns: Dict[str, List[Any]] = {"step": [], "rank": [], "kind": [], "name": []}
    columns.update({f: [] for f in STATS_FIELDS})
    for rank, table, ids, series in parts:
        where = np.searchsorted(ids, table["series"])
        columns["step"].append(table["step"].astype(np.int64))
        columns["rank"].append(np.full(len(table), rank, dtype=np.int64))
        columns["kind"].append(np.array([kind_code.get(series[i][0], -1) for i in ids], dtype=np.int64)[where])
        columns["name"].append(np.array([name_code[series[i][1]] for i in ids], dtype=np.int64)[where])
        for f in STATS_FIELDS:
            columns[f].append(table[f])
    columns = {k: np.concatenate(v) for k, v in columns.items()}
    order = np.lexsort((columns["name"], columns["kind"], columns["step"], columns["rank"]))
    columns = {k: v[order] for k, v in columns.items()}
    columns["kind"] = pd.Categorical.from_codes(columns["kind"], categories=KINDS)
    columns["name"] = pd.Categorical.from_codes(columns["name"], categories=names)
    return pd.DataFrame(columns)


def _has_stats(run, rank):
    return has_statistics(run._dirs[rank])


def _steps_and_records(run, name, kind, rank):
    recs = run._rank_records(run._lookup(name, kind), name, kind, rank)
    return [rec["step"] for rec in recs], recs


def _check_one_shape(recs, name, kind):
    shapes = sorted({tuple(rec["shape"]) for rec in recs})
    if len(shapes) > 1:
        raise RunError(f"{name!r} ({kind}) changes shape between steps: {shapes}; use load() per step")
    return shapes[0] if shapes else None


def _numpy_dtype(recs):
    """The dtype np.stack gives the eager series: every record's, promoted."""
    if not recs:
        return np.dtype("float64")
    return np.result_type(*{np.dtype(NUMPY_DTYPES.get(r["dtype"], r["dtype"])) for r in recs})


class _Block:
    """One record as a dask chunk, [1, *shape]: a plain object that pickles."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, rec):
        a = np.asarray(_read_record(rec, True, _H5_FILES, _H5_LOCK))
        # The array was declared with the index's shape: a file that holds
        # another (a damaged or hand-edited index) would make dask compute an
        # array unlike the one it declared.
        if a.shape != tuple(rec["shape"]):
            raise RunError(f"{rec.index}:{rec.lineno}: {rec['name']!r} at step {rec['step']}: the file holds "
                           f"shape {list(a.shape)}, the index says {list(rec['shape'])}")
        return a.astype(self.dtype, copy=False)[np.newaxis]


def _lazy_stack(run, recs, name, kind):
    """[n_steps, *shape] as a dask array of one chunk per record, each read
    (memory-mapped where the format allows) only when computed."""
    da = need("dask.array", "python3-dask", "Run.series(lazy=True)")
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    shape = _check_one_shape(recs, name, kind)
    if shape is None:
        return da.empty((0,))
    dtype = _numpy_dtype(recs)
    block = _Block(dtype)
    key = "tensortap-" + tokenize(run.path, kind, name, [(r.root, r.lineno) for r in recs])
    graph = {(key, i) + (0,) * len(shape):
             (_call_with_record, block, dict(rec, _root=rec.root, _index=rec.index, _lineno=rec.lineno))
             for i, rec in enumerate(recs)}
    chunks = ((1,) * len(recs),) + tuple((n,) for n in shape)
    return da.Array(HighLevelGraph.from_collections(key, graph, dependencies=()), key, chunks, dtype=dtype)


def _call_with_record(block, fields):
    """Rebuilds the index record a task carries (a plain dict when shipped to
    another process) and reads it."""
    fields = dict(fields)
    rec = _Record({k: v for k, v in fields.items() if not k.startswith("_")})
    rec.root, rec.index, rec.lineno = fields["_root"], fields["_index"], fields["_lineno"]
    return block(rec)


def _same_over_ranks(run, name, kind, per_rank):
    if any(steps != per_rank[0][0] for steps, _ in per_rank):
        raise RunError(f"{name!r} ({kind}) was captured at different steps on different ranks; pass rank=")
    shapes = sorted({tuple(r["shape"]) for _, recs in per_rank for r in recs})
    if len(shapes) > 1:
        raise RunError(f"{name!r} ({kind}) has different shapes on different ranks or steps: {shapes}; "
                       "pass rank=, or use load() per step")


def lazy_series(run: Run, name: str, kind: str, rank: Optional[int] = None) -> Any:
    """Run.series(name, kind=kind, rank=rank, lazy=True)."""
    if rank is None and run.ranks:
        da = need("dask.array", "python3-dask", "Run.series(lazy=True)")
        per_rank = [_steps_and_records(run, name, kind, r) for r in run.ranks]
        _same_over_ranks(run, name, kind, per_rank)
        dtype = _numpy_dtype([r for _, recs in per_rank for r in recs])
        return da.stack([_lazy_stack(run, recs, name, kind).astype(dtype) for _, recs in per_rank])
    _, recs = _steps_and_records(run, name, kind, rank)
    return _lazy_stack(run, recs, name, kind)


def to_xarray(run: Run, kind: str, names: Union[str, Iterable[str], None] = None, lazy: bool = False) -> Any:
    """An xarray.Dataset of `kind`: one variable per name over a shared `step`
    coordinate (steps a name was not captured at are NaN), with a leading
    `rank` dimension on a multi-rank run (ranks without the name are NaN);
    dask-backed if lazy. A tensor's own axes are named "<name>/dim<i>"."""
    xr = need("xarray", "python3-xarray", "Run.to_xarray()")
    pd = need("pandas", "python3-pandas", "Run.to_xarray()")
    if kind not in KINDS:
        raise RunError(f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
    if isinstance(names, str):
        names = [names]
    names = run.names(kind) if names is None else list(names)
    dims_of = {name: tuple(f"{name}/dim{i}" for i in range(len(_shape_of(run, name, kind)))) for name in names}
    taken = {"step", "rank"} | {d for dims in dims_of.values() for d in dims}
    clash = sorted(n for n in names if n in taken)
    if clash:
        raise RunError(f"{kind} names {clash} are also names of the Dataset's dimensions ('step', 'rank', "
                       "'<name>/dim<i>'); leave them out with names=, or read them with series()")
    variables = {}
    for name in names:
        ranks: List[Optional[int]] = list(run.ranks) if run.ranks else [None]
        arrays, present = [], []
        by_rank = run._lookup(name, kind)
        for r in ranks:
            if r not in by_rank:
                continue  # this rank never captured it: NaN there
            steps, recs = _steps_and_records(run, name, kind, r)
            if len(set(steps)) != len(steps):
                dup = sorted({s for s in steps if steps.count(s) > 1})
                raise RunError(f"{name!r} ({kind}) has several records at steps {dup[:10]}"
                               + (f" on rank {r}" if r is not None else "") + "; read them with load()")
            data = _lazy_stack(run, recs, name, kind) if lazy else run._stack(recs, name, kind)
            arrays.append(xr.DataArray(data, dims=("step",) + dims_of[name],
                                       coords={"step": np.array(steps, dtype=np.int64)}))
            present.append(r)
        shapes = sorted({a.shape[1:] for a in arrays})
        if len(shapes) > 1:
            raise RunError(f"{name!r} ({kind}) has different shapes on different ranks: {shapes}; "
                           "leave it out with names=")
        var = xr.concat(arrays, dim=pd.Index(present, name="rank"), join="outer") if run.ranks else arrays[0]
        var.attrs = {"name": name, "kind": kind, "dtype": recs[0]["dtype"], "shape": list(shapes[0])}
        variables[name] = var
    ds = xr.Dataset(variables)  # aligns the names' steps and ranks (outer join)
    if run.ranks:
        ds = ds.reindex(rank=run.ranks)  # every rank of the run, NaN where none has the names
    options = run.info.get("options")
    ds.attrs = {"run": run.path, "kind": kind,
                "format": str(options.get("format", "?")) if isinstance(options, dict) else "?",
                "tensortap_version": str(run.info.get("tensortap_version", "?"))}
    return ds


def _shape_of(run, name, kind):
    shapes = sorted({tuple(r["shape"]) for rs in run._lookup(name, kind).values() for r in rs})
    if len(shapes) > 1:
        raise RunError(f"{name!r} ({kind}) changes shape between steps or ranks: {shapes}; "
                       "leave it out with names=, or use load() per step")
    return shapes[0]
