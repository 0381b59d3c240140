"""The arrays of index records, in any format: one record (Run.load), or
many at once with the work they share done once (Run.series).

Every read of a record's array goes through here (the diff's own reads call
_given_up too): a record whose file, or packed segment, turns out missing
is looked up again in its rank's run.json. A Run on a live run is a
snapshot; if the disk budget (Budget::KeepLatest) gave the record's step up
since (the marker "given_up_below" now above it, no dump keeping it), the
read raises GivenUpError, which says so, instead of the missing file's
error."""

import os
from typing import Dict, Optional, Tuple

import numpy as np

from . import _float8
from ._base import GivenUpError, RunError, RunWarning
from ._files import _given_up_now
from ._npy import _cached_header, _read_npy
from ._packed import _map_segment, _packed_layout, _read_packed
from ._paths import _resolve


def _read_record(rec, mmap, h5_files, h5_lock):
    """The array of one index record; HDF5 files are opened once into
    `h5_files` (guarded by `h5_lock`: dask reads from several threads).
    GivenUpError if its step was given up since the Run was opened."""
    try:
        a = _read_stored(rec, mmap, h5_files, h5_lock)
    except FileNotFoundError:
        given_up = _given_up(rec)
        if given_up is None:
            raise
        raise given_up from None
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
    rec = None
    try:
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
    except FileNotFoundError:
        given_up = _given_up(rec)
        if given_up is None:
            raise
        raise given_up from None
    return out


def _given_up(rec) -> Optional[GivenUpError]:
    """For a record whose file (or packed segment) turned out missing: the
    GivenUpError to raise if the disk budget gave its step up after the Run
    was opened, else None (the missing file's own error stands). Its rank's
    run.json is read again, once: its marker "given_up_below" k must now be
    above the step, and none of the rank's dumps must have kept the step (a
    dumped step's file is never given up: gone, it is another failure)."""
    if rec is None or not isinstance(rec.get("step"), int):
        return None
    root = getattr(rec, "root", None)
    if not root:
        return None
    now = _given_up_now(root)
    if now is None:
        return None
    k, dumped = now
    step = rec["step"]
    if step >= k or step in dumped:
        return None
    index = getattr(rec, "index", None)
    where = os.path.dirname(index) if index else root
    return GivenUpError(
        f"{where}: {rec.get('kind')} {rec.get('name')!r} step {step} was given up by the run's disk budget after "
        f"this Run was opened (run.json's given_up_below is now {k}, Budget::KeepLatest); open the run again",
        rec.get("kind"), rec.get("name"), step, rec.get("rank"), k)


def _open_h5(path):
    from . import _hdf5  # only HDF5 runs need it (and h5py)

    return _hdf5.open_h5(path, RunError, RunWarning)
