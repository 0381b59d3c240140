"""Files read without trusting them, for every reader of the package (the
run's files, the rollback journal, the control channel's): beside
_safe_write.py, which makes them.

A name tensortap writes is opened only as a regular file: a FIFO planted
there would block the read (so every open is O_NONBLOCK, which changes
nothing for a regular file) and a device would never end. Where a symbolic
link must not lead out of the run (`follow=False`), the open refuses it
(O_NOFOLLOW: ELOOP). `dir_fd` opens a name inside a folder held by
descriptor, as the control channel does. Each caller says in its own words
what it refuses: these raise NotRegular or the OSError of the open.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional, Tuple


class NotRegular(OSError):
    """Something other than a regular file (a FIFO, a device, a folder)."""


def is_link_refused(e: OSError) -> bool:
    """Whether an open with follow=False failed on a symbolic link."""
    return e.errno == errno.ELOOP


def open_regular(path: str, follow: bool = True, dir_fd: Optional[int] = None) -> Tuple[int, os.stat_result]:
    """(a descriptor, its stat) of the regular file `path` (in `dir_fd`, if
    given), opened for reading; the caller closes it. NotRegular for
    anything else; with follow=False a symbolic link fails the open (ELOOP)."""
    # getattr: the reader's own files open where the flags are missing too.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file", path)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


class TooLarge(OSError):
    """A file holding more than the caller's limit."""


def read_regular(path: str, follow: bool = True, dir_fd: Optional[int] = None,
                 limit: Optional[int] = None) -> bytes:
    """The bytes of the regular file `path`, opened as open_regular does;
    TooLarge where it holds more than `limit` bytes (read no further)."""
    fd, st = open_regular(path, follow, dir_fd)
    try:
        if limit is None:
            return read_all(fd, st.st_size)
        chunks, n = [], 0
        while n <= limit:
            chunk = os.read(fd, limit + 1 - n)
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        if n > limit:
            raise TooLarge(errno.EFBIG, f"holds more than {limit} bytes", path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_all(fd: int, size: int) -> bytes:
    """What is left of `fd` to its end; `size` (the file's, from fstat) sizes
    the first read, which is all of it unless the file grew or is past what
    one read() returns."""
    chunks = [os.read(fd, max(size, 1))]
    while chunks[-1]:
        chunks.append(os.read(fd, 1 << 20))
    return b"".join(chunks)
