"""A run's small files, read without trusting them: opened only as regular
files, JSON and JSON lines decoded so that a bad line costs only itself, the
flight recorder's dumps, and the disk budget's marker of the steps given up."""

from __future__ import annotations

import builtins
import json
import os
from typing import Any, BinaryIO, Callable, Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

from . import _safe_read
from ._base import RunError, _is_int64, _json_type, _reason, _safe, _warn
from ._names import DUMPS, DUMPS_OLD, RUN_JSON, stats_segment_number


def _open_regular(path: str, follow: bool = True) -> BinaryIO:
    """An open binary file of `path`, refused unless it is a regular file: a FIFO
    or a device planted under a known name would block the reader or never end.
    With follow=False a symbolic link at `path` is refused too (RunError).
    Every module of the reader opens a run's files through this name, looked
    up when called (the tests count the opens)."""
    try:
        fd, _ = _safe_read.open_regular(path, follow)
    except _safe_read.NotRegular:
        raise RunError(f"{path}: not a regular file") from None
    except OSError:
        if not follow and os.path.islink(path):
            raise RunError(f"{path}: a symbolic link, not a file tensortap writes") from None
        raise
    try:
        return builtins.open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_json(path: str) -> Dict[str, Any]:
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


def _read_lines(path: str, follow: bool = True, warn: Callable[[str], None] = _warn) -> Iterator[Tuple[int, Any]]:
    """(line number, value) for each JSON line of `path`, if it exists. Read as
    bytes and decoded line by line, so that a bad line (torn, garbage, invalid
    UTF-8) costs only itself. An unterminated last line that does not parse is a
    write torn by a crash: skipped silently. Other bad lines: a RunWarning.
    With follow=False a symbolic link at `path` is a RunError, not followed.
    `warn(message)` says what was skipped (a RunWarning unless told)."""
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
                warn(f"{path}:{i + 1}: skipped: not UTF-8")
            continue
        except (ValueError, RecursionError) as e:
            if i < last:
                warn(f"{path}:{i + 1}: skipped: not a JSON line ({_reason(e)})")
            continue
        yield i + 1, value


def _rank_dumps(directory: str, info: Dict[str, Any], warn: Callable[[str], None] = _warn) -> List[Dict[str, Any]]:
    """The dumps of the run in `directory` whose run.json is `info`, as dicts:
    a closed run.json's "dumps" (close() lists every dump); otherwise
    dumps.jsonl's lines, if there is one (the run is going on, or it crashed
    and run.json was never rewritten); otherwise run.json's "dumps" (a run of
    a tensortap that rewrote run.json with each dump). dumps.jsonl is opened
    as only a regular file and never through a symbolic link: a FIFO or a
    link planted there is skipped with a RunWarning, never waited on or
    followed out of the run. `warn(message)` says what was skipped (a
    RunWarning unless told)."""
    lines_path = os.path.join(directory, DUMPS)
    # With a disk budget dumps.jsonl rolls to dumps.1.jsonl
    # (docs/design.md#leaving-it-on): the older generation first.
    old_path = os.path.join(directory, DUMPS_OLD)
    if info.get("closed", False) is not True and (os.path.lexists(lines_path) or os.path.lexists(old_path)):
        out = []
        for path in (old_path, lines_path):
            if not os.path.lexists(path):
                continue
            try:
                for lineno, d in _read_lines(path, follow=False, warn=warn):
                    if not isinstance(d, dict):
                        warn(f"{path}:{lineno}: skipped: {_json_type(d)}, not an object")
                        continue
                    out.append(d)
            except FileNotFoundError:
                continue  # rolled away while read: older dumps
            except (RunError, OSError) as e:
                warn(f"{e}; its dumps are not read")
        return out
    dumps = info.get("dumps", [])
    where = os.path.join(directory, RUN_JSON)
    if not isinstance(dumps, list):
        warn(f"{where}: \"dumps\" is {_json_type(dumps)}, not an array; ignored")
        return []
    out = []
    for i, d in enumerate(dumps):
        if not isinstance(d, dict):
            warn(f"{where}: dump {i} is {_json_type(d)}, not an object; skipped")
            continue
        out.append(d)
    return out


def _marker(info: Dict[str, Any]) -> Any:
    """run.json's budget marker "given_up_below" as `info` has it, checked or
    not (None: there is none)."""
    budget = info.get("budget")
    return budget.get("given_up_below") if isinstance(budget, dict) else None


def _is_step(k: Any) -> bool:
    """Whether a marker is a step: an integer from 0 to 2**63 - 1."""
    return _is_int64(k) and k >= 0


def _given_up_below(directory: str, info: Dict[str, Any]) -> Optional[int]:
    """run.json's budget marker, "budget": {"given_up_below": k}, of the run
    in `directory` whose run.json is `info`: k, every record of a step below
    it given up (Budget::KeepLatest) but the dumped steps'; None without one.
    A k that is not a step (not an integer from 0 to 2**63 - 1: a boolean, a
    string, a fraction, negative, huge) is refused with a RunWarning and
    taken as no marker: every indexed record is shown."""
    k = _marker(info)
    if k is None:
        return None
    if _is_step(k):
        return k
    text = json.dumps(k) if isinstance(k, (bool, int, float, str)) else _json_type(k)
    text = text if len(text) <= 60 else text[:57] + "..."
    _warn(f'{os.path.join(directory, RUN_JSON)}: "budget": "given_up_below" is {text}, not a step (an integer '
          ">= 0); ignored: every indexed record is shown")
    return None


def _quiet(message: str) -> None:
    """A warn() that says nothing."""


def _dumped_steps(directory: str, info: Dict[str, Any]) -> FrozenSet[int]:
    """The steps the dumps of the run in `directory` wrote (each dump's
    "steps"), as _rank_dumps finds them: a budget never gives them up. Read
    quietly (no warnings filter changed: safe from dask's threads): Run.dumps
    warns about a damaged dump when it is read."""
    steps: Set[int] = set()
    for d in _rank_dumps(directory, info, warn=_quiet):
        listed = d.get("steps")
        if isinstance(listed, list):
            steps.update(s for s in listed if _is_int64(s))
    budget = info.get("budget") if isinstance(info, dict) else None
    # The dumped steps below the marker that stay, as run.json said them with
    # the marker: a dump whose line is not written yet keeps them too.
    kept = budget.get("kept_steps") if isinstance(budget, dict) else None
    if isinstance(kept, list):
        steps.update(s for s in kept if _is_int64(s))
    # The dumps' share (Options::dumps_percent): dumped steps below
    # "dumps_given_up_below" were given up too, oldest first.
    gone = budget.get("dumps_given_up_below") if isinstance(budget, dict) else None
    if isinstance(gone, int) and _is_step(gone):
        steps = {s for s in steps if s >= gone}
    return frozenset(steps)


def _given_up_now(directory: str) -> Optional[Tuple[int, FrozenSet[int]]]:
    """The budget marker of the run in `directory` as its run.json has it
    now, read again (a live run gives steps up as it goes on): (k, the steps
    its dumps kept); None where there is no marker that is a step, or run.json
    cannot be read. Quiet: the Run that listed the records warned already."""
    try:
        info = _read_json(os.path.join(directory, RUN_JSON))
        k = _marker(info)
        if not _is_step(k):
            return None
        return k, _dumped_steps(directory, info)
    except (RunError, OSError, ValueError, RecursionError):
        return None


def stats_segments(directory: str) -> List[str]:
    """The statistics segments of the run in `directory`, oldest first: paths
    of stats.npy and, under Budget::KeepLatest, stats.<n>.npy
    (docs/design.md#leaving-it-on), those that exist (a give-up deletes whole segments, stats.npy too)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = sorted((n, name) for name in names for n in [stats_segment_number(name)] if n is not None)
    return [os.path.join(directory, name) for _, name in found]


def has_statistics(directory: str) -> bool:
    """Whether the run in `directory` has a statistics table (a segment of it)."""
    return bool(stats_segments(directory))


def monitoring_line(info: Dict[str, Any]) -> Optional[str]:
    """run.json's "monitoring" (docs/design.md#runjson) in words: when and why
    statistics and TensorBoard's events stopped, and when they came back;
    None while they never stopped."""
    m = info.get("monitoring")
    if not isinstance(m, dict) or not isinstance(m.get("statistics_stopped_at"), int):
        return None
    line = f"statistics stopped at step {m['statistics_stopped_at']}: {_safe(m.get('reason', '?'))}"
    if isinstance(m.get("resumed_at"), int):
        line += f"; resumed at step {m['resumed_at']}"
    return line
