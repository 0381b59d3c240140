"""A run as pandas DataFrames, dask arrays and xarray Datasets.

Run.index_frame(), Run.stats_frame(), Run.series(..., lazy=True) and
Run.to_xarray() call these; each imports its package only when called.
"""

import math

import numpy as np

from ._optional import need


def _rank_of(run, rec):
    # A single-rank run's records carry no rank: its run.json says which.
    if "rank" in rec:
        return rec["rank"]
    rank = run.info.get("rank", 0)
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else 0


def _itemsize(dtype):
    from . import NUMPY_DTYPES

    # The bytes as captured: a bfloat16 is two, even though NumPy gets float32.
    return 2 if dtype == "bfloat16" else np.dtype(NUMPY_DTYPES.get(dtype, "uint8")).itemsize


def index_frame(run):
    """One row per record: step, kind, name, dtype, shape, bytes, rank, and
    where the record lives: file, and for HDF5 dataset and row."""
    from . import KINDS

    pd = need("pandas", "python3-pandas", "Run.index_frame()")
    recs = run.records
    frame = pd.DataFrame({
        "step": np.array([r["step"] for r in recs], dtype=np.int64),
        "kind": pd.Categorical([r["kind"] for r in recs], categories=KINDS),
        "name": pd.Categorical([r["name"] for r in recs]),
        "dtype": pd.Categorical([r["dtype"] for r in recs]),
        "shape": [tuple(r["shape"]) for r in recs],
        "bytes": np.array([math.prod(r["shape"]) * _itemsize(r["dtype"]) for r in recs], dtype=np.int64),
        "rank": np.array([_rank_of(run, r) for r in recs], dtype=np.int64),
        "file": [r["file"] for r in recs],
        "dataset": [r.get("dataset") for r in recs],
        "row": pd.array([r.get("row") for r in recs], dtype="Int64"),
    })
    return frame


def stats_frame(run):
    """The statistics table of every rank: step, rank, kind, name, min, max,
    mean, std, norm, nan, posinf, neginf, zeros, numel; kind and name are
    categorical. Rows whose series has no name (a damaged stats_series.jsonl
    line, already warned about) are left out."""
    from . import KINDS, STATS_FIELDS, RunError

    pd = need("pandas", "python3-pandas", "Run.stats_frame()")
    parts = []
    ranks = run.ranks if run.ranks else [None]
    for r in ranks:
        table, series = run.stats_table(rank=r)
        ids = np.array(sorted(series), dtype=np.int64)
        table = table[np.isin(table["series"], ids)]
        parts.append((r if r is not None else _rank_of(run, {}), table, ids, series))
    if not parts:
        raise RunError(f"{run.path}: no statistics")
    # Categorical columns built from codes: a million rows stay a few
    # integer arrays, never a million Python strings.
    names = sorted({n for _, _, _, series in parts for _, n in series.values()})
    name_code = {n: i for i, n in enumerate(names)}
    kind_code = {k: i for i, k in enumerate(KINDS)}
    columns = {"step": [], "rank": [], "kind": [], "name": []}
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


def _steps_and_records(run, name, kind, rank):
    recs = run._rank_records(run._lookup(name, kind), name, kind, rank)
    return [rec["step"] for rec in recs], recs


def _check_one_shape(recs, name, kind):
    from . import RunError

    shapes = sorted({tuple(rec["shape"]) for rec in recs})
    if len(shapes) > 1:
        raise RunError(f"{name!r} ({kind}) changes shape between steps: {shapes}; use load() per step")
    return shapes[0] if shapes else None


def _numpy_dtype(recs):
    from . import NUMPY_DTYPES

    return np.dtype(NUMPY_DTYPES.get(recs[0]["dtype"], recs[0]["dtype"])) if recs else np.dtype("float64")


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

    def block(rec):
        return np.asarray(run._read(rec, mmap=True)).astype(dtype, copy=False)[np.newaxis]

    key = "tensortap-" + tokenize(run.path, id(run), kind, name, [(r.get("rank"), r["step"]) for r in recs])
    graph = {(key, i) + (0,) * len(shape): (block, rec) for i, rec in enumerate(recs)}
    chunks = ((1,) * len(recs),) + tuple((n,) for n in shape)
    return da.Array(HighLevelGraph.from_collections(key, graph, dependencies=()), key, chunks, dtype=dtype)


def lazy_series(run, name, kind, rank=None):
    """Run.series(name, kind, rank, lazy=True)."""
    from . import RunError

    if rank is None and run.ranks:
        da = need("dask.array", "python3-dask", "Run.series(lazy=True)")
        per_rank = [_steps_and_records(run, name, kind, r) for r in run.ranks]
        if any(steps != per_rank[0][0] for steps, _ in per_rank):
            raise RunError(f"{name!r} ({kind}) was captured at different steps on different ranks; pass rank=")
        return da.stack([_lazy_stack(run, recs, name, kind) for _, recs in per_rank])
    _, recs = _steps_and_records(run, name, kind, rank)
    return _lazy_stack(run, recs, name, kind)


def to_xarray(run, kind, names=None, lazy=False):
    """An xarray.Dataset of `kind`: one variable per name over a shared `step`
    coordinate (steps a name was not captured at are NaN), with a leading
    `rank` dimension on a multi-rank run; dask-backed if lazy."""
    from . import KINDS, RunError

    xr = need("xarray", "python3-xarray", "Run.to_xarray()")
    pd = need("pandas", "python3-pandas", "Run.to_xarray()")
    if kind not in KINDS:
        raise RunError(f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
    names = run.names(kind) if names is None else list(names)
    variables = {}
    for name in names:
        ranks = run.ranks if run.ranks else [None]
        arrays = []
        for r in ranks:
            steps, recs = _steps_and_records(run, name, kind, r)
            shape = _check_one_shape(recs, name, kind)
            dims = ("step",) + tuple(f"{name}/dim{i}" for i in range(len(shape)))
            data = _lazy_stack(run, recs, name, kind) if lazy else run._stack(recs, name, kind)
            arrays.append(xr.DataArray(data, dims=dims, coords={"step": np.array(steps, dtype=np.int64)}))
        if run.ranks:
            var = xr.concat(arrays, dim=pd.Index(run.ranks, name="rank"), join="outer")
        else:
            var = arrays[0]
        var.attrs = {"name": name, "kind": kind, "dtype": recs[0]["dtype"], "shape": list(shape)}
        variables[name] = var
    ds = xr.Dataset(variables)  # aligns the names' steps (outer join)
    ds.attrs = {"run": run.path, "kind": kind, "format": str(run.info.get("options", {}).get("format", "?")),
                "tensortap_version": str(run.info.get("tensortap_version", "?"))}
    return ds
