"""The doctor's input (tensortap/_doctor.py): one rank's statistics rows, read
from its stats.npy, or computed from its full records where it has none,
with the recorder's definitions; and the pass over full `param` records that
weight_update_ratio needs.

A row is the recorder's statistics of one tensor at one step (docs/design.md#statistics,
`TensorSummary`): min, max, mean, std (population), norm (L2)
over the finite values, and the counts nan, posinf, neginf, zeros, numel
over all. Computed here from a record as sdk/src/core/stats.cpp does: in
float64, a complex value as its magnitude, bool and integers as numbers, the
sums scaled by the largest magnitude so that neither 1e300 nor 1e-310
overflows or vanishes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .._base import STATS_FIELDS, STATS_REAL, RunError, _safe, _warn

if TYPE_CHECKING:
    from .._run import Run

# A measure some rule takes from a record's values (float64, flattened, all
# finite): saturated_activation's exact fraction. None: the rule has none
# for this (kind, name).
ValueMeasure = Optional[Callable[[np.ndarray], float]]


@dataclass
class Rows:
    """One rank's statistics rows, sorted by (series, step); a (series, step)
    written twice keeps its last row, as the reader keeps an index's last line."""

    rank: int
    """The rank findings name: a multi-rank run's rank, or a single-rank run's own (run.json, 0 by default)."""
    key: Optional[int]
    """The Run's key of the rank: None for a single-rank run."""
    source: str
    """"statistics" (stats.npy) or "records" (computed from the full records)."""
    keys: List[Tuple[str, str]]
    """Series number -> (kind, name)."""
    series: np.ndarray
    step: np.ndarray
    seq: np.ndarray
    """The row's place in the order the writer got them (a step's rows in the order training made them)."""
    cols: Dict[str, np.ndarray]
    """STATS_FIELDS -> array: float64 for STATS_REAL, int64 for STATS_COUNTS."""
    measure: Optional[np.ndarray] = None
    """Per row, the ValueMeasure of its record (records only); NaN where there is none."""
    records: int = 0
    """How many records the statistics were computed from (source "records")."""
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """The first row of each series that has rows (rows are sorted by series)."""

    def __len__(self) -> int:
        return len(self.step)


def _sorted(rank: int, key: Optional[int], source: str, keys: List[Tuple[str, str]], series: np.ndarray,
            step: np.ndarray, seq: np.ndarray, cols: Dict[str, np.ndarray], measure: Optional[np.ndarray] = None,
            records: int = 0) -> Rows:
    order = np.lexsort((seq, step, series))
    series, step, seq = series[order], step[order], seq[order]
    cols = {f: c[order] for f, c in cols.items()}
    measure = measure[order] if measure is not None else None
    # A (series, step) twice: the last row written stands.
    keep = np.ones(len(step), bool)
    if len(step) > 1:
        keep[:-1] = (series[1:] != series[:-1]) | (step[1:] != step[:-1])
    if not keep.all():
        series, step, seq = series[keep], step[keep], seq[keep]
        cols = {f: c[keep] for f, c in cols.items()}
        measure = measure[keep] if measure is not None else None
    starts = np.flatnonzero(np.r_[True, series[1:] != series[:-1]]) if len(series) else np.zeros(0, np.int64)
    return Rows(rank, key, source, keys, series, step, seq, cols, measure, records, starts)


def from_table(run: Run, key: Optional[int], rank: int) -> Rows:
    """The rank's stats.npy as rows; rows of a series stats_series.jsonl does not name are left out
    (the reader warned about its damaged line)."""
    table, series = run.stats_table(rank=key)
    keys: List[Tuple[str, str]] = []
    dense: Dict[Tuple[str, str], int] = {}
    ids = np.array(sorted(series), dtype=np.int64)
    code = np.empty(len(ids), np.int64)
    for i, sid in enumerate(ids.tolist()):
        k = series[sid]
        code[i] = dense.setdefault(k, len(dense))
        if code[i] == len(keys):
            keys.append(k)
    known = np.isin(table["series"], ids)
    table = table[known]
    where = np.searchsorted(ids, table["series"])
    cols = {f: table[f].astype(np.float64 if f in STATS_REAL else np.int64) for f in STATS_FIELDS}
    return _sorted(rank, key, "statistics", keys, code[where] if len(ids) else np.zeros(0, np.int64),
                   table["step"].astype(np.int64), np.arange(len(table), dtype=np.int64), cols)


def statistics(values: np.ndarray) -> Tuple[Dict[str, float], np.ndarray]:
    """The recorder's statistics of one record's values, and the finite
    values as float64 (flattened), for a ValueMeasure."""
    a = np.asarray(values)
    if np.iscomplexobj(a):
        x = np.abs(a.astype(np.complex128)).ravel()
    else:
        x = a.astype(np.float64).ravel()
    numel = x.size
    finite = np.isfinite(x)
    n = int(np.count_nonzero(finite))
    out: Dict[str, float] = {
        "nan": int(np.count_nonzero(np.isnan(x))), "posinf": int(np.count_nonzero(x == np.inf)),
        "neginf": int(np.count_nonzero(x == -np.inf)), "zeros": int(np.count_nonzero(x == 0)), "numel": numel,
    }
    f = x if n == numel else x[finite]
    if n == 0:
        out.update(min=math.nan, max=math.nan, mean=math.nan, std=math.nan, norm=math.nan)
        return out, f
    largest = float(np.max(np.abs(f)))
    out["min"], out["max"] = float(f.min()), float(f.max())
    if largest == 0:
        out.update(mean=0.0, std=0.0, norm=0.0)
        return out, f
    # In units of the largest magnitude, as the recorder sums extreme values:
    # squares of 1e200 would overflow, of 1e-200 vanish.
    s = f / largest
    mean = float(s.mean())
    out["mean"] = mean * largest
    out["std"] = math.sqrt(float(np.mean((s - mean) ** 2))) * largest
    out["norm"] = math.sqrt(float(np.dot(s, s))) * largest
    return out, f


def from_records(run: Run, wanted: Dict[Optional[int], int], measure_of: Callable[[str, str], ValueMeasure]
                 ) -> Dict[Optional[int], Rows]:
    """Rows computed from the full records of the ranks `wanted` ({key: rank}),
    in one pass over the index, one record in memory at a time. A record that
    cannot be read is left out with a RunWarning naming it."""
    builders: Dict[Optional[int], Dict[str, list]] = {
        k: {"series": [], "step": [], "measure": [], **{f: [] for f in STATS_FIELDS}} for k in wanted}
    keys: Dict[Optional[int], Dict[Tuple[str, str], int]] = {k: {} for k in wanted}
    measures: Dict[Tuple[str, str], ValueMeasure] = {}
    records = run.records
    for i in range(len(records)):
        rec = records[i]
        k = rec.get("rank") if run.ranks else None
        if k not in builders:
            continue
        key = (rec["kind"], rec["name"])
        try:
            # The record's own line, not a lookup by step (O(1), and a
            # duplicated step is read as indexed).
            values = run._read(rec, True)
            stats, finite = statistics(values)
        except (RunError, OSError, ValueError, KeyError) as e:
            _warn(f"{rec['kind']} {_safe(rec['name'])} step {rec['step']}: cannot be read, left out of the "
                  f"statistics: {_safe(e)}")
            continue
        if key not in measures:
            measures[key] = measure_of(*key)
        fn = measures[key]
        b = builders[k]
        b["series"].append(keys[k].setdefault(key, len(keys[k])))
        b["step"].append(rec["step"])
        for f in STATS_FIELDS:
            b[f].append(stats[f])
        b["measure"].append(fn(finite) if fn is not None and finite.size == stats["numel"] and finite.size else
                            math.nan)
    out = {}
    for k, b in builders.items():
        cols = {f: np.array(b[f], dtype=np.float64 if f in STATS_REAL else np.int64) for f in STATS_FIELDS}
        out[k] = _sorted(wanted[k], k, "records", list(keys[k]), np.array(b["series"], dtype=np.int64),
                         np.array(b["step"], dtype=np.int64), np.arange(len(b["step"]), dtype=np.int64), cols,
                         np.array(b["measure"], dtype=np.float64), len(b["step"]))
    return out


def param_records(run: Run, key: Optional[int], names: List[str]) -> Iterator[Tuple[str, List[int], Iterator[
        Optional[np.ndarray]]]]:
    """For each of `names` (kind param) with full records on the rank `key`:
    (name, its steps in order, an iterator over its values as float64 (complex128) arrays,
    None for one that cannot be read, with a RunWarning). One name's records
    are read one at a time, in step order."""
    records = run.records
    for name in names:
        by_rank = run._positions(name, "param")
        positions = by_rank.get(key)
        if positions is None or len(positions) == 0:
            continue
        recs = [records[i] for i in positions.tolist()]

        def values(recs: List[Any] = recs) -> Iterator[Optional[np.ndarray]]:
            for rec in recs:
                try:
                    a = np.asarray(run._read(rec, True))
                    # A complex parameter's update is the complex difference: kept complex.
                    yield (a.astype(np.complex128) if np.iscomplexobj(a) else a.astype(np.float64)).ravel()
                except (RunError, OSError, ValueError, KeyError) as e:
                    _warn(f"param {_safe(name)} step {rec['step']}: cannot be read, left out of "
                          f"weight_update_ratio: {_safe(e)}")
                    yield None

        yield name, [r["step"] for r in recs], values()
