"""`tensortap ctl RUN <command>`: control of a running job
(docs/design.md#leaving-it-on; the protocol in docs/leaving-it-on.md, the recorder's side in
sdk/src/back/control.*).

Each rank directory has its own channel. ctl writes a request, one JSON
object, as `control/<id>.json` (made under a name starting with '.' and
renamed, so the recorder never reads half of one), and waits for the line
of `control.jsonl` that carries its id. Requests to several ranks are all
written first, then awaited together: --timeout is for the whole command.

Liveness: the recorder's writer thread rewrites `control.heartbeat` about
every second. A rank is live while run.json is not closed and the
heartbeat's beat changes within STALE_S; a heartbeat of this host whose
process is gone is not live at once. A rank found not live gets its request
withdrawn (deleted) and the line "no live recorder (<why>)".

Everything in the run directory is someone else's: files are opened by
descriptor, relative to the rank directory's, never through a link, only
when regular, and read within a bound (control.jsonl only from where it
ended when the request was written, a bounded amount per poll); a line that
does not parse is skipped, and what is printed is escaped.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .._base import KINDS, RunError, _safe
from .._paths import _find_ranks
from .._safe_write import Refused, open_folder, open_top
from .channel import POLL_S, _Channel, _label

COMMANDS = ("dump", "capture", "every", "pause", "resume", "status")
# The recorder's bounds (sdk/src/run/control_request.*): a count of steps or
# a period at most 2^40, a request file at most 4 KiB.
MAX_STEPS = 1 << 40
MAX_REQUEST_BYTES = 4096
# A day: ctl is a command someone waits on, not a daemon.
MAX_TIMEOUT_S = 86400.0
# The request expires this long after ctl stops waiting: a ctl killed before
# it could withdraw leaves nothing that acts later; the slack is for the
# clock of another node on a shared file system.
EXPIRY_SLACK_S = 5.0

_DIGITS = re.compile(r"[0-9]{1,20}")  # ASCII digits: str.isdigit() takes other scripts' too


class BadInput(ValueError):
    """Arguments ctl refuses before it writes anything (exit 2)."""


@dataclass(frozen=True)
class Request:
    """What one ctl command asks of every rank it addresses."""

    command: str
    every: Optional[int] = None
    steps: Optional[int] = None
    kinds: Optional[Tuple[str, ...]] = None
    include: Optional[str] = None

    def body(self, request_id: str, run_id: str, expires: float) -> bytes:
        """The request file's bytes: the keys its command takes, nothing else."""
        obj: Dict[str, Any] = {"id": request_id, "run": run_id, "command": self.command,
                               "expires": round(expires, 3)}
        if self.command == "every":
            obj["every"] = self.every
        if self.command == "capture":
            obj["steps"] = self.steps
            if self.kinds is not None:
                obj["kinds"] = list(self.kinds)
            if self.include is not None:
                obj["include"] = self.include
        return json.dumps(obj, ensure_ascii=True).encode("ascii") + b"\n"


def _count(option: str, text: Optional[str], lo: int) -> int:
    if text is None or not _DIGITS.fullmatch(text) or not lo <= int(text) <= MAX_STEPS:
        raise BadInput(f"{option} {_safe(text)!r}: wants an integer from {lo} to {MAX_STEPS}")
    return int(text)


def parse(command: str, value: Optional[str], steps: Optional[str], kinds: Optional[str],
          include: Optional[str], timeout: str, rank: Optional[str]) -> Tuple[Request, float, Optional[int]]:
    """(the request, the timeout in seconds, the rank or None) from ctl's
    arguments, each checked; BadInput names the first bad one."""
    if command not in COMMANDS:
        raise BadInput(f"{_safe(command)!r} is not a ctl command ({', '.join(COMMANDS)})")
    if command != "every" and value is not None:
        raise BadInput(f"{command} takes no N (got {_safe(value)!r}); only 'every N' does")
    if command != "capture":
        for option, given in (("--steps", steps), ("--kinds", kinds), ("--include", include)):
            if given is not None:
                raise BadInput(f"{option} goes with capture, not {command}")
    try:
        seconds = float(timeout)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise BadInput(f"--timeout {_safe(timeout)!r}: wants seconds, more than 0 and at most {MAX_TIMEOUT_S:.0f}")
    which = None
    if rank is not None:
        if not _DIGITS.fullmatch(rank):
            raise BadInput(f"--rank {_safe(rank)!r}: wants a rank, an integer >= 0")
        which = int(rank)
    if command == "every":
        if value is None:
            raise BadInput("every wants N, the period from the next step (0: no full tensors)")
        request = Request(command, every=_count("every", value, 0))
    elif command == "capture":
        if steps is None:
            raise BadInput("capture wants --steps N, how many steps from the next are captured in full")
        names = None
        if kinds is not None:
            names = tuple(kinds.split(","))
            for k in names:
                if k not in KINDS:
                    raise BadInput(f"--kinds {_safe(kinds)!r}: {_safe(k)!r} is not a kind ({', '.join(KINDS)})")
            names = tuple(dict.fromkeys(names))
        if include is not None:
            if include == "" or "\0" in include:
                raise BadInput(f"--include {_safe(include)!r}: wants a non-empty pattern without NUL")
            try:
                include.encode("utf-8")
            except UnicodeEncodeError:
                raise BadInput(f"--include {_safe(include)!r}: not UTF-8") from None
        request = Request(command, steps=_count("--steps", steps, 1), kinds=names, include=include)
    else:
        request = Request(command)
    # The longest id and a run id: what the recorder would refuse unread
    # is refused here, by name.
    if len(request.body("x" * 64, "0" * 32, 1e12)) > MAX_REQUEST_BYTES:
        raise BadInput(f"--include is {len(include or '')} characters: the request would pass the "
                       f"{MAX_REQUEST_BYTES} bytes a request may hold")
    return request, seconds, which


def _channels(path: str, rank: Optional[int], request: Request, request_id: str) -> List[_Channel]:
    """A channel per addressed rank directory, opened by descriptor."""
    try:
        found = _find_ranks(path)
    except (RunError, OSError) as e:
        raise BadInput(_safe(e)) from None
    top = open_top(path, False)
    if top is None:
        raise BadInput(f"{_safe(path)}: not a run directory")
    host = socket.gethostname()
    out: List[_Channel] = []
    try:
        if None in found:
            label = _label(top)
            if rank is not None and rank != label:
                raise BadInput(f"{_safe(path)}: no rank {rank}; it is a single-rank run (rank {label})")
            out.append(_Channel(label, path, os.dup(top), request, request_id, host))
            return out
        ranks = {r: d for r, d in found.items() if r is not None}
        if rank is not None:
            if rank not in ranks:
                raise BadInput(f"{_safe(path)}: no rank {rank}; ranks: {sorted(ranks)}")
            ranks = {rank: ranks[rank]}
        for r, d in sorted(ranks.items()):
            channel = _Channel(r, d, None, request, request_id, host)
            try:
                channel.fd = open_folder(top, os.path.basename(d), d, False)
                if channel.fd is None:
                    channel._dead("its directory is gone")
            except (Refused, OSError) as e:
                channel._dead(_safe(e.reason if isinstance(e, Refused) else e))
            out.append(channel)
        return out
    except BaseException:
        for c in out:
            c.close()
        raise
    finally:
        os.close(top)


def run_command(path: str, request: Request, timeout: float, rank: Optional[int] = None,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> Tuple[List[str], int]:
    """ctl's lines, one per addressed rank in rank order, and its exit
    status: 0 when every rank answered ok, 1 otherwise. BadInput (exit 2):
    not a run directory, or no such rank."""
    # Ids begin with the time, so that the recorder, which takes requests in
    # name order, takes the oldest first; then this process and chance.
    request_id = f"{time.time_ns() // 1000:017d}-{os.getpid()}-{secrets.token_hex(4)}"
    channels = _channels(path, rank, request, request_id)
    try:
        start = clock()
        expires = time.time() + timeout + EXPIRY_SLACK_S
        for c in channels:
            c.start(start, expires)
        deadline = start + timeout
        waiting = [c for c in channels if c.line is None]
        while waiting:
            now = clock()
            if now >= deadline:
                break
            sleep(min(POLL_S, deadline - now))
            now = clock()
            for c in waiting:
                c.poll(now)
            waiting = [c for c in waiting if c.line is None]
        for c in waiting:
            c.finish(clock, sleep)
        lines = [c.line or f"rank {c.label}: {request.command} no answer" for c in channels]
        return lines, 0 if all(c.ok for c in channels) else 1
    finally:
        for c in channels:
            c.close()


def main(args: Any, out: Callable[[str], None], err: Callable[[str], None]) -> int:
    """`tensortap ctl` from argparse's namespace: lines to `out`, a refusal
    of bad input to `err`; returns the exit status."""
    try:
        request, timeout, rank = parse(args.action, args.value, args.steps, args.kinds, args.include,
                                       args.timeout, args.rank)
        lines, status = run_command(args.run, request, timeout, rank)
    except BadInput as e:
        err(f"tensortap: ctl: {e}")
        return 2
    for line in lines:
        out(line)
    return status


__all__: Sequence[str] = ["COMMANDS", "BadInput", "Request", "parse", "run_command", "main"]
