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

import errno
import json
import math
import os
import re
import secrets
import socket
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .._base import KINDS, RunError, _safe
from .._names import CONTROL_ANSWERS, CONTROL_DIR, CONTROL_HEARTBEAT, RUN_JSON
from .._paths import _find_ranks
from .._safe_write import Refused, new_file, open_folder, open_top

COMMANDS = ("dump", "capture", "every", "pause", "resume", "status")
# The recorder's bounds (sdk/src/run/control_request.*): a count of steps or
# a period at most 2^40, a request file at most 4 KiB.
MAX_STEPS = 1 << 40
MAX_REQUEST_BYTES = 4096
# A day: ctl is a command someone waits on, not a daemon.
MAX_TIMEOUT_S = 86400.0
# A heartbeat unchanged for this long is a recorder gone (it beats every
# second; half a second more for a slow file system).
STALE_S = 2.5
POLL_S = 0.05
# Read bounds: the heartbeat is 256 bytes, run.json a few KiB (more with
# thousands of dumps listed); an answer line is short, and a flood of them
# is read a few MiB per poll.
HEARTBEAT_BYTES = 4096
RUN_JSON_BYTES = 64 << 20
ANSWER_LINE_BYTES = 64 << 10
ANSWERS_PER_POLL = 4 << 20
# The request expires this long after ctl stops waiting: a ctl killed before
# it could withdraw leaves nothing that acts later; the slack is for the
# clock of another node on a shared file system.
EXPIRY_SLACK_S = 5.0
# dump and status are answered in the pass that takes them: a request found
# taken at the deadline gets this long for its line.
TAKEN_GRACE_S = 0.5

_DIGITS = re.compile(r"[0-9]{1,20}")  # ASCII digits: str.isdigit() takes other scripts' too
_RUN_ID = re.compile(r"[0-9a-f]{32}")


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


def _read_small(dir_fd: int, name: str, limit: int) -> bytes:
    """The bytes of the regular file `name` in `dir_fd`, never through a link
    or from a FIFO; RunError when it is something else or holds more than
    `limit` bytes; FileNotFoundError when it is not there."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunError(f"{name} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RunError(f"{name} is not a regular file")
        chunks, n = [], 0
        while n <= limit:
            chunk = os.read(fd, limit + 1 - n)
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        if n > limit:
            raise RunError(f"{name} holds more than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _json_object(data: bytes) -> Optional[Dict[str, Any]]:
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _heartbeat(dir_fd: int) -> Optional[Dict[str, Any]]:
    """The heartbeat's fields, or None while it does not read as one (a
    rewrite caught half-way, garbage). FileNotFoundError, RunError: none."""
    raw = _read_small(dir_fd, CONTROL_HEARTBEAT, HEARTBEAT_BYTES)
    beat = _json_object(raw.split(b"\n", 1)[0].strip())
    if beat is None or _int(beat.get("beat")) is None:
        return None
    return beat


def _run_json(dir_fd: int) -> Dict[str, Any]:
    info = _json_object(_read_small(dir_fd, RUN_JSON, RUN_JSON_BYTES))
    if info is None:
        raise RunError(f"{RUN_JSON} is not a JSON object")
    return info


def _answer(raw: bytes, request_id: str) -> Optional[Dict[str, Any]]:
    """The answer to `request_id` in one line of control.jsonl, or None."""
    if request_id.encode("ascii") not in raw:
        return None  # most lines of a flood: not parsed
    a = _json_object(raw)
    if a is None or a.get("id") != request_id or a.get("status") not in ("ok", "refused"):
        return None
    message = a.get("message")
    return {"status": a["status"], "step": _int(a.get("step")), "message": message if isinstance(message, str) else ""}


class _Channel:
    """One rank's channel while ctl waits on it: `line` is its outcome once
    known, `ok` whether the rank answered ok."""

    def __init__(self, label: int, shown: str, dir_fd: Optional[int], request: Request, request_id: str,
                 host: str) -> None:
        self.label, self.shown, self.fd = label, shown, dir_fd
        self.request, self.id, self.host = request, request_id, host
        self.line: Optional[str] = None
        self.ok = False
        self.control: Optional[int] = None
        self.answers: Optional[int] = None
        self.offset = 0
        self.partial = b""
        self.skipping = False  # inside a line longer than ANSWER_LINE_BYTES
        self.beat: Optional[int] = None
        self.beat_at = 0.0
        self.step: Optional[int] = None

    def _say(self, text: str, ok: bool = False) -> None:
        self.line = f"rank {self.label}: {text}"
        self.ok = ok

    def _dead(self, why: str) -> None:
        self._say(f"no live recorder ({why})")

    def _off(self, why: str) -> None:
        self._say(f"no control channel ({why})")

    def start(self, now: float, expires: float) -> None:
        """Checks what can be judged at once, then writes the request."""
        if self.fd is None:
            return
        try:
            info = _run_json(self.fd)
        except (RunError, OSError) as e:
            return self._dead(f"{RUN_JSON} cannot be read: {_safe(e)}")
        if info.get("closed") is True:
            return self._dead("the run was closed")
        run_id = info.get("run_id")
        if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
            return self._off(f"{RUN_JSON} has no run_id: a recorder without tensortap ctl")
        try:
            beat = _heartbeat(self.fd)
        except FileNotFoundError:
            return self._dead(f"no {CONTROL_HEARTBEAT}")
        except (RunError, OSError) as e:
            return self._dead(f"{CONTROL_HEARTBEAT}: {_safe(e)}")
        self.beat_at = now
        if beat is not None:
            self.beat, self.step = beat["beat"], _int(beat.get("step"))
            channel = beat.get("channel")
            if isinstance(channel, str) and channel != "on":
                return self._off(_safe(channel[len("off: "):] if channel.startswith("off: ") else channel))
            gone = self._gone(beat)
            if gone:
                return self._dead(gone)
        try:
            self.answers = os.open(CONTROL_ANSWERS, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                                   dir_fd=self.fd)
            st = os.fstat(self.answers)
        except OSError as e:
            what = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
            return self._off(f"{CONTROL_ANSWERS}: {_safe(what)}")
        if not stat.S_ISREG(st.st_mode):
            return self._off(f"{CONTROL_ANSWERS}: not a regular file")
        # The answer comes after the request: only what follows is read.
        self.offset = st.st_size
        try:
            self.control = open_folder(self.fd, CONTROL_DIR, os.path.join(self.shown, CONTROL_DIR), False)
            if self.control is None:
                return self._off(f"no {CONTROL_DIR}/")
            self._write(run_id, expires)
        except Refused as e:
            return self._off(_safe(f"{CONTROL_DIR}/: {e.reason}"))
        except RunError as e:
            return self._off(_safe(f"cannot write a request: {e}"))
        except OSError as e:
            return self._off(_safe(f"cannot write a request into {CONTROL_DIR}/: {e.strerror or e}"))

    def _write(self, run_id: str, expires: float) -> None:
        assert self.control is not None
        tmp, name = f".{self.id}.tmp", f"{self.id}.json"
        with new_file(self.control, tmp, os.path.join(self.shown, CONTROL_DIR, tmp)) as f:
            f.write(self.request.body(self.id, run_id, expires))
        try:
            os.rename(tmp, name, src_dir_fd=self.control, dst_dir_fd=self.control)
        except OSError:
            try:
                os.unlink(tmp, dir_fd=self.control)
            except OSError:
                pass
            raise

    def _gone(self, beat: Dict[str, Any]) -> Optional[str]:
        """Why the heartbeat's process is not running, when it is of this
        host and gone; else None (another host's is judged by its beat)."""
        pid = _int(beat.get("pid"))
        # 0 and negative pids name process groups in kill(): never asked.
        if beat.get("host") != self.host or pid is None or not 0 < pid < (1 << 31):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"process {pid} on this host has ended"
        except OSError:
            pass  # EPERM: it runs, as another user
        return None

    def poll(self, now: float) -> None:
        assert self.fd is not None
        why = None
        try:
            beat = _heartbeat(self.fd)
        except FileNotFoundError:
            beat, why = None, f"{CONTROL_HEARTBEAT} is gone"
        except (RunError, OSError) as e:
            beat, why = None, f"{CONTROL_HEARTBEAT}: {_safe(e)}"
        if beat is not None:
            if beat["beat"] != self.beat:
                self.beat, self.beat_at = beat["beat"], now
            self.step = _int(beat.get("step"))
            why = self._gone(beat)
        if why is None and now - self.beat_at > STALE_S:
            why = f"its heartbeat has not changed for {STALE_S} s"
        # Answers after the verdict: a process found gone wrote all it will.
        if self._answered() or why is None:
            return
        try:
            if _run_json(self.fd).get("closed") is True:
                why = "the run was closed"
        except (RunError, OSError):
            pass
        withdrawn = self._withdraw()
        if withdrawn is None and self._answered():
            return
        self._dead(why if withdrawn is not False else f"{why}; its request had been taken")

    def finish(self, clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
        """At the deadline: withdraws the request if the recorder has not
        taken it; says so, or that it is taken and not yet in effect."""
        if self._answered():
            return
        withdrawn = self._withdraw()
        if withdrawn:
            return self._say(f"{self.request.command} no answer (withdrawn)")
        if withdrawn is None:
            return self._say(f"{self.request.command} no answer (its request could not be withdrawn)")
        if self.request.command in ("dump", "status"):
            end = clock() + TAKEN_GRACE_S
            while clock() < end:
                if self._answered():
                    return
                sleep(POLL_S)
        if self._answered():
            return
        step = "?" if self.step is None else str(self.step)
        self._say(f"{self.request.command} taken at step {step}, not yet in effect")

    def _withdraw(self) -> Optional[bool]:
        """True: the request file removed before the recorder took it; False:
        it was taken (gone already); None: it could not be removed."""
        assert self.control is not None
        try:
            os.unlink(f"{self.id}.json", dir_fd=self.control)
            return True
        except FileNotFoundError:
            return False
        except OSError:
            return None

    def _answered(self) -> bool:
        """Reads what control.jsonl gained; True once the answer is there."""
        assert self.answers is not None
        try:
            # control.jsonl rolls to control.1.jsonl past its size
            # (docs/design.md#leaving-it-on): once the name holds a new file, the old one (this
            # descriptor) is read to its end, then the new one from the top.
            rolled = self._rolled()
            size = os.fstat(self.answers).st_size
            if size < self.offset:  # cut short (a new run over this one): read again from the top
                self.offset, self.partial, self.skipping = 0, b"", False
            budget = ANSWERS_PER_POLL
            while self.offset < size and budget > 0:
                chunk = os.pread(self.answers, min(1 << 20, size - self.offset, budget), self.offset)
                if not chunk:
                    break
                self.offset += len(chunk)
                budget -= len(chunk)
                found = self._lines(chunk)
                if found is not None:
                    self._take(found)
                    return True
            if rolled and self.offset >= size:
                new = os.open(CONTROL_ANSWERS, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                              dir_fd=self.fd)
                if not stat.S_ISREG(os.fstat(new).st_mode):
                    os.close(new)
                    return False
                os.close(self.answers)
                self.answers, self.offset, self.partial, self.skipping = new, 0, b"", False
                return self._answered()
        except OSError:
            pass  # read again at the next poll
        return False

    def _rolled(self) -> bool:
        """Whether control.jsonl is now another file than the one read."""
        assert self.answers is not None
        try:
            st = os.stat(CONTROL_ANSWERS, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        mine = os.fstat(self.answers)
        return (st.st_ino, st.st_dev) != (mine.st_ino, mine.st_dev)

    def _lines(self, chunk: bytes) -> Optional[Dict[str, Any]]:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for raw in lines:
            if self.skipping:  # the end of a line too long to be an answer
                self.skipping = False
                continue
            found = _answer(raw, self.id)
            if found is not None:
                return found
        if len(self.partial) > ANSWER_LINE_BYTES:
            self.partial, self.skipping = b"", True
        return None

    def _take(self, a: Dict[str, Any]) -> None:
        command, message = self.request.command, _safe(a["message"])
        if a["status"] == "ok":
            step = "?" if a["step"] is None else str(a["step"])
            self._say(f"{command} ok at step {step}" + (f": {message}" if message else ""), ok=True)
        else:
            self._say(f"{command} refused: {message or 'no reason given'}")

    def close(self) -> None:
        for fd in (self.control, self.answers, self.fd):
            if fd is not None:
                os.close(fd)
        self.control = self.answers = self.fd = None


def _label(dir_fd: int) -> int:
    """A single-rank run's rank: its run.json's, or 0."""
    try:
        rank = _int(_run_json(dir_fd).get("rank"))
    except (RunError, OSError):
        rank = None
    return rank if rank is not None and rank >= 0 else 0


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
