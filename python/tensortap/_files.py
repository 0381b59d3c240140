"""A run's small files, read without trusting them: opened only as regular
files, JSON and JSON lines decoded so that a bad line costs only itself, and
the flight recorder's dumps."""

import builtins
import json
import os
import stat

from ._base import RunError, _json_type, _reason, _warn
from ._names import DUMPS, RUN_JSON


def _open_regular(path, follow=True):
    """An open binary file of `path`, refused unless it is a regular file: a FIFO
    or a device planted under a known name would block the reader or never end.
    With follow=False a symbolic link at `path` is refused too (RunError)."""
    # O_NONBLOCK so that opening a FIFO does not wait for a writer; it does not
    # change reads from a regular file.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if not follow and os.path.islink(path):
            raise RunError(f"{path}: a symbolic link, not a file tensortap writes") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RunError(f"{path}: not a regular file")
        return builtins.open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_json(path):
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


def _read_lines(path, follow=True):
    """(line number, value) for each JSON line of `path`, if it exists. Read as
    bytes and decoded line by line, so that a bad line (torn, garbage, invalid
    UTF-8) costs only itself. An unterminated last line that does not parse is a
    write torn by a crash: skipped silently. Other bad lines: a RunWarning.
    With follow=False a symbolic link at `path` is a RunError, not followed."""
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
                _warn(f"{path}:{i + 1}: skipped: not UTF-8")
            continue
        except (ValueError, RecursionError) as e:
            if i < last:
                _warn(f"{path}:{i + 1}: skipped: not a JSON line ({_reason(e)})")
            continue
        yield i + 1, value


def _rank_dumps(directory, info):
    """The dumps of the run in `directory` whose run.json is `info`, as dicts:
    a closed run.json's "dumps" (close() lists every dump); otherwise
    dumps.jsonl's lines, if there is one (the run is going on, or it crashed
    and run.json was never rewritten); otherwise run.json's "dumps" (a run of
    a tensortap that rewrote run.json with each dump). dumps.jsonl is opened
    as only a regular file and never through a symbolic link: a FIFO or a
    link planted there is skipped with a RunWarning, never waited on or
    followed out of the run."""
    lines_path = os.path.join(directory, DUMPS)
    if info.get("closed", False) is not True and os.path.lexists(lines_path):
        out = []
        try:
            for lineno, d in _read_lines(lines_path, follow=False):
                if not isinstance(d, dict):
                    _warn(f"{lines_path}:{lineno}: skipped: {_json_type(d)}, not an object")
                    continue
                out.append(d)
        except (RunError, OSError) as e:
            _warn(f"{e}; its dumps are not read")
        return out
    dumps = info.get("dumps", [])
    where = os.path.join(directory, RUN_JSON)
    if not isinstance(dumps, list):
        _warn(f"{where}: \"dumps\" is {_json_type(dumps)}, not an array; ignored")
        return []
    out = []
    for i, d in enumerate(dumps):
        if not isinstance(d, dict):
            _warn(f"{where}: dump {i} is {_json_type(d)}, not an object; skipped")
            continue
        out.append(d)
    return out
