"""`tensortap tensorboard RUN`: a run's statistics, scalar tensors,
histograms and flight-recorder dumps as TensorBoard event files.

The files are those of writers/src/tensorboard/EVENTS.md, the page the
recorder's own events (Options::tensorboard) follow too: protobuf Event
messages in TFRecord framing (masked CRC-32C), encoded here by hand, with
NumPy and nothing else (no tensorboard, no protobuf package).

Where they go: into the run directory (each rank's folder), unless the
recorder already wrote its events there (a second copy would show every
point twice); or, with `logdir`, into logdir/<the run's folder name>/, with
rank<r>/ per rank as the run has them. A file is created exclusively and
never through a symbolic link (nor a folder it goes into, below `logdir`:
_safe_write.py, shared with the Python twin's writer); an export that
fails removes the files it made. The records come through the reader,
which refuses index paths out of the run.

What it can show is what the run stored: records the recorder only held
(a flight recorder that never dumped them) or took for statistics alone
have no bytes in the run, so their histograms, which the recorder's own
events have, are not exported; a 0-d tensor's `tensor/<name>` comes from
its statistics row then, as the recorder writes it for a CUDA tensor.
Histograms are taken every `histograms_every` steps as given (default
100), whatever the run's own TensorBoardOptions said; the statistics are
the run's TensorBoardOptions::stats (run.json), or the defaults (mean std
min max norm, and nonfinite) for a run recorded without TensorBoard.
"""

from __future__ import annotations

import errno
import heapq
import os
import re
import socket
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from .._base import STATS_FIELDS, RunError, _is_int, _warn, nonfinite
from .._files import has_statistics
from .._names import EVENTS_PREFIX, EVENTS_SUFFIX, STATS_TABLE, is_events_file_name
from .._safe_write import new_file, open_folders, open_top
from .events import (FILE_VERSION, _custom_scalars_value, _event, _histogram_value, _scalar_head, _summary,
                     _text_value, frame)
from .values import histogram, scalar_value
# dump_line and dump_lines: the tests' and tb_check.py's, from here.
from .charts import check_stats, dump_line, dump_lines, layout, run_stats, written_fields  # noqa: F401

if TYPE_CHECKING:
    from .._run import Run

DUMPS_TAG = "tensortap/dumps"


# -- dumps -----------------------------------------------------------------------


# -- one rank's events -------------------------------------------------------------


def _say_tag_collisions(scalars, statistics, where, suffixes):
    """Warns once per pair where a 0-d tensor's tag (`tensor/x/norm`) is one a
    tensor's statistic has (the norm of `x`; `suffixes`: the statistics'
    tags written): the tag scheme is fixed (docs/design.md#tensorboard), so the
    two charts mix. As the recorder says it."""
    for name in sorted(scalars):
        base, slash, field = name.rpartition("/")
        if slash and field in suffixes and base in statistics:
            _warn(f"{where}: the 0-d tensor {name!r} and the statistics of the tensor {base!r} both write the "
                  f"TensorBoard tag 'tensor/{name}': their charts mix; rename one of them to tell them apart")


def scalar_series(run, rank, table, series):
    """The statistics series of the rank that are 0-d `tensor` records (their
    one scalar is `tensor/<name>`, not statistics), the names of 0-d `tensor`
    records the index holds, the (name, step) of each, and the names whose
    0-d records are complex (their rows give nothing, as the recorder writes
    nothing of a complex 0-d tensor). A series is 0-d when the index holds a 0-d
    `tensor` record of its name; when it holds only others, it is not; when
    it holds none (a statistics-only run), when every row counts one value."""
    index = run._index
    sources = {i for i, src in enumerate(index.sources) if src[2] == rank}
    zero_d: Set[str] = set()
    other: Set[str] = set()
    complex_names: Set[str] = set()  # 0-d records of a complex dtype: no scalar
    stored: Set[tuple] = set()
    if sources and len(index):
        mine = np.isin(index.source, list(sources))
        for m in set(index.meta[mine].tolist()):
            kind, name, dtype, shape = index.metas[m][:4]
            if kind == "tensor":
                (other if len(shape) else zero_d).add(name)
                if not len(shape) and str(dtype).startswith("complex"):
                    complex_names.add(name)
        is_scalar = np.array([m[0] == "tensor" and not len(m[3]) for m in index.metas] + [False])
        pos = np.flatnonzero(mine & is_scalar[index.meta])
        stored = set(zip([index.metas[m][1] for m in index.meta[pos].tolist()], index.step[pos].tolist()))
    not_one = set(table["series"][table["numel"] != 1].tolist()) if len(table) else set()
    scalars = set()
    for s, (kind, name) in series.items():
        if kind == "tensor" and (name in zero_d or (name not in other and s not in not_one)):
            scalars.add(s)
    return scalars, zero_d, stored, complex_names


def _row_scalar(row) -> bytes:
    """A 0-d tensor's value from its statistics row, as a float32: the NaN or
    the Inf the counts say, else the one finite value (min)."""
    if row["nan"] > 0:
        v = float("nan")
    elif row["posinf"] > 0:
        v = float("inf")
    elif row["neginf"] > 0:
        v = float("-inf")
    else:
        v = float(row["min"])
    with np.errstate(over="ignore", invalid="ignore"):  # past FLT_MAX: inf, as C++'s cast gives
        return np.float64(v).astype("<f4").tobytes()


class _Table:
    """A rank's statistics table as the export uses it: the rows, their
    series, and which series are 0-d tensors' (scalar_series)."""

    def __init__(self, run: "Run", rank: Optional[int], table: np.ndarray,
                 series: Dict[int, Tuple[str, str]]) -> None:
        self.table, self.series = table, series
        self.scalars, self.zero_d, self.stored, self.silent = scalar_series(run, rank, table, series)


def _read_table(run: "Run", rank: Optional[int], directory: str) -> Optional[_Table]:
    """The rank's statistics table, or None: no table, no rows, or one
    that cannot be read (said, costing only the statistics)."""
    if not has_statistics(directory):
        return None
    try:
        table, series = run.stats_table(rank=rank)
    except RunError as e:
        # A table cut short (a crash, a full disk) costs only the statistics:
        # the records and dumps are exported all the same.
        _warn(f"{os.path.join(directory, STATS_TABLE)}: the statistics are not exported: {e}")
        return None
    if len(table) == 0:
        return None
    return _Table(run, rank, table, series)


def chart_names(run: "Run", rank: Optional[int], loaded: Optional[_Table]) -> Tuple[Set[str], Set[str], Set[str]]:
    """The names the rank's events chart (EVENTS.md, "The layout"), each as
    the reader names it: the 0-d tensors that give a scalar (a real 0-d
    `tensor` record in the index, or a 0-d series of the table, not complex,
    with a row), and the `grad` and `activation` series with rows (their
    statistics' tags). Whether their statistic is written is the caller's."""
    scalars: Set[str] = set()
    index = run._index
    sources = {i for i, src in enumerate(index.sources) if src[2] == rank}
    if sources and len(index):
        for m in set(index.meta[np.isin(index.source, list(sources))].tolist()):
            kind, name, dtype, shape = index.metas[m][:4]
            if kind == "tensor" and not len(shape) and not str(dtype).startswith("complex"):
                scalars.add(name)
    grads: Set[str] = set()
    activations: Set[str] = set()
    if loaded is not None:
        for s in set(loaded.table["series"].tolist()):
            key = loaded.series.get(s)
            if key is None:
                continue  # not exported (said by _stats_events)
            if s in loaded.scalars:
                if key[1] not in loaded.silent:
                    scalars.add(key[1])
            elif key[0] == "grad":
                grads.add(key[1])
            elif key[0] == "activation":
                activations.add(key[1])
    return scalars, grads, activations


def _stats_events(directory, stats, loaded: Optional[_Table]):
    """(step, 0, row, event) for each row of the rank's statistics table that
    gives one, by step: the chosen statistics (`stats`) and `nonfinite` from
    a series' first row with a NaN or an Inf; a 0-d tensor's `tensor/<name>`
    where no record of its step is stored."""
    if loaded is None:
        return
    table, series = loaded.table, loaded.series
    fields, one_tag = written_fields(stats)
    columns = [STATS_FIELDS.index(f) for f in fields]
    with np.errstate(over="ignore", invalid="ignore"):  # past FLT_MAX: inf, as C++'s cast gives
        values = np.stack([table[f].astype("<f4") for f in STATS_FIELDS], axis=1)
        bad = nonfinite(table).astype("<f4")
    scalars, zero_d, stored, silent = loaded.scalars, loaded.zero_d, loaded.stored, loaded.silent
    _say_tag_collisions({series[s][1] for s in scalars} | zero_d,
                        {name for s, (kind, name) in series.items() if kind == "tensor" and s not in scalars},
                        directory, fields + (["nonfinite"] if one_tag else []))
    order = np.argsort(table["step"], kind="stable")
    steps = table["step"].tolist()
    ids = table["series"].tolist()
    heads: Dict[int, Optional[list]] = {}  # series -> its value heads, or None: not in stats_series.jsonl
    gone: Set[int] = set()  # series whose nonfinite count has been nonzero
    for row in order.tolist():
        s = ids[row]
        if s not in heads:
            key = series.get(s)
            if key is None:
                _warn(f"{os.path.join(directory, STATS_TABLE)}: rows of series {s}, which stats_series.jsonl does "
                      "not name, are not exported")
                heads[s] = None
            elif s in scalars:
                heads[s] = [_scalar_head(f"tensor/{key[1]}")]
            else:
                heads[s] = [_scalar_head(f"{key[0]}/{key[1]}/{f}") for f in fields + ["nonfinite"]]
        h = heads[s]
        if h is None:
            continue
        step = steps[row]
        if s in scalars:
            if (series[s][1], step) not in stored and series[s][1] not in silent:
                yield step, 0, row, _event(step, h[0] + _row_scalar(table[row]))
            continue
        floats = values[row].tobytes()
        parts = [h[k] + floats[4 * j:4 * j + 4] for k, j in enumerate(columns)]
        if one_tag and (bad[row] != 0 or s in gone):
            gone.add(s)
            parts.append(h[-1] + bad[row].tobytes())
        if parts:
            yield step, 0, row, _event(step, b"".join(parts))


def _record_events(run, rank, histograms_every):
    """(step, 1, position, [events]) for the records of the rank that give
    events (a 0-d tensor record's scalar; a histogram of every other record
    at a histogram step), by step."""
    index = run._index
    sources = [i for i, s in enumerate(index.sources) if s[2] == rank]
    if not sources or len(index) == 0:
        return
    pos = np.flatnonzero(index.source == sources[0])
    scalar_meta = np.array([m[0] == "tensor" and len(m[3]) == 0 for m in index.metas] + [False])
    steps = index.step[pos]
    want = scalar_meta[index.meta[pos]]
    if histograms_every > 0:
        want |= steps % histograms_every == 0
    pos = pos[want]
    pos = pos[np.argsort(index.step[pos], kind="stable")]
    for i in pos.tolist():
        rec = index.record(i)
        step = rec["step"]
        try:
            a = run._read(rec, mmap=True)
        except Exception as e:  # noqa: BLE001 - one record's file costs only its events
            _warn(f"{rec.index}:{rec.lineno}: {rec['kind']} {rec['name']!r} step {step} is not exported: "
                  f"{type(e).__name__}: {e}")
            continue
        events = []
        if scalar_meta[index.meta[i]]:
            f = scalar_value(a)  # the one scalar; no histogram of one value
            if f is not None:
                events.append(_event(step, _scalar_head(f"tensor/{rec['name']}") + f))
        elif histograms_every > 0 and step % histograms_every == 0:
            h = histogram(a)
            if h is not None:
                events.append(_event(step, _summary(_histogram_value(f"{rec['kind']}/{rec['name']}", h))))
        del a
        if events:
            yield step, 1, i, events


def _dump_events(directory, info):
    for n, (step, line) in enumerate(sorted(dump_lines(directory, info), key=lambda p: p[0])):
        yield step, 2, n, _event(step, _summary(_text_value(DUMPS_TAG, line)))


def rank_events(run, rank, histograms_every=100, stats: Optional[Sequence[str]] = None):
    """The framed events of one rank of `run` (None: a single-rank run's), by
    step; within a step, statistics, then records (in the index's order),
    then dumps. The first is the file_version event, the second the custom
    scalars layout. `stats`: the statistics written (None: the rank's own
    TensorBoardOptions::stats, run_stats)."""
    directory = run._dirs[rank]
    stats = run_stats(run.infos[rank]) if stats is None else check_stats(stats)
    loaded = _read_table(run, rank, directory)
    yield frame(_event(0, file_version=FILE_VERSION))
    # Every name is known before the first value: one layout, at step 0
    # (the recorder, which learns names as they come, writes it again).
    fields, _ = written_fields(stats)
    scalars, grads, activations = chart_names(run, rank, loaded)
    charts = layout(scalars, grads if "norm" in fields else (), activations if "std" in fields else ())
    yield frame(_event(0, _summary(_custom_scalars_value(charts))))
    merged = heapq.merge(_stats_events(directory, stats, loaded),
                         _record_events(run, rank, histograms_every),
                         _dump_events(directory, run.infos[rank]))
    for _, _, _, events in merged:
        if isinstance(events, bytes):
            yield frame(events)
        else:
            for e in events:
                yield frame(e)


# -- files and folders -------------------------------------------------------------------


def events_file_name(seconds=None, host=None, pid=None) -> str:
    """events.out.tfevents.<unix seconds, 10 digits>.<host>.<pid>.tensortap, the
    host name's characters outside [A-Za-z0-9_-] as "_"."""
    seconds = int(time.time()) if seconds is None else seconds
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname() if host is None else host) or "localhost"
    return f"{EVENTS_PREFIX}{seconds:010d}.{host}.{os.getpid() if pid is None else pid}{EVENTS_SUFFIX}"


def _targets(run, logdir):
    """[(rank, [folder names below the top], shown path)] and the top folder:
    the run directory, or logdir with the run's folder name below it."""
    ranks = [None] if not run.ranks else run.ranks
    if logdir is None:
        top = run.path
        chain = []
    else:
        top = os.fspath(logdir)
        base = os.path.basename(os.path.abspath(run.path))
        if not base:
            raise RunError(f"{run.path}: the run directory has no name to make a folder of in {top}")
        chain = [base]
    out = []
    for r in ranks:
        names = chain + ([] if r is None else [os.path.basename(run._dirs[r])])
        out.append((r, names, os.path.join(top, *names)))
    return top, out


def _refuse_existing(top, targets, logdir):
    """RunError if a target folder already holds tensortap event files; also
    refuses a link at any folder below the top before anything is made."""
    top_fd = open_top(top, create=False)
    if top_fd is None:
        return
    try:
        for _, names, shown in targets:
            fd = open_folders(top_fd, names, top, create=False)
            if fd is None:
                continue
            try:
                found = sorted(n for n in os.listdir(fd) if is_events_file_name(n))
            finally:
                os.close(fd)
            if found:
                where = os.path.join(shown, found[0])
                if logdir is None:
                    raise RunError(f"{where}: the run already holds TensorBoard events (the recorder's, written "
                                   "while it ran, or an earlier export's); exporting into the run again would show "
                                   "every point twice. Point TensorBoard at the run as it is, or pass --logdir DIR "
                                   "(logdir=) to export elsewhere")
                raise RunError(f"{where}: this folder already holds tensortap's TensorBoard events; another "
                               "export would show every point twice. Remove them, or pass another --logdir")
    finally:
        os.close(top_fd)


def _write_file(dir_fd, name, shown, events):
    """Writes `events` (framed) to the new file `name` in `dir_fd` (created
    exclusively, never through a link), then syncs it; on failure the file
    is removed. Errors name `shown`."""
    with new_file(dir_fd, name, shown, sync=True, buffering=1 << 20) as f:
        # Errors reading the run come as they are; writing's name the file.
        for event in events:
            try:
                f.write(event)
            except OSError as x:
                raise OSError(x.errno, x.strerror, shown) from None


def export_tensorboard(run: Run, logdir: Union[str, "os.PathLike[str]", None] = None,
                       histograms_every: int = 100, stats: Optional[Sequence[str]] = None) -> List[str]:
    """Writes the TensorBoard events of `run` (an open Run: `Run.export_tensorboard`
    is the public entry), one file per rank; returns the paths written.
    Statistics rows as scalars `<kind>/<name>/<stat>` for each stat of
    `stats` (None: the run's own TensorBoardOptions::stats, or mean, std,
    min, max and norm) and `<kind>/<name>/nonfinite` from a tensor's first
    NaN or Inf (unless a count is named), a 0-d tensor as the one scalar
    `tensor/<name>`, histograms `<kind>/<name>` of every other record at the
    steps where step % histograms_every == 0 (0: none), dumps as text
    `tensortap/dumps`, and the custom scalars layout.

    Without `logdir`, into the run directory (each rank's folder), refused
    with a RunError when one already holds tensortap event files (the
    recorder's: Options::tensorboard). With `logdir`, into
    logdir/<the run's folder name>/ (rank<r>/ for each rank), refused the
    same way when a folder there holds some already.

    It takes a Run, not a path: opening one is _run's (which imports this
    module), so the two never import each other."""
    if isinstance(run, (str, bytes, os.PathLike)):
        raise TypeError(f"export_tensorboard wants an open Run, not the path {run!r}: "
                        "tensortap.open(path).export_tensorboard(...)")
    if not _is_int(histograms_every) or histograms_every < 0:
        raise ValueError(f"histograms_every must be an integer >= 0 (0: no histograms), not {histograms_every!r}")
    if stats is not None:
        stats = check_stats(stats)
    top, targets = _targets(run, logdir)
    _refuse_existing(top, targets, logdir)
    name = events_file_name()
    written = []  # (dir fd, shown path): removed again if a later rank fails
    top_fd = open_top(top, create=logdir is not None)
    if top_fd is None:  # the run directory, removed since the run was opened
        raise OSError(errno.ENOENT, "removed while the events were being written", top)
    try:
        for rank, names, shown in targets:
            fd = open_folders(top_fd, names, top, create=True)
            path = os.path.join(shown, name)
            try:
                _write_file(fd, name, path, rank_events(run, rank, histograms_every, stats))
            except BaseException:
                os.close(fd)
                raise
            written.append((fd, path))
    except BaseException:
        for fd, _ in written:
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass
        raise
    finally:
        os.close(top_fd)
        for fd, _ in written:
            os.close(fd)
    return [path for _, path in written]
