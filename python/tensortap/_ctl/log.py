"""The requests `tensortap ctl` made of a run, as its control.jsonl tells
them (one answer a line, sdk/src/back/control.cpp), for `tensortap
inspect` (summary.py) and the report page (_report_ctl.py): how many were
answered, ok or refused, and the last few that changed what was recorded.

control.jsonl is read a chunk at a time and never held whole: a run may
hold ten thousand refusals of planted requests. A line that does not parse,
or longer than any answer, is skipped and counted.
"""

from __future__ import annotations

import collections
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Deque, List, Optional, Tuple

from .._base import RunError, _safe, _warn
from .._files import _open_regular
from .._names import CONTROL_ANSWERS, CONTROL_ANSWERS_OLD

if TYPE_CHECKING:
    from .._run import Run

# The commands that change what the run records or writes; status only reads.
APPLIED = ("capture", "every", "pause", "resume", "dump")
# The applied requests listed per rank: the last ones.
SHOWN = 10
LINE_BYTES = 64 << 10
CHUNK_BYTES = 1 << 20


@dataclass
class ControlLog:
    """One rank's control.jsonl, counted."""

    ok: int = 0
    refused: int = 0
    skipped: int = 0  # lines that are not answers
    applied: int = 0  # ok answers of APPLIED commands
    last: Deque[Tuple[str, Optional[int], str]] = field(default_factory=lambda: collections.deque(maxlen=SHOWN))
    """(command, step, message) of the last SHOWN applied requests."""

    def count(self, raw: bytes) -> None:
        try:
            a = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):
            a = None
        status = a.get("status") if isinstance(a, dict) else None
        if not isinstance(a, dict) or status not in ("ok", "refused"):
            self.skipped += 1
            return
        if status == "refused":
            self.refused += 1
            return
        self.ok += 1
        command, step, message = a.get("command"), a.get("step"), a.get("message")
        if command in APPLIED:
            self.applied += 1
            step = step if isinstance(step, int) and not isinstance(step, bool) else None
            self.last.append((command, step, message if isinstance(message, str) else ""))


def _is_answer(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw.decode("utf-8")), dict)
    except (ValueError, RecursionError):
        return False


def read_log(directory: str) -> Optional[ControlLog]:
    """The counts of `directory`'s control answers, control.1.jsonl (the older
    generation, once control.jsonl rolled) then control.jsonl; None when it has
    none (a run of a recorder without ctl) or they cannot be read (a RunWarning)."""
    paths = [p for p in (os.path.join(directory, n) for n in (CONTROL_ANSWERS_OLD, CONTROL_ANSWERS))
             if os.path.lexists(p)]
    if not paths:
        return None
    log = ControlLog()
    for path in paths:
        if not _read_into(log, path):
            return None
    return log


def _read_into(log: ControlLog, path: str) -> bool:
    """Counts the answers of one file into `log`; False (said) if it cannot be read."""
    try:
        with _open_regular(path, follow=False) as f:
            partial, skipping = b"", False
            while True:
                chunk = f.read(CHUNK_BYTES)
                if not chunk:
                    break
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                for raw in lines:
                    if skipping:
                        skipping = False
                    elif raw.strip():
                        log.count(raw)
                if len(partial) > LINE_BYTES:
                    partial, skipping = b"", True
                    log.skipped += 1
            # A last line without its newline is a write in progress (or
            # torn by a crash): counted only when it is whole.
            if partial.strip() and not skipping and _is_answer(partial):
                log.count(partial)
    except FileNotFoundError:
        return True  # rolled away meanwhile: its answers are older ones
    except (RunError, OSError) as e:
        _warn(f"{_safe(e)}; its control requests are not read")
        return False
    return True


def logs(run: Run) -> List[Tuple[Optional[int], ControlLog]]:
    """(rank, its log) for each rank with answers, in rank order."""
    out = []
    for r in sorted(run._dirs, key=lambda r: -1 if r is None else r):
        log = read_log(run._dirs[r])
        if log is not None and log.ok + log.refused + log.skipped:
            out.append((r, log))
    return out


def applied_line(command: str, step: Optional[int], message: str) -> str:
    """An applied request, as ctl printed it."""
    at = "?" if step is None else str(step)
    return f"{command} ok at step {at}" + (f": {_safe(message)}" if message else "")


def summary_lines(run: Run) -> List[str]:
    """inspect's lines (without their indent): per rank with answers, the
    counts, then the last SHOWN applied requests."""
    out = []
    for r, log in logs(run):
        where = "" if r is None else f"rank {r}: "
        line = f"{where}control requests (tensortap ctl): {log.ok + log.refused} answered, {log.ok} ok, " \
               f"{log.refused} refused"
        if log.skipped:
            line += f", {log.skipped} damaged lines skipped"
        out.append(line)
        if log.applied > len(log.last):
            out.append(f"{where}ctl: ... {log.applied - len(log.last)} earlier applied requests not listed")
        out.extend(f"{where}ctl: {applied_line(*a)}" for a in log.last)
    return out


__all__ = ["APPLIED", "SHOWN", "ControlLog", "read_log", "logs", "applied_line", "summary_lines"]
