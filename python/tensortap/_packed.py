"""Format::Packed records: .npy images at byte offsets of segment files,
each checked against its index line before it is mapped or read."""

import mmap
import os

import numpy as np

from ._base import RunError, _reason, _safe
from . import _files
from ._npy import _npy_header


def _read_packed(path, rec, mmap):
    """The .npy image of a Format::Packed record: `rec["nbytes"]` bytes at
    `rec["offset"]` of a segment file. The header is checked against them, so a
    damaged index line cannot make the reader map or read past its record."""
    with _files._open_regular(path) as f:
        def header_at(offset):
            f.seek(offset)
            shape, fortran, dtype = _npy_header(f)
            return shape, fortran, dtype, f.tell() - offset

        shape, order, dtype, data_at, count = _packed_layout(rec, os.fstat(f.fileno()).st_size, header_at)
        if mmap and count > 0 and shape:
            return np.memmap(path, dtype=dtype, mode="r", offset=data_at, shape=shape, order=order)
        f.seek(data_at)
        a = np.fromfile(f, dtype=dtype, count=count)
        if a.size != count:
            raise RunError(f"{_packed_where(rec)}: the file ended early (truncated?)")
        return a.reshape(shape, order=order)


def _packed_where(rec):
    return f"{rec.index}:{rec.lineno}: {_safe(rec['file'])} at offset {rec['offset']}"


def _packed_layout(rec, size, header_at):
    """(shape, order, dtype, offset of the data, element count) of a packed
    record in a segment of `size` bytes, its image's header read by
    header_at(offset) -> (shape, fortran_order, dtype, header bytes). RunError
    unless the header and the index agree."""
    offset, nbytes = rec["offset"], rec["nbytes"]
    if offset + nbytes > size:
        raise RunError(f"{_packed_where(rec)}: {nbytes} bytes run past the end of the file ({size} bytes)")
    try:
        shape, fortran, dtype, header = header_at(offset)
    except ValueError as e:
        raise RunError(f"{_packed_where(rec)}: not a .npy image: {_reason(e)}") from None
    if dtype.hasobject:
        raise RunError(f"{_packed_where(rec)}: an object array (never loaded: it could run code)")
    count = 1
    for n in shape:
        count *= n
    if header + count * dtype.itemsize != nbytes:
        raise RunError(f"{_packed_where(rec)}: the image's header and data take "
                       f"{header + count * dtype.itemsize} bytes, the index says {nbytes}")
    return shape, "F" if fortran else "C", dtype, offset + header, count


def _map_segment(path):
    """(size, a read-only uint8 array over the whole file, memory-mapped)."""
    with _files._open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:  # an empty file cannot be mapped
            return 0, np.empty(0, np.uint8)
        # The array holds the map; it is unmapped when the last view goes.
        return size, np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
