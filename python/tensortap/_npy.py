""".npy files and images: headers parsed by NumPy's own parser (once per
distinct header text when many are read), a record's .npy file, and the
statistics table stats.npy, checked before it is read."""

from __future__ import annotations

import io
import os
from typing import Any, BinaryIO, Dict, Tuple

import numpy as np

from ._base import STATS_FIELDS, STATS_REAL, RunError
from . import _files, _safe_read

# A parsed header: (shape, Fortran order, dtype, the header's length in bytes).
Header = Tuple[Tuple[int, ...], bool, Any, int]


def _npy_header(f: BinaryIO) -> Tuple[Tuple[int, ...], bool, Any]:
    """(shape, fortran_order, dtype) of the .npy image at f's position, read
    by NumPy's own parser; ValueError for a version tensortap does not write."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    raise ValueError(f".npy format version {version[0]}.{version[1]} is not one tensortap writes")


def _cached_header(buf: np.ndarray, offset: int, headers: Dict[bytes, Header]) -> Header:
    """_npy_header of the image at `offset` of `buf`, with its length in bytes;
    parsed by NumPy once per distinct header text, found in `headers` after."""
    head = buf[offset:offset + 12].tobytes()
    if head[:6] == b"\x93NUMPY" and len(head) == 12 and head[6] == 1:
        length = 10 + int.from_bytes(head[8:10], "little")
    elif head[:6] == b"\x93NUMPY" and len(head) == 12:
        length = 12 + int.from_bytes(head[8:12], "little")
    else:
        length = len(head)  # not an image: NumPy's parser says why
    text = buf[offset:offset + length].tobytes()
    found = headers.get(text)
    if found is None:
        f = io.BytesIO(text)
        shape, fortran, dtype = _npy_header(f)
        found = headers[text] = (shape, fortran, dtype, f.tell())
    return found


def _read_npy(path: str, headers: Dict[bytes, Header]) -> np.ndarray:
    """np.load(path, allow_pickle=False), with the header parsed once per
    distinct header text; any file NumPy would read otherwise (another version,
    an object array, too short) goes to np.load, for its result or its error."""
    try:
        fd, st = _safe_read.open_regular(path)
    except OSError:
        fd = None  # not there, or not a regular file: np.load says what it is
    if fd is not None:
        try:
            data = _safe_read.read_all(fd, st.st_size)
        finally:
            os.close(fd)
        try:
            shape, fortran, dtype, length = _cached_header(np.frombuffer(data, np.uint8), 0, headers)
            count = 1
            for n in shape:
                count *= n
            if not dtype.hasobject and length + count * dtype.itemsize <= len(data):
                a = np.frombuffer(data, dtype=dtype, count=count, offset=length)
                return a.reshape(shape, order="F" if fortran else "C")
        except ValueError:
            pass
    # Never pickle: a planted .npy of objects would run code on load.
    return np.load(path, allow_pickle=False)


# The columns stats.npy must have, and which of them hold floats.
_STATS_COLUMNS = ("step", "series") + STATS_FIELDS


def _read_stats_table(path: str) -> np.ndarray:
    """stats.npy, checked before it is read: the header must describe a 1-D table
    with the statistics columns, and the file must hold every row it counts. A
    live run appends rows before it counts them, so more bytes are fine."""
    with _files._open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise RunError(f"{path}: empty file, no statistics table")
        try:
            shape, _, dtype = _npy_header(f)
        except ValueError as e:
            raise RunError(f"{path}: not a statistics table: {e}") from None
        names = dtype.names or ()
        missing = [c for c in _STATS_COLUMNS if c not in names]
        if missing:
            raise RunError(f"{path}: not a statistics table: no field {', '.join(missing)} (fields: {list(names)})")
        wrong = [c for c in _STATS_COLUMNS if dtype[c].kind not in ("f" if c in STATS_REAL else "iu")]
        if wrong or dtype.hasobject:
            raise RunError(f"{path}: not a statistics table: field types {dtype}")
        if len(shape) != 1:
            raise RunError(f"{path}: not a statistics table: shape {shape}, not one row axis")
        rows, have = shape[0], size - f.tell()
        if have < rows * dtype.itemsize:
            raise RunError(f"{path}: truncated: the header counts {rows} rows ({rows * dtype.itemsize} bytes), "
                           f"the file holds {have} bytes after it")
        return np.fromfile(f, dtype=dtype, count=rows)
