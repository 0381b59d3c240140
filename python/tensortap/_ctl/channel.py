"""One rank's control channel while `tensortap ctl` waits on it (_Channel):
the request written, the heartbeat and the answers read, each file small
and read by descriptor."""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from .._base import RunError, _safe
from .._names import CONTROL_ANSWERS, CONTROL_DIR, CONTROL_HEARTBEAT, RUN_JSON
from .._safe_read import NotRegular, TooLarge, is_link_refused, open_regular, read_regular
from .._safe_write import Refused, new_file, open_folder

if TYPE_CHECKING:
    from .client import Request

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
# dump and status are answered in the pass that takes them: a request found
# taken at the deadline gets this long for its line.
TAKEN_GRACE_S = 0.5
_RUN_ID = re.compile(r"[0-9a-f]{32}")


def _read_small(dir_fd: int, name: str, limit: int) -> bytes:
    """The bytes of the regular file `name` in `dir_fd`, never through a link
    or from a FIFO; RunError when it is something else or holds more than
    `limit` bytes; FileNotFoundError when it is not there."""
    try:
        return read_regular(name, follow=False, dir_fd=dir_fd, limit=limit)
    except NotRegular:
        raise RunError(f"{name} is not a regular file") from None
    except TooLarge:
        raise RunError(f"{name} holds more than {limit} bytes") from None
    except OSError as e:
        if is_link_refused(e):
            raise RunError(f"{name} is a symbolic link") from None
        raise


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
            self.answers, st = open_regular(CONTROL_ANSWERS, follow=False, dir_fd=self.fd)
        except NotRegular:
            return self._off(f"{CONTROL_ANSWERS}: not a regular file")
        except OSError as e:
            what = "a symbolic link" if is_link_refused(e) else e.strerror
            return self._off(f"{CONTROL_ANSWERS}: {_safe(what)}")
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
                try:
                    new, _ = open_regular(CONTROL_ANSWERS, follow=False, dir_fd=self.fd)
                except NotRegular:
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
