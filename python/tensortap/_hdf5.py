"""Opening a run's tensors.h5, including one whose writer was killed.

The writer keeps tensors.h5 in SWMR mode, which readers open at any time.
Whenever a name first appears it makes the name's datasets, which HDF5 1.10
does not order for readers: it overwrites metadata in place, in no safe
order. So the writer keeps a rollback journal (.tensors.h5.journal,
writers/src/hdf5/journal.h) of every byte overwritten below the file's length
from then until the flush that ends its batch. A reader that finds that
journal and no live writer holding the run directory's lock reads the file as
it was before the span, without writing to the run: every indexed row was
flushed before its index line was written, and none is indexed during the span.
While the writer lives, the reader waits for the journal to go.

A file left open for writing without a journal (a writer of an older
tensortap) is read through a view that shows the consistency flags cleared,
as `h5clear -s` would.
"""

from __future__ import annotations

import io
import os
import time
import warnings
import weakref
from typing import Any, Iterable, List, Optional, Tuple, Type

from . import _safe_read
from ._names import HDF5_JOURNAL, LOCK

# How long a reader waits for a live writer to return to SWMR mode; creating
# a few datasets takes milliseconds.
WAIT_FOR_WRITER_S = 10.0

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_LOCK_NAME = LOCK  # RunDir's lock (writers/src/run_dir.cpp)
_JOURNAL_NAME = HDF5_JOURNAL
_JOURNAL_MAGIC = b"TTHDF5J1"


def open_h5(path: str, run_error: Type[Exception], run_warning: Type[Warning]) -> Any:
    """An h5py.File for reading `path`; run_error and run_warning are the
    reader's exception and warning classes."""
    import h5py  # only HDF5 runs need it

    directory = os.path.dirname(path)
    journal_path = os.path.join(directory, _JOURNAL_NAME)
    deadline = time.monotonic() + WAIT_FOR_WRITER_S
    while True:
        alive = writer_alive(directory)
        journal = read_journal(journal_path)
        if journal is not None and not alive:
            # Killed while making new names' datasets: the file may be torn
            # even where HDF5 would open it. Read it as it was before. (A dead
            # writer stays dead: its journal will not change.)
            limit, patches = journal
            how = (f"its writer stopped (killed?) while making new names' datasets; reading it as it was before "
                   f"(rolled back with {_JOURNAL_NAME})")
            return _open_view(h5py, PatchedView(path, limit, patches), how, path, run_error, run_warning)
        if journal is not None:
            # A live writer is making datasets, which HDF5 does not order for
            # readers: wait for the flush that ends its journal.
            refused = "it is making new names' datasets"
        else:
            try:
                return h5py.File(path, "r", swmr=True)
            except (OSError, RuntimeError, ValueError):
                pass
            try:
                return h5py.File(path, "r")
            except (OSError, RuntimeError, ValueError) as e:  # h5py's choice varies with the damage
                # A writer of an older tensortap left SWMR mode to make new
                # names, and its superblock says "open for write" then; other
                # writers' HDF5 may hold a lock on the file as well.
                if "already open for write" not in str(e) and "unable to lock file" not in str(e):
                    raise run_error(f"{path}: HDF5 cannot open it: {e}") from None
                refused = str(e)
        if not alive:
            break
        if time.monotonic() > deadline:
            raise run_error(f"{path}: its writer is alive and has kept the file unreadable (out of SWMR mode, or "
                            f"its journal open) for {WAIT_FOR_WRITER_S:.0f} s: {refused}")
        time.sleep(0.01)
    how = ("its writer stopped (killed?) while the file was open for writing; reading it as of its last flush "
           "(h5clear -s would clear the flags on disk)")
    return _open_view(h5py, PatchedView(path), how, path, run_error, run_warning)


def _open_view(h5py: Any, view: PatchedView, how: str, path: str, run_error: Type[Exception],
               run_warning: Type[Warning]) -> Any:
    try:
        f = h5py.File(view, "r")
    except Exception as e:
        view.close()
        raise run_error(f"{path}: {how}, and it cannot be read: {e}") from None
    warnings.warn(f"{path}: {how}", run_warning, stacklevel=4)
    return f


def dataset(f: Any, name: str, path: str, run_error: Type[Exception]) -> Any:
    """f[name], refused unless its data lies in `path` itself. HDF5 would
    follow an external link, read a dataset's external storage or a virtual
    dataset's sources from other files: outside the run directory, or a FIFO
    that blocks the reader forever. tensortap writes none of them, so any is
    planted. Soft links are followed here, by hand, so that each hop is
    checked the same way."""
    import h5py

    checked = _CHECKED.setdefault(f, set())
    if name in checked:
        return f[name]
    parts = [p for p in name.split("/") if p]
    node, hops = f, 0
    walked: List[str] = []
    while parts:
        part = parts.pop(0)
        link = node.get(part, getlink=True)
        here = "/" + "/".join(walked + [part])
        if link is None:
            raise run_error(f"{path}: no dataset {name!r} ({here!r} is missing)")
        if isinstance(link, h5py.ExternalLink):
            raise run_error(f"{path}: refused dataset {name!r}: {here!r} is an external link to "
                            f"{link.filename!r}, another file")
        if isinstance(link, h5py.SoftLink):
            hops += 1
            if hops > 32:
                raise run_error(f"{path}: refused dataset {name!r}: more than 32 soft links (a loop?)")
            target = link.path
            base = [] if target.startswith("/") else walked
            parts = base + [p for p in target.split("/") if p] + parts
            node, walked = f, []
            continue
        if not isinstance(link, h5py.HardLink):
            raise run_error(f"{path}: refused dataset {name!r}: {here!r} is a link of an unknown kind")
        node = node[part]
        walked.append(part)
    if not isinstance(node, h5py.Dataset):
        raise run_error(f"{path}: {name!r} is not a dataset")
    if node.is_virtual:
        raise run_error(f"{path}: refused dataset {name!r}: it is a virtual dataset, whose data is in other files")
    if node.external:
        files = sorted({e[0] for e in node.external})
        raise run_error(f"{path}: refused dataset {name!r}: its data is stored outside the file (external "
                        f"storage in {files!r})")
    checked.add(name)
    return node


# Datasets of an open file already checked by dataset(): a series reads one
# dataset row by row.
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def read_journal(path: str) -> Optional[Tuple[int, List[Tuple[int, bytes]]]]:
    """(limit, [(offset, bytes), ...]) from the writer's rollback journal,
    or None where there is none (an emptied journal is none). A record cut
    short at the end is left out: the overwrite it preceded never happened.
    Anything but a regular file there (a FIFO would block the read) is none
    too: tensortap's writer makes only regular journals."""
    try:
        fd, st = _safe_read.open_regular(path, follow=False)
    except OSError:
        return None
    try:
        data = _safe_read.read_all(fd, st.st_size)
    finally:
        os.close(fd)
    if len(data) < 16 or data[:8] != _JOURNAL_MAGIC:
        return None
    limit = int.from_bytes(data[8:16], "little")
    patches, i = [], 16
    while i + 16 <= len(data):
        offset = int.from_bytes(data[i:i + 8], "little")
        n = int.from_bytes(data[i + 8:i + 16], "little")
        if i + 16 + n > len(data):
            break
        patches.append((offset, data[i + 16:i + 16 + n]))
        i += 16 + n
    return limit, patches


def writer_alive(directory: str) -> bool:
    """Whether a process holds the flock of the run directory `directory`.
    Read from /proc/locks: taking the lock, even for a moment, could make a
    recorder starting now refuse the directory as in use."""
    try:
        st = os.stat(os.path.join(directory, _LOCK_NAME))
    except OSError:
        return False  # no lock file: not a directory a live writer holds
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return True  # cannot tell: wait, never read a file being written
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == want:
                return True
        except ValueError:
            continue
    return False


class PatchedView(io.RawIOBase):
    """A read-only file object over an HDF5 file as it was: `size` bytes
    long (default: as it is), with `patches` ((offset, bytes), the first
    one over a byte wins) laid over it, and a superblock (version 2 or 3, at
    offset 0) that shows zero consistency flags, an end of allocation no
    earlier than the view's end, and a matching checksum. Bytes past the
    end of a file shorter than the view read as zeros, as space the writer
    allocated but never wrote."""

    def __init__(self, path: str, size: Optional[int] = None, patches: Iterable[Tuple[int, bytes]] = ()) -> None:
        super().__init__()
        self._f = open(path, "rb")
        self._size = os.fstat(self._f.fileno()).st_size if size is None else size
        # Laid in reverse, so that the first patch over a byte is the one left.
        self._patches = list(reversed(list(patches)))
        head = self._read_at(0, 12)
        if len(head) < 12 or head[:8] != _SIGNATURE or head[8] not in (2, 3):
            self._f.close()
            raise OSError(f"{path}: not an HDF5 file with a version 2 or 3 superblock at offset 0")
        offsets = head[9]
        block = bytearray(self._read_at(0, 12 + 4 * offsets + 4))  # four addresses, then the checksum
        if len(block) < 12 + 4 * offsets + 4:
            self._f.close()
            raise OSError(f"{path}: superblock cut short")
        block[11] = 0
        # The end-of-allocation address on disk can lag behind objects that
        # were flushed after it (SWMR readers skip that check, a plain reader
        # refuses them: "addr overflow"). Raise it to the view's end, as
        # `h5clear -i` does.
        eoa_at = slice(12 + 2 * offsets, 12 + 3 * offsets)
        self._size = max(self._size, int.from_bytes(block[eoa_at], "little"))
        block[eoa_at] = self._size.to_bytes(offsets, "little")
        block[-4:] = lookup3(bytes(block[:-4])).to_bytes(4, "little")
        self._patches.append((0, bytes(block)))  # laid last: the superblock as fixed here
        self._pos = 0

    def _read_at(self, pos: int, n: int) -> bytes:
        out = bytearray(n)
        got = self._readinto_at(pos, memoryview(out))
        return bytes(out[:got])

    def _readinto_at(self, pos: int, view: memoryview) -> int:
        n = max(0, min(len(view), self._size - pos))
        self._f.seek(pos)
        got = self._f.readinto(view[:n]) or 0
        view[got:n] = bytes(n - got)  # allocated, never written
        for offset, data in self._patches:
            lo, hi = max(pos, offset), min(pos + n, offset + len(data))
            if lo < hi:
                view[lo - pos:hi - pos] = data[lo - offset:hi - offset]
        return n

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b: Any) -> int:
        n = self._readinto_at(self._pos, memoryview(b).cast("B"))
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 hashlittle() of bytes: HDF5's metadata checksum."""
    mask = 0xFFFFFFFF

    def rot(x: int, k: int) -> int:
        return ((x << k) | (x >> (32 - k))) & mask

    length = len(data)
    a = b = c = (0xDEADBEEF + length + initval) & mask
    i = 0
    while length - i > 12:
        a = (a + int.from_bytes(data[i:i + 4], "little")) & mask
        b = (b + int.from_bytes(data[i + 4:i + 8], "little")) & mask
        c = (c + int.from_bytes(data[i + 8:i + 12], "little")) & mask
        a = (a - c) & mask; a ^= rot(c, 4); c = (c + b) & mask  # noqa: E702 - the mix, row by row
        b = (b - a) & mask; b ^= rot(a, 6); a = (a + c) & mask  # noqa: E702
        c = (c - b) & mask; c ^= rot(b, 8); b = (b + a) & mask  # noqa: E702
        a = (a - c) & mask; a ^= rot(c, 16); c = (c + b) & mask  # noqa: E702
        b = (b - a) & mask; b ^= rot(a, 19); a = (a + c) & mask  # noqa: E702
        c = (c - b) & mask; c ^= rot(b, 4); b = (b + a) & mask  # noqa: E702
        i += 12
    if length == i:
        return c  # nothing left: no final mixing
    tail = data[i:] + bytes(12 - (length - i))
    a = (a + int.from_bytes(tail[0:4], "little")) & mask
    b = (b + int.from_bytes(tail[4:8], "little")) & mask
    c = (c + int.from_bytes(tail[8:12], "little")) & mask
    c ^= b; c = (c - rot(b, 14)) & mask  # noqa: E702 - the final, row by row
    a ^= c; a = (a - rot(c, 11)) & mask  # noqa: E702
    b ^= a; b = (b - rot(a, 25)) & mask  # noqa: E702
    c ^= b; c = (c - rot(b, 16)) & mask  # noqa: E702
    a ^= c; a = (a - rot(c, 4)) & mask  # noqa: E702
    b ^= a; b = (b - rot(a, 14)) & mask  # noqa: E702
    c ^= b; c = (c - rot(b, 24)) & mask  # noqa: E702
    return c
