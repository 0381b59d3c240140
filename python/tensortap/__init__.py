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
    run.dumps                                     # the flight recorder's dumps (run.json)

A run written by several ranks (rank<r>/ directories) opens as one: pass
rank=r to look at one rank; series() without a rank stacks them all on a
leading rank axis.
"""

import builtins
import json
import os
import re

import numpy as np

__all__ = ["open", "Run", "KINDS", "STATS_FIELDS", "RunError"]
__version__ = "0.1.0"

KINDS = ("activation", "activation_grad", "param", "grad", "tensor")

# The columns of stats.npy after "step" and "series", in order.
STATS_FIELDS = ("min", "max", "mean", "std", "norm", "nan", "posinf", "neginf", "zeros", "numel")

# NumPy dtypes of what tensortap writes; bfloat16 is stored as float32.
NUMPY_DTYPES = {
    "bool": "bool", "uint8": "uint8", "int8": "int8", "int16": "int16", "int32": "int32",
    "int64": "int64", "float16": "float16", "float32": "float32", "float64": "float64",
    "complex64": "complex64", "complex128": "complex128", "bfloat16": "float32",
}


class RunError(ValueError):
    """A run directory that cannot be read as asked."""


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
        self.records = []
        self._by_key = {}
        for r, d in sorted(ranks.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
            for rec in _read_index(os.path.join(d, "index.jsonl")):
                if r is not None:
                    rec["rank"] = r
                self.records.append(rec)
                self._by_key.setdefault((rec["kind"], rec["name"]), {}).setdefault(r, []).append(rec)
        for by_rank in self._by_key.values():
            for rs in by_rank.values():
                rs.sort(key=lambda rec: rec["step"])
        self._h5 = {}

    def __repr__(self):
        return f"tensortap.Run({self.path!r}, {len(self.records)} records)"

    @property
    def closed(self):
        """Whether every rank closed its run cleanly (False after a crash or while running)."""
        return all(bool(i.get("closed", False)) for i in self.infos.values())

    def kinds(self):
        """The kinds present, in tensortap's order."""
        present = {k for k, _ in self._by_key}
        return [k for k in KINDS if k in present]

    def names(self, kind=None):
        """The sorted names captured, of one kind or of all."""
        return sorted({n for k, n in self._by_key if kind is None or k == kind})

    def steps(self, name, kind, rank=None):
        """The sorted steps at which `name` was captured as `kind` (on any rank, or on `rank`)."""
        by_rank = self._lookup(name, kind)
        if rank is not None:
            return [rec["step"] for rec in self._rank_records(by_rank, name, kind, rank)]
        return sorted({rec["step"] for rs in by_rank.values() for rec in rs})

    def load(self, name, step, kind, rank=None, mmap=True):
        """The array of `name` at `step`; memory-mapped (.npy) unless mmap=False.
        On a multi-rank run, `rank` defaults to the lowest rank that has it."""
        by_rank = self._lookup(name, kind)
        ranks = [rank] if rank is not None else sorted(by_rank, key=lambda r: -1 if r is None else r)
        for r in ranks:
            for rec in self._rank_records(by_rank, name, kind, r):
                if rec["step"] == step:
                    return self._read(rec, r, mmap)
        raise KeyError(f"{self.path}: no {kind} record of {name!r} at step {step}"
                       + (f" on rank {rank}" if rank is not None else ""))

    def series(self, name, kind, rank=None):
        """Every captured step of `name` stacked into one array: [n_steps, *shape];
        on a multi-rank run without `rank`, [n_ranks, n_steps, *shape]."""
        by_rank = self._lookup(name, kind)
        if rank is None and self.ranks:
            per_rank = [self._stack(self._rank_records(by_rank, name, kind, r), r, name, kind) for r in self.ranks]
            steps = [self.steps(name, kind, rank=r) for r in self.ranks]
            if any(s != steps[0] for s in steps):
                raise RunError(f"{name!r} ({kind}) was captured at different steps on different ranks; "
                               "pass rank=")
            return np.stack(per_rank)
        return self._stack(self._rank_records(by_rank, name, kind, rank), rank, name, kind)

    @property
    def dumps(self):
        """The flight recorder's dumps, from run.json: dicts with "step", "reason"
        ("nan", "inf" or "user") and "steps" (the steps written); on a multi-rank
        run each also has "rank"."""
        out = []
        for r, info in sorted(self.infos.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
            for d in info.get("dumps", []):
                out.append(dict(d, rank=r) if r is not None else dict(d))
        return out

    def stats_table(self, rank=None):
        """The whole statistics table of one rank: a structured array with fields
        step, series, min, max, mean, std, norm, nan, posinf, neginf, zeros, numel,
        and the series' names: {series: (kind, name)}."""
        if rank is None and self.ranks:
            raise RunError(f"{self.path} has ranks {self.ranks}: pass rank=")
        if rank not in self._dirs:
            raise RunError(f"{self.path}: no rank {rank}")
        d = self._dirs[rank]
        table_path = os.path.join(d, "stats.npy")
        if not os.path.exists(table_path):
            raise RunError(f"{d}: no statistics (stats.npy); the run was made without Options::stats_every")
        table = np.load(table_path)
        series = {}
        for line in _read_index(os.path.join(d, "stats_series.jsonl")):
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

    def _lookup(self, name, kind):
        if kind not in KINDS:
            raise RunError(f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
        try:
            return self._by_key[(kind, name)]
        except KeyError:
            raise KeyError(f"{self.path}: no {kind} records of {name!r}; "
                           f"names of that kind: {self.names(kind)}") from None

    def _rank_records(self, by_rank, name, kind, rank):
        if rank not in by_rank:
            if rank is None and self.ranks:
                raise RunError(f"{self.path} has ranks {self.ranks}: pass rank=")
            raise KeyError(f"{self.path}: no {kind} records of {name!r} on rank {rank}")
        return by_rank[rank]

    def _stack(self, recs, rank, name, kind):
        arrays = [self._read(rec, rank, mmap=False) for rec in recs]
        shapes = sorted({a.shape for a in arrays})
        if len(shapes) > 1:
            raise RunError(f"{name!r} ({kind}) changes shape between steps: {shapes}; use load() per step")
        if not arrays:
            return np.empty((0,))
        return np.stack(arrays)

    def _read(self, rec, rank, mmap):
        path = os.path.join(self._dirs[rank], rec["file"])
        if "dataset" in rec:
            f = self._h5.get(path)
            if f is None:
                f = self._h5[path] = _open_h5(path)
            # A row is padded to the largest shape of its series: the index's
            # shape says which corner is this record.
            ds = f[rec["dataset"]]
            if hasattr(ds, "refresh"):
                ds.refresh()  # rows appended since the file was opened (SWMR)
            return ds[(rec["row"],) + tuple(slice(0, n) for n in rec["shape"])]
        if mmap:
            try:
                return np.load(path, mmap_mode="r")
            except ValueError:  # an empty array cannot be mapped
                pass
        return np.load(path)


def _find_ranks(path):
    if os.path.isfile(os.path.join(path, "run.json")):
        return {None: path}
    ranks = {}
    if os.path.isdir(path):
        for entry in os.listdir(path):
            m = re.fullmatch(r"rank(\d+)", entry)
            if m and os.path.isfile(os.path.join(path, entry, "run.json")):
                ranks[int(m.group(1))] = os.path.join(path, entry)
    if not ranks:
        raise RunError(f"{path}: not a tensortap run (no run.json, no rank<r>/run.json)")
    return ranks


def _read_json(path):
    with builtins.open(path, encoding="utf-8") as f:
        return json.load(f)


def _read_index(path):
    """The index lines as dicts. A crash can tear the last line: it is skipped."""
    records = []
    if not os.path.exists(path):
        return records
    with builtins.open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise RunError(f"{path}:{i + 1}: not a JSON line") from None
    return records


def _open_h5(path):
    import h5py  # only HDF5 runs need it

    try:
        return h5py.File(path, "r", swmr=True)
    except (OSError, ValueError):
        return h5py.File(path, "r")
