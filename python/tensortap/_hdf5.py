"""Opening a run's tensors.h5, including one whose writer was killed.

The writer keeps tensors.h5 in SWMR mode, which readers open at any time. It
leaves SWMR mode for a moment whenever a name first appears (HDF5 1.10 cannot
create a dataset in it). A writer killed in that moment leaves the superblock's
consistency flags saying "open for write", and HDF5 then refuses the file to
every reader ("may use h5clear"). What the file holds is still what the writer
last flushed: every indexed row was flushed before its index line was written,
and new groups are made only in the metadata cache until the next flush.

So a reader that finds those flags, and no live writer holding the run
directory's lock, reads the file through a view that shows the flags cleared,
as `h5clear -s` would, without writing to the run. While the writer lives, it
waits for the writer to go back to SWMR mode.
"""

import io
import os
import time
import warnings

# How long a reader waits for a live writer to return to SWMR mode; creating
# a few datasets takes milliseconds.
WAIT_FOR_WRITER_S = 10.0

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_LOCK_NAME = ".tensortap.lock"  # RunDir's lock (writers/src/run_files.cpp)


def open_h5(path, run_error, run_warning):
    """An h5py.File for reading `path`; run_error and run_warning are the
    reader's exception and warning classes."""
    import h5py  # only HDF5 runs need it

    deadline = time.monotonic() + WAIT_FOR_WRITER_S
    while True:
        try:
            return h5py.File(path, "r", swmr=True)
        except (OSError, RuntimeError, ValueError):
            pass
        try:
            return h5py.File(path, "r")
        except (OSError, RuntimeError, ValueError) as e:  # h5py's choice varies with the damage
            if "already open for write" not in str(e):
                raise run_error(f"{path}: HDF5 cannot open it: {e}") from None
            refused = e
        if not writer_alive(os.path.dirname(path)):
            break
        if time.monotonic() > deadline:
            raise run_error(f"{path}: its writer is alive and has kept the file out of SWMR mode for "
                            f"{WAIT_FOR_WRITER_S:.0f} s: {refused}")
        time.sleep(0.01)
    view = FlagsClearedView(path)
    try:
        f = h5py.File(view, "r")
    except Exception as e:
        view.close()
        raise run_error(f"{path}: its writer stopped (killed?) with the file open, and it cannot be read even "
                        f"with the consistency flags cleared: {e}") from None
    warnings.warn(f"{path}: its writer stopped (killed?) while the file was open for writing; reading it as of its "
                  f"last flush (h5clear -s would clear the flags on disk)", run_warning, stacklevel=3)
    return f


def writer_alive(directory):
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


class FlagsClearedView(io.RawIOBase):
    """A read-only file object over an HDF5 file whose superblock (version 2
    or 3, at offset 0) shows zero consistency flags and a matching checksum.
    Bytes past the end of a file shorter than the superblock says read as
    zeros, as space the writer allocated but never wrote."""

    def __init__(self, path):
        super().__init__()
        self._f = open(path, "rb")
        head = self._f.read(12)
        if len(head) < 12 or head[:8] != _SIGNATURE or head[8] not in (2, 3):
            self._f.close()
            raise OSError(f"{path}: not an HDF5 file with a version 2 or 3 superblock at offset 0")
        offsets = head[9]
        size = 12 + 4 * offsets + 4  # four addresses, then the checksum
        self._f.seek(0)
        block = bytearray(self._f.read(size))
        if len(block) < size:
            self._f.close()
            raise OSError(f"{path}: superblock cut short")
        block[11] = 0
        block[-4:] = lookup3(bytes(block[:-4])).to_bytes(4, "little")
        self._head = bytes(block)
        stored_eof = int.from_bytes(block[12 + 2 * offsets:12 + 3 * offsets], "little")
        self._size = max(os.fstat(self._f.fileno()).st_size, stored_eof)
        self._pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self):
        return self._pos

    def readinto(self, b):
        view = memoryview(b).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        self._f.seek(self._pos)
        got = self._f.readinto(view[:n])
        view[got:n] = bytes(n - got)  # allocated, never written
        lo, hi = self._pos, min(self._pos + n, len(self._head))
        if lo < hi:
            view[0:hi - lo] = self._head[lo:hi]
        self._pos += n
        return n

    def close(self):
        if not self.closed:
            self._f.close()
        super().close()


def lookup3(data, initval=0):
    """Bob Jenkins' lookup3 hashlittle() of bytes: HDF5's metadata checksum."""
    mask = 0xFFFFFFFF

    def rot(x, k):
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
