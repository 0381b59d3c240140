"""Folders and files made inside a directory, for the package's two writers:
the Python twin's run (_writer.py) and the TensorBoard export
(_tensorboard.py).

The rules are the C++ writers' (`File`, `Dir`, writers/src/file.*): the top
folder is the user's, opened once (a link there is theirs to make); below
it, every folder and file is one name opened relative to its parent's
descriptor, never through a symbolic link, and a file is created
exclusively. A link or a file planted where a folder goes is refused, one
planted where a file goes is never written through, and a rename or a
chdir() meanwhile moves nothing out from under the writer. POSIX only, as
the dir_fd calls are.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import BinaryIO, Callable, Iterator, Literal, Optional, Sequence, overload

from ._base import RunError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(RunError):
    """Something other than a folder where a folder goes below the top (a
    symbolic link, a file): nothing is written through it. `path` and
    `reason` let a writer say it in its own words."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def one_name(name: str, shown: str) -> str:
    """`name`, checked to be one entry of its folder: a '/' would walk
    folders (and links among them) that were never opened here, and '..'
    would leave the folder."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise RunError(f"{shown}: {name!r} is not the name of one file or folder")
    return name


@overload
def open_top(path: str, create: Literal[True]) -> int: ...


@overload
def open_top(path: str, create: bool) -> Optional[int]: ...


def open_top(path: str, create: bool) -> Optional[int]:
    """A descriptor of `path`, the user's own folder (made, with its parents,
    if `create`); None if it is not there and not `create`."""
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise OSError(e.errno, f"cannot make the folder: {e.strerror}", path) from None
    try:
        return os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        if not create:
            return None
        raise OSError(errno.ENOENT, "removed while it was being written", path) from None
    except NotADirectoryError:
        raise RunError(f"{path}: not a folder") from None
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None


@overload
def open_folder(parent_fd: int, name: str, shown: str, create: Literal[True]) -> int: ...


@overload
def open_folder(parent_fd: int, name: str, shown: str, create: bool) -> Optional[int]: ...


def open_folder(parent_fd: int, name: str, shown: str, create: bool) -> Optional[int]:
    """A descriptor of the folder `name` in `parent_fd`, never through a
    symbolic link (Refused); made first if `create`; None if it is not
    there and not `create`. `shown`: its path, for errors."""
    one_name(name, shown)
    if create:
        try:
            os.mkdir(name, 0o777, dir_fd=parent_fd)
        except FileExistsError:
            pass  # a link or a file there too: the open below refuses it
        except OSError as e:
            raise OSError(e.errno, f"cannot make the folder: {e.strerror}", shown) from None
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            return None
        raise OSError(errno.ENOENT, "removed while it was being written", shown) from None
    except OSError as e:
        try:
            mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            raise Refused(shown, "a symbolic link; tensortap writes nothing through one") from None
        if e.errno == errno.ENOTDIR or (mode and not stat.S_ISDIR(mode)):
            raise Refused(shown, "not a folder") from None
        raise OSError(e.errno, e.strerror, shown) from None


@overload
def open_folders(top_fd: int, names: Sequence[str], shown_top: str, create: Literal[True]) -> int: ...


@overload
def open_folders(top_fd: int, names: Sequence[str], shown_top: str, create: bool) -> Optional[int]: ...


def open_folders(top_fd: int, names: Sequence[str], shown_top: str, create: bool) -> Optional[int]:
    """The descriptor of top/names..., opened one name at a time (open_folder);
    None if one is not there and not `create`. The caller closes it."""
    fd = os.dup(top_fd)
    shown = shown_top
    for name in names:
        shown = os.path.join(shown, name)
        try:
            sub = open_folder(fd, name, shown, create)
        finally:
            os.close(fd)
        if sub is None:
            return None
        fd = sub
    return fd


def create_new(dir_fd: int, name: str, shown: str, append: bool = False) -> int:
    """A descriptor of the new file `name` in `dir_fd`, open for writing
    (O_APPEND if `append`): created exclusively, so that nothing there (a
    link above all) is written through; RunError if something is. The
    caller closes it."""
    one_name(name, shown)
    try:
        return os.open(name, _NEW_FILE_FLAGS | (os.O_APPEND if append else 0), 0o666, dir_fd=dir_fd)
    except FileExistsError:
        raise RunError(f"{shown}: already there; not overwritten") from None
    except OSError as e:
        raise OSError(e.errno, e.strerror, shown) from None


@contextlib.contextmanager
def new_file(dir_fd: int, name: str, shown: str, sync: bool = False, buffering: int = -1) -> Iterator[BinaryIO]:
    """The new file `name` in `dir_fd` (create_new), as a binary file, closed
    at the end of the block; if `sync`, synced first, and its folder after.
    Whatever fails, in the block or after, removes the file."""
    fd = create_new(dir_fd, name, shown)
    try:
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            yield f
            if sync:
                try:
                    f.flush()
                    os.fsync(f.fileno())
                except OSError as x:
                    raise OSError(x.errno, x.strerror, shown) from None
        if sync:
            try:
                os.fsync(dir_fd)  # its name too
            except OSError:
                pass  # a folder some file systems cannot sync: the file is
    except BaseException:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def replace_file(dir_fd: int, name: str, shown: str, write: Callable[[BinaryIO], object]) -> None:
    """Writes `name` in `dir_fd` whole or not at all: `write(f)` fills
    `.name.tmp` (new_file; a stale one removed first, never followed), which
    is then renamed over `name` (a link planted there is replaced, not
    followed), so that the name never holds a short file."""
    one_name(name, shown)
    tmp = "." + name + ".tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    with new_file(dir_fd, tmp, os.path.join(os.path.dirname(shown), tmp)) as f:
        write(f)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


__all__ = ["Refused", "one_name", "open_top", "open_folder", "open_folders", "create_new", "new_file",
           "replace_file"]
