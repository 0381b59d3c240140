"""The arrays of index records, in any format: one record (Run.load), or
many at once with the work they share done once (Run.series)."""

from typing import Dict, Tuple

import numpy as np

from . import _float8
from ._base import RunError, RunWarning
from ._npy import _cached_header, _read_npy
from ._packed import _map_segment, _packed_layout, _read_packed
from ._paths import _resolve


def _read_record(rec, mmap, h5_files, h5_lock):
    """The array of one index record; HDF5 files are opened once into
    `h5_files` (guarded by `h5_lock`: dask reads from several threads)."""
    a = _read_stored(rec, mmap, h5_files, h5_lock)
    if rec["dtype"] in _float8.FORMATS:
        return _float8.widen(a, rec["dtype"], f"{rec.index}:{rec.lineno}")
    return a


def _read_stored(rec, mmap, h5_files, h5_lock):
    """The array of one index record as the file holds it."""
    path = _resolve(rec)
    if "dataset" in rec:
        from . import _hdf5  # only HDF5 runs need it (and h5py)

        with h5_lock:
            f = h5_files.get(path)
            if f is None:
                f = h5_files[path] = _open_h5(path)
        # A row is padded to the largest shape of its series: the index's
        # shape says which corner is this record.
        ds = _hdf5.dataset(f, rec["dataset"], path, RunError)
        if hasattr(ds, "refresh"):
            ds.refresh()  # rows appended since the file was opened (SWMR)
        return ds[(rec["row"],) + tuple(slice(0, n) for n in rec["shape"])]
    if "offset" in rec:
        return _read_packed(path, rec, mmap)
    # Never pickle: a planted .npy of objects would run code on load.
    if mmap:
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError:  # an empty array cannot be mapped
            pass
    return np.load(path, allow_pickle=False)


def _read_many(recs, h5_files, h5_lock):
    """The arrays of `recs`, each what _read_record(rec, mmap=False) reads (or a
    read-only view of it), for series(): per-record work is what a record
    needs alone. A segment is opened and mapped once for all its records, a
    header parsed once per distinct header (a name's are all alike), a
    directory resolved once for all its files."""
    segments: Dict[str, Tuple[int, np.ndarray]] = {}  # real path -> (size, its bytes: a uint8 array over a map)
    # header text -> (shape, fortran_order, dtype, its length)
    headers: Dict[bytes, Tuple[Tuple[int, ...], bool, np.dtype, int]] = {}
    dirs: Dict[Tuple[str, str], str] = {}   # (rank directory, directory in the index) -> real directory
    files: Dict[Tuple[str, str], str] = {}  # (rank directory, file in the index) -> real path, for segments
    out = []
    for rec in recs:
        if "dataset" in rec:
            out.append(_read_record(rec, False, h5_files, h5_lock))
            continue
        if "offset" in rec:
            # A segment's records share its file: resolved, checked and
            # mapped once. A refusal still names the first record refused.
            key = (rec.root, rec["file"])
            path = files.get(key)
            if path is None:
                path = files[key] = _resolve(rec, dirs)
            seg = segments.get(path)
            if seg is None:
                seg = segments[path] = _map_segment(path)
            size, buf = seg
            shape, order, dtype, data_at, count = _packed_layout(
                rec, size, lambda offset: _cached_header(buf, offset, headers))
            a = buf[data_at:data_at + count * dtype.itemsize].view(dtype).reshape(shape, order=order)
        else:
            a = _read_npy(_resolve(rec, dirs), headers)
        # As _read_record: a float8's bytes come back widened to float32.
        if rec["dtype"] in _float8.FORMATS:
            a = _float8.widen(a, rec["dtype"], f"{rec.index}:{rec.lineno}")
        out.append(a)
    return out


def _open_h5(path):
    from . import _hdf5  # only HDF5 runs need it (and h5py)

    return _hdf5.open_h5(path, RunError, RunWarning)
