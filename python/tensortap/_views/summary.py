"""The text summary of a run and its --check, shared by `tensortap inspect`
and `tensortap report`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, TextIO, Tuple

import math
import os
import shlex
import stat
import sys

import numpy as np

from .._base import NUMPY_DTYPES, GivenUpError, RunError, _safe, nonfinite
from .._ctl.log import summary_lines as ctl_summary_lines
from .._files import has_statistics, monitoring_line
from .._doctor.rules import RULES
from .._doctor.groups import rule_tier
from .._float8 import FORMATS as FORMATS_FLOAT8
from .._names import DUMPS, INDEX, STATS_SERIES, ballast_name, index_segment_name, index_segment_number
from .._optional import progress

if TYPE_CHECKING:
    from .._run import Run

def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    # Python integers: the index's shape is not trusted to fit in int64 products.
    # A float8's file holds its bytes, not the float32 the reader returns.
    itemsize = 1 if dtype in FORMATS_FLOAT8 else np.dtype(NUMPY_DTYPES.get(dtype, "uint8")).itemsize
    return math.prod(shape) * itemsize


# Dumped steps below a budget's marker named in its line; past that, a count.
KEPT_LISTED = 8


def _budget_line(b: Dict[str, Any], given_up: Optional[Tuple[int, int, Sequence[int]]] = None) -> str:
    """run.json's "budget" (Options::max_bytes, docs/design.md#leaving-it-on) in words.
    `given_up`: (k, records hidden, the dumped steps below k still shown) of
    the rank's marker "given_up_below" as the reader took it (Run.given_up_below,
    Run.given_up_records); None where it has none or refused it."""
    line = f"disk budget {_human(b.get('max_bytes', 0))} ({_safe(b.get('policy', '?'))})"
    if b.get("reached_at_step") is None and given_up is None:
        return line + ": not reached"
    if b.get("reached_at_step") is not None:
        line += f": reached at step {_safe(b['reached_at_step'])}"
    if b.get("refused_records"):
        line += f", {_safe(b['refused_records'])} full records refused ({_human(b.get('refused_bytes', 0))})"
    if given_up is not None:
        k, hidden, kept = given_up
        line += (f", steps below {k} given up: {hidden} indexed record{'s' if hidden != 1 else ''} "
                 "hidden")
        if kept:
            shown = ", ".join(str(s) for s in kept[:KEPT_LISTED])
            more = f" and {len(kept) - KEPT_LISTED} more" if len(kept) > KEPT_LISTED else ""
            line += f"; step{'s' if len(kept) != 1 else ''} {shown}{more} kept: dumped"
        # What the marker gave up besides records (docs/design.md#leaving-it-on).
        gone = [f"{_safe(b[key])} {what}" for key, what in (("stats_rows_given_up", "statistics rows"),
                                                            ("event_files_given_up", "TensorBoard event files"))
                if isinstance(b.get(key), int) and b[key] > 0]
        if isinstance(b.get("dumps_given_up_below"), int):
            gone.append(f"dumped steps below {b['dumps_given_up_below']} (the dumps' share)")
        if gone:
            line += "; given up with them: " + ", ".join(gone)
    elif b.get("given_up_below") is not None:
        line += f", given_up_below {_safe(b['given_up_below'])} ignored: not a step"
    return line


def given_up(run: Run, rank: Optional[int]) -> Optional[Tuple[int, int, List[int]]]:
    """(k, records hidden, the steps below k still shown: dumped) of the
    rank's budget marker, or None where it has none (_budget_line's)."""
    k = run.given_up_below.get(rank)
    if k is None:
        return None
    index = run._index
    sources = [s for s, src in enumerate(index.sources) if src[2] == rank]
    mine = np.isin(index.source, sources) & (index.step < k)
    return k, run.given_up_records.get(rank, 0), np.unique(index.step[mine]).tolist()


def summarize(run: Run, out: Optional[TextIO] = None, doctor_hint: bool = False) -> List[str]:
    """Prints the summary; returns the problems it met (statistics that cannot be read).
    `doctor_hint`: end with the line that says how to evaluate the health rules (inspect's;
    the report page shows their findings instead)."""
    out = out if out is not None else sys.stdout
    _print_run(run, out)
    _print_records(run, out)
    problems = _print_statistics(run, out)
    dumps = run.dumps
    _print_dumps(run, dumps, out)
    for line in ctl_summary_lines(run):
        print(f"  {line}", file=out)
    print(f"  {live_health_line(run, dumps)}", file=out)
    if doctor_hint:
        # shlex: the line can be pasted into a shell whatever the path holds.
        print(f"  run tensortap doctor {shlex.quote(_safe(run.path))} for the training health rules", file=out)
    return problems


def _print_run(run: Run, out: TextIO) -> None:
    """The run's header: versions, format, ranks, and per rank how it ended,
    its budget and its monitoring."""
    info = run.info
    opts = info.get("options", {})
    if not isinstance(opts, dict):
        opts = {}
    print(f"run {_safe(run.path)}", file=out)
    print(f"  tensortap {_safe(info.get('tensortap_version', '?'))}, torch {_safe(info.get('torch_version', '?'))}, "
          f"format {_safe(opts.get('format', '?'))}, started {_safe(info.get('start_time', '?'))}", file=out)
    if run.ranks:
        print(f"  ranks {run.ranks} (world size {_safe(info.get('world_size', '?'))})", file=out)
    for rank, i in sorted(run.infos.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        where = "" if rank is None else f"rank {rank}: "
        if i.get("closed"):
            print(f"  {where}closed cleanly: {_safe(i.get('records', 0))} records, {_safe(i.get('bytes', 0))} bytes, "
                  f"{_safe(i.get('dropped', 0))} dropped, {_safe(i.get('errors', 0))} errors", file=out)
        else:
            print(f"  {where}NOT closed (crashed, killed, or still running)", file=out)
        budget = i.get("budget")
        if isinstance(budget, dict):
            print(f"  {where}{_budget_line(budget, given_up(run, rank))}", file=out)
        stopped = monitoring_line(i)
        if stopped:
            print(f"  {where}{stopped}", file=out)


def _print_records(run: Run, out: TextIO) -> None:
    """A line per (kind, name): steps, shapes, dtypes, bytes; then the total."""
    rows = []
    index = run._index
    # From the index's columns, grouped by name in one sort: no record
    # becomes a dict here.
    order, starts = index.grouped()
    for kind in run.kinds():
        for name in run.names(kind):
            key = index.key_code(kind, name)
            assert key is not None  # a name the index lists has a key
            pos = order[starts[key]:starts[key + 1]]
            steps = np.unique(index.step[pos])
            metas, counts = np.unique(index.meta[pos], return_counts=True)
            metas = [index.metas[m] for m in metas.tolist()]
            shapes = sorted({m[3] for m in metas})
            dtypes = sorted({m[2] for m in metas})
            shape = str(shapes[0]) if len(shapes) == 1 else f"{len(shapes)} shapes"
            nbytes = sum(c * _nbytes(m[3], m[2]) for m, c in zip(metas, counts.tolist()))
            rows.append((kind, _safe(name), str(len(steps)), f"{steps[0]}..{steps[-1]}", shape,
                         _safe(",".join(dtypes)), _human(nbytes)))
    header = ("kind", "name", "steps", "first..last", "shape", "dtype", "bytes")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    for row in [header] + rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)
    counts = np.bincount(index.meta, minlength=len(index.metas)).tolist()
    total = sum(c * _nbytes(m[3], m[2]) for m, c in zip(index.metas, counts) if c)
    print(f"  total: {len(run.records)} records, {_human(total)}", file=out)


def _print_statistics(run: Run, out: TextIO) -> List[str]:
    """Per rank, its statistics table's rows and first non-finite step;
    returns the problems met (a table that cannot be read)."""
    problems: List[str] = []
    ranks: List[Optional[int]] = list(run.ranks) if run.ranks else [None]
    for r in ranks:
        where = "" if r is None else f"rank {r}: "
        # No stats.npy is a run made without statistics, not a problem.
        if not has_statistics(run._dirs[r]):
            continue
        try:
            table, series = run.stats_table(rank=r)
        except RunError as e:
            problems.append(f"{where}statistics cannot be read: {_safe(e)}")
            print(f"  {problems[-1]}", file=out)
            continue
        bad = table[nonfinite(table) > 0]
        first = f", first non-finite at step {bad['step'].min()}" if len(bad) else ", all finite"
        print(f"  {where}statistics: {len(table)} rows of {len(series)} tensors{first}", file=out)
    return problems


def _print_dumps(run: Run, dumps: List[Dict[str, Any]], out: TextIO) -> None:
    """The flight recorder's dumps: counted by rule past a few, each shown
    with its cause and steps."""
    shown, counts = dump_digest(dumps)
    if counts:
        # Thousands of dumps (a rule that fires every step) would bury the
        # summary: counts, then the first and the last few.
        print(f"  {len(dumps)} flight recorder dumps:", file=out)
        for (rule, reason), n in counts:
            print(f"    {n:>8}  {_safe(rule)} ({_safe(reason)})", file=out)
    for k, dump in enumerate(shown):
        if counts and k == len(shown) // 2:
            print(f"  ... {len(dumps) - len(shown)} more dumps ...", file=out)
        where = "" if dump.get("rank") is None else f"rank {dump['rank']}: "
        cause = f" in {_safe(dump.get('kind', '?'))} {_safe(dump['name'])}" if "name" in dump else ""
        if dump.get("reason") == "stall" and isinstance(dump.get("stalled_seconds"), (int, float)):
            # What a stall says beyond its steps: how long, and who waited in tensortap.
            cause = f": no step() for {dump['stalled_seconds']:.3g} s"
            waiting = dump.get("waiting")
            if isinstance(waiting, list) and waiting:
                cause += "; waiting: " + "; ".join(_safe(w) for w in waiting)
        steps = dump.get("steps")
        span = f"steps {_safe(steps[0])}..{_safe(steps[-1])}" if isinstance(steps, list) and steps else "no steps"
        span += _dump_fate(run, dump)
        print(f"  {where}flight recorder dump at step {_safe(dump.get('step', '?'))} "
              f"({_safe(dump.get('reason', '?'))}{cause}): {span}", file=out)


def _dump_fate(run: Run, dump: Dict[str, Any]) -> str:
    """What became of a dump's steps since (docs/design.md#leaving-it-on): those the
    dumps' share gave up later (below the rank's marker and its
    "dumps_given_up_below"), and the held steps it could not keep."""
    out = ""
    steps = [s for s in dump.get("steps") or [] if isinstance(s, int) and not isinstance(s, bool)]
    rank = dump.get("rank")
    k = run.given_up_below.get(rank)
    budget = run.infos.get(rank, {}).get("budget")
    gone_below = budget.get("dumps_given_up_below") if isinstance(budget, dict) else None
    if k is not None and isinstance(gone_below, int) and not isinstance(gone_below, bool):
        gone = [s for s in steps if s < k and s < gone_below]
        if gone:
            out += (f" ({len(gone)} of them given up since: the dumps' share, given_up_below {k}, "
                    f"dumps_given_up_below {gone_below})")
    refused = dump.get("refused_steps")
    if isinstance(refused, list) and refused:
        out += f"; {len(refused)} held step{'s' if len(refused) != 1 else ''} refused: {_safe(dump.get('refused_reason', '?'))}"
    return out


def live_health_line(run: Run, dumps: Sequence[Dict[str, Any]]) -> str:
    """How often the health rules fired live (dumps whose reason is a rule's
    name, written by the C++ recorder's health triggers): counted from the
    dumps already read, never evaluated here, so that inspect stays fast.
    With none fired, the rules that were on (run.json's dump_on), so that 0
    is not taken for a verdict when none was. `dumps`: run.dumps, read once
    (each read warns again about a damaged dump)."""
    fired: Dict[str, int] = {}
    first: Dict[str, int] = {}
    for d in dumps:
        reason = d.get("reason")
        if isinstance(reason, str) and reason in RULES:
            fired[reason] = fired.get(reason, 0) + 1
            step = d.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                first[reason] = min(first.get(reason, step), step)
    if fired:
        # The doctor's order (docs/health.md): rules that name a cause before
        # those that name its consequences, then the earliest firing.
        order = sorted(fired, key=lambda r: (rule_tier(r), first.get(r, 0), RULES.index(r)))
        return (f"health rules fired live: {sum(fired.values())} ("
                + ", ".join(f"{r} {fired[r]}" for r in order) + ")")
    on = set()
    for info in run.infos.values():
        opts = info.get("options")
        triggers = opts.get("dump_on") if isinstance(opts, dict) else None
        for t in triggers if isinstance(triggers, list) else []:
            kind = t.get("kind") if isinstance(t, dict) else None
            if isinstance(kind, str) and kind in RULES:
                on.add(kind)
    if not on:
        return "health rules fired live: 0 (none was on)"
    return "health rules fired live: 0 (on: " + ", ".join(r for r in RULES if r in on) + ")"


# More dumps than this are summarized (inspect, report): counts per rule
# and reason, and the first and last DUMPS_SHOWN / 2.
DUMPS_LISTED = 24
DUMPS_SHOWN = 10


def _rule(d: Dict[str, Any]) -> str:
    trigger = d.get("trigger")
    return trigger.get("kind", "?") if isinstance(trigger, dict) else "user" if "name" not in d else "?"


def dump_digest(dumps: Sequence[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], List[Tuple[Tuple[str, str], int]]]:
    """(the dumps to list, [((rule, reason), count)] or [] when all are
    listed): every dump up to DUMPS_LISTED, past that the first and last
    DUMPS_SHOWN / 2 and the counts, most frequent first."""
    if len(dumps) <= DUMPS_LISTED:
        return list(dumps), []
    counts: Dict[Tuple[str, str], int] = {}
    for d in dumps:
        key = (str(_rule(d)), str(d.get("reason", "?")))
        counts[key] = counts.get(key, 0) + 1
    half = DUMPS_SHOWN // 2
    return list(dumps[:half]) + list(dumps[-half:]), sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def kept_room(run: Run) -> List[str]:
    """The room a recorder keeps for its lines files on a full disk
    (writers/src/lines_file.h): blocks allocated past a lines file's end, or
    a ballast file where the file system has no fallocate. close() gives it
    back; a run killed before close() keeps it (up to 64 KiB a lines file, or
    one batch's index lines). Not a problem: said, with what it costs."""
    notes: List[str] = []
    for d in sorted({os.path.realpath(p) for p in run._dirs.values()}):
        for name in _lines_files(d):
            path = os.path.join(d, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            block = max(st.st_blksize, 512)
            kept = st.st_blocks * 512 - (st.st_size + block - 1) // block * block
            if kept >= block:
                notes.append(f"{_safe(path)}: {kept} bytes allocated past its end (room kept for its lines on a "
                             "full disk; the recorder did not close)")
            ballast = os.path.join(d, ballast_name(name))
            try:
                bst = os.lstat(ballast)
            except OSError:
                continue
            if stat.S_ISREG(bst.st_mode):
                notes.append(f"{_safe(ballast)}: {bst.st_size} bytes kept for {name}'s lines on a full disk (a file "
                             "system without fallocate; the recorder did not close)")
    return notes


def _lines_files(directory: str) -> List[str]:
    """The names of a rank directory's lines files that may keep room:
    index.jsonl, its segments (index.<n>.jsonl, Budget::KeepLatest; one
    whose ballast is left counts too), stats_series.jsonl and dumps.jsonl."""
    try:
        entries = os.listdir(directory)
    except OSError:
        entries = []
    numbers = set()
    for entry in entries:
        n = index_segment_number(entry)
        if n is None and entry.startswith(".") and entry.endswith(".room"):
            n = index_segment_number(entry[1:-len(".room")])
        if n is not None:
            numbers.add(n)
    return [INDEX] + [index_segment_name(n) for n in sorted(numbers)] + [STATS_SERIES, DUMPS]


def _given_up_note(rank: Optional[int], errors: List[GivenUpError]) -> str:
    """check's note on a rank's records given up while it read them."""
    steps = sorted({e.step for e in errors if e.step is not None})
    k = max((e.given_up_below for e in errors if e.given_up_below is not None), default=None)
    listed = ", ".join(str(s) for s in steps[:KEPT_LISTED])
    more = f" and {len(steps) - KEPT_LISTED} more" if len(steps) > KEPT_LISTED else ""
    span = f" (step{'s' if len(steps) != 1 else ''} {listed}{more})" if steps else ""
    n = len(errors)
    return (f"{'' if rank is None else f'rank {rank}: '}{n} record{'s' if n != 1 else ''}{span} given up since the "
            f"check began (the disk budget, Budget::KeepLatest: run.json's given_up_below is now {k}); not read, "
            "not a problem")


def check(run: Run, out: Optional[TextIO] = None, found: Sequence[str] = ()) -> int:
    """Opens every indexed file; returns the number of problems, counting those
    already `found` (damaged lines skipped, statistics that cannot be read).
    A record the disk budget gave up while the check went on (a live run
    under Budget::KeepLatest: GivenUpError) is no problem, the run being
    what its recorder keeps: said in a note per rank."""
    out = out if out is not None else sys.stdout
    problems = 0
    given_up: Dict[Optional[int], List[GivenUpError]] = {}
    for problem in found:
        print(f"  BAD {problem}", file=out)
        problems += 1
    for rec in progress(run.records, desc="checking"):
        where = f"{rec['kind']} {rec['name']!r} step {rec['step']}" + (f" rank {rec['rank']}" if "rank" in rec else "")
        file = _safe(rec["file"])
        try:
            # This record, not the first with its name and step: a planted
            # duplicate must be checked too.
            a = run._read(rec, mmap=False)
        except GivenUpError as e:
            given_up.setdefault(rec.get("rank"), []).append(e)
            continue
        except RunError as e:
            print(f"  BAD {where}: {_safe(e)}", file=out)
            problems += 1
            continue
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            print(f"  BAD {where}: cannot read {file}: {_safe(e)}", file=out)
            problems += 1
            continue
        try:
            want_dtype = np.dtype(NUMPY_DTYPES.get(rec["dtype"], rec["dtype"]))
        except Exception:  # noqa: BLE001 - a dtype NumPy does not know matches nothing
            want_dtype = None
        if list(a.shape) != rec["shape"] or a.dtype != want_dtype:
            print(f"  BAD {where}: {file} holds {a.dtype}{list(a.shape)}, "
                  f"the index says {_safe(rec['dtype'])}{rec['shape']}", file=out)
            problems += 1
    leftovers = [os.path.join(d, f) for d, _, fs in os.walk(run.path) for f in fs if f.endswith(".tmp")]
    for f in leftovers:
        print(f"  note: unfinished temporary file {_safe(f)} (a crash mid-write; not indexed)", file=out)
    for note in kept_room(run):
        print(f"  note: {note}", file=out)
    for rank, errors in sorted(given_up.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        print(f"  note: {_given_up_note(rank, errors)}", file=out)
    print(f"  check: {len(run.records)} records, {problems} problems", file=out)
    return problems
