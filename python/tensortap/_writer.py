"""A run directory written from Python, in the layout the C++ recorder writes
(docs/design.md#the-run-directory): `.npy` records under npy/<kind>/<name>/<step>.npy,
index.jsonl, run.json and the writer's lock. The Python twin
(tensortap.torch) records through it; it needs only NumPy.

What it shares with the C++ writers, and must keep sharing (the reader, the
file-name test and `tensortap diff` rely on it): the names on disk
(encode_name is writers/src/paths.cpp's), the index line exactly as
append_index_line prints it (the reader's fast path reads that form only),
the `.npy` form (format 1.0, header padded to 64 bytes, C order, little
endian; bfloat16 stored as float32 and float8 as its bytes, the index keeping
the tensor's dtype), run.json's keys, and the lock (`.tensortap.lock`,
flock). A file is written under `.<name>.tmp` and renamed, so no final name
ever holds a short file, and its index line is appended only after. As the
C++ writers, it never reads or writes outside the run: the directory is
opened once, and every folder and file below it is made one name at a time
without following a link (_safe_write.py, shared with the TensorBoard
export).

What it does not do: fsync. A process that dies loses nothing it indexed;
a machine that crashes may lose the last records' data.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shutil
import stat
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ._base import KINDS, RunError
from ._base import json_string as _json_string
from ._names import INDEX, LOCK, NPY_DIR, RUN_FILE_NAMES, RUN_JSON, is_run_file_name
from ._safe_write import Refused, create_new, open_folders, open_top, replace_file
from ._version import __version__

FORMAT_VERSION = 1

_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-#+=@,")
_MAX_ENCODED = 200


def _fnv1a(data: bytes) -> int:
    h = 1469598103934665603
    for c in data:
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def encode_name(name: str) -> str:
    """A record name as a folder name, as the C++ writers encode it
    (writers/src/paths.cpp encode_name): unsafe bytes as %XX, a leading dot
    too, long names cut and suffixed with a hash of the whole name."""
    raw = name.encode("utf-8", "surrogateescape")
    out = "".join(chr(c) if c in _SAFE and not (i == 0 and c == 0x2E) else f"%{c:02X}" for i, c in enumerate(raw))
    if not out:
        out = "%00empty"
    if len(out) > _MAX_ENCODED:
        cut = _MAX_ENCODED - 17
        # '%' only ever starts a three-byte escape: do not cut one in half.
        if out[cut - 1] == "%":
            cut -= 1
        elif out[cut - 2] == "%":
            cut -= 2
        out = f"{out[:cut]}~{_fnv1a(raw):016x}"
    return out


def index_line(step: int, kind: str, name: str, dtype: str, shape: Sequence[int], file: str) -> str:
    """One line of index.jsonl, exactly as append_index_line prints it."""
    return (f'{{"step":{int(step)},"kind":"{kind}","name":{_json_string(name)},"dtype":"{dtype}",'
            f'"shape":[{",".join(str(int(d)) for d in shape)}],"file":{_json_string(file)}}}\n')


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def rank_and_world() -> tuple:
    """(rank, world size) as the C++ recorder reads them: RANK and WORLD_SIZE
    from the environment (torchrun's), 0 and 1 without them."""
    def read(var: str, default: int) -> int:
        text = os.environ.get(var)
        if text is None or text == "":
            return default
        try:
            return int(text)
        except ValueError:
            raise RunError(f"{var}={text!r} is not an integer") from None
    rank, world = read("RANK", 0), read("WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world:
        raise RunError(f"RANK={rank} and WORLD_SIZE={world}: the rank must be in [0, world size)")
    return rank, world


class RunWriter:
    """One rank's run directory, open for writing: `write()` a record, then
    `close()`. The directory is locked as the C++ recorder locks it, so the
    two never write into one run at once."""

    def __init__(self, path: str, options: Dict[str, Any], overwrite: bool = False,
                 torch_version: str = "?", rank: Optional[int] = None, world_size: Optional[int] = None,
                 taps: Optional[Dict[str, str]] = None):
        if not isinstance(path, (str, os.PathLike)) or str(path) == "":
            raise RunError(f"the run directory must be a non-empty path, not {path!r}")
        if rank is None or world_size is None:
            rank, world_size = rank_and_world()
        self.root = os.fspath(path)
        self.path = self.root if world_size == 1 else os.path.join(self.root, f"rank{rank}")
        # Opened once, as the C++ writers do: every file is made through this
        # descriptor, one name at a time, never through a link planted in
        # the run (_folder), whatever chdir() or a rename does meanwhile.
        self._dir = open_top(self.path, create=True)
        try:
            self._lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666, dir_fd=self._dir)
        except BaseException:
            os.close(self._dir)
            raise
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self._lock)
            os.close(self._dir)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RunError(f"run directory {self.path} is in use by another recorder") from None
            raise
        try:
            self._prepare(overwrite)
            self._info: Dict[str, Any] = {
                "format_version": FORMAT_VERSION, "tensortap_version": __version__, "torch_version": torch_version,
                "writer": "python", "options": dict(options, dir=self.root, format="npy", overwrite=overwrite),
                "rank": rank, "world_size": world_size, "start_time": _utc_now(), "dumps": []}
            if taps:
                # A tap's nonlinearity (docs/design.md#runjson): what the doctor's
                # rules judge it as, whatever its name.
                self._info["taps"] = dict(taps)
            self._write_run_json(closed=False)
            fd = create_new(self._dir, INDEX, os.path.join(self.path, INDEX), append=True)
            self._index = os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape")
        except BaseException:
            os.close(self._lock)
            os.close(self._dir)
            raise
        self.records = 0
        self.bytes = 0
        self.closed = False

    def _prepare(self, overwrite: bool) -> None:
        held = sorted(n for n in os.listdir(self._dir) if is_run_file_name(n))
        if held and not overwrite:
            raise RunError(f"run directory {self.path} already holds a run ({', '.join(held)}): "
                           "pass overwrite=True to replace it")
        for name in held:
            # Only tensortap's own names are removed; a link is removed, never followed.
            if stat.S_ISDIR(os.lstat(name, dir_fd=self._dir).st_mode):
                shutil.rmtree(name, dir_fd=self._dir)
            else:
                os.unlink(name, dir_fd=self._dir)

    def _folder(self, parts: Sequence[str]) -> int:
        """The run's folder `parts` (made where missing), opened one name at
        a time without following a link: a link or a file planted there is
        refused with a RunError, never written through. The caller closes it."""
        try:
            return open_folders(self._dir, parts, self.path, create=True)
        except Refused as e:
            raise RunError(f"{e.path} is not a folder of the run: {e.reason}") from None

    def _write_run_json(self, closed: bool) -> None:
        info = dict(self._info)
        if closed:
            info.update(end_time=_utc_now(), records=self.records, bytes=self.bytes, dropped=0, errors=0)
        info["closed"] = closed
        text = (json.dumps(info, indent=2) + "\n").encode("utf-8")
        replace_file(self._dir, RUN_JSON, os.path.join(self.path, RUN_JSON), lambda f: f.write(text))

    def write(self, kind: str, name: str, step: int, array: np.ndarray, dtype: str) -> None:
        """Writes one record: `array` as stored (a bfloat16 tensor as
        float32, a float8 one as uint8), `dtype` the tensor's own dtype name."""
        if self.closed:
            raise RunError(f"the run {self.path} is closed: {kind} {name!r} step {step} not written")
        if kind not in KINDS:
            raise RunError(f"unknown kind {kind!r} for {name!r}: one of {', '.join(KINDS)}")
        parts = (NPY_DIR, kind, encode_name(name))
        stem = f"{step:08d}.npy"
        if not array.flags.c_contiguous:
            array = array.copy(order="C")  # np.ascontiguousarray would make a 0-d array 1-d
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        folder = self._folder(parts)
        try:
            replace_file(folder, stem, os.path.join(self.path, *parts, stem),
                         lambda f: np.lib.format.write_array(f, array, allow_pickle=False))
        finally:
            os.close(folder)
        self._index.write(index_line(step, kind, name, dtype, array.shape, "/".join(parts + (stem,))))
        self._index.flush()
        self.records += 1
        self.bytes += array.nbytes

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._index.close()
            self._write_run_json(closed=True)
        finally:
            os.close(self._lock)
            os.close(self._dir)


def default_options(every: int, kinds: List[str], start: int = 0, stop: Optional[int] = None,
                    steps: Sequence[int] = (), capture_eval: bool = False) -> Dict[str, Any]:
    """run.json's "options" for a Python run: the C++ recorder's names, with
    the values the twin has (the rest at the C++ defaults, or off). An unset
    `stop` is null, as C++ writes its unset std::optional (runs written
    before said -1; the reader takes both)."""
    return {"every": every, "start": start, "stop": stop, "include": "", "exclude": "", "kinds": list(kinds),
            "every_by_kind": {k: (every if k in kinds else 0) for k in KINDS}, "steps": list(steps), "ranks": [],
            "capture_eval": capture_eval, "grad_per_backward": False, "capture_ops": False, "on_error": "continue",
            "tap_sequential": "", "stats_every": 0, "flight_recorder": 0, "tensorboard": None, "dump_on": []}


__all__ = ["RunWriter", "encode_name", "index_line", "default_options", "RUN_FILE_NAMES"]
