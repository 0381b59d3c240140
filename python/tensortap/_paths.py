"""Where a run's files are: its rank directories, and the real path of the
file an index record names, refused unless it lies inside its run."""

import os
import re
import stat

from ._base import RunError, _is_int
from ._files import _read_json
from ._names import RUN_JSON


def _find_ranks(path):
    """{rank: directory} of the run in `path` ({None: path} for one rank).
    tensortap removes another run's files when it overwrites one; in a
    directory of an older tensortap, runs of two layouts can lie together (a
    single-rank run.json at the root beside rank folders, rank folders of a
    larger world). Then the newest run.json says which run is there: the
    root's, or the rank folders of its world size."""
    ranks = {}
    if os.path.isdir(path):
        for entry in os.listdir(path):
            m = re.fullmatch(r"rank(\d+)", entry)
            if m and os.path.isfile(os.path.join(path, entry, RUN_JSON)):
                ranks[int(m.group(1))] = os.path.join(path, entry)
    root = os.path.join(path, RUN_JSON)
    if os.path.isfile(root):
        if not ranks or _mtime(root) >= max(_mtime(os.path.join(d, RUN_JSON)) for d in ranks.values()):
            return {None: path}
    if not ranks:
        raise RunError(f"{path}: not a tensortap run (no run.json, no rank<r>/run.json)")
    newest = max(ranks.values(), key=lambda d: _mtime(os.path.join(d, RUN_JSON)))
    world = _world_size(newest)
    if world is None or world < 2:  # a rank folder's run.json says a multi-rank run, or cannot be trusted
        return ranks
    return {r: d for r, d in ranks.items() if r < world and _world_size(d) in (world, None)}


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _world_size(rank_dir):
    """run.json's world_size in `rank_dir`, or None where it cannot say."""
    try:
        w = _read_json(os.path.join(rank_dir, RUN_JSON)).get("world_size")
    except (RunError, OSError):
        return None
    return w if _is_int(w) and w > 0 else None


def _resolve(rec, dirs=None):
    """The real path of the file a record names. Refused unless it lies inside the
    rank directory: an index is data, and a damaged or planted one must not make
    the reader open files elsewhere (another run's, /etc/...). The real path, not
    the index's, is what gets opened, so that a symlink is followed only once,
    here, where it was checked. `dirs` ({}: filled here) keeps the real paths of
    directories for the records that follow, for a series of files in one."""
    file = rec["file"]
    parts = file.replace(os.sep, "/").split("/")
    if "\0" in file:
        why = "it contains NUL"
    elif os.path.isabs(file):
        why = "it is absolute"
    elif ".." in parts:
        why = "it has a '..' component"
    else:
        real = _realpath(rec.root, file, dirs)
        try:
            mode = os.stat(real).st_mode
        except OSError:
            mode = None  # missing: opening it says so
        # Both are real paths: inside is under the root's prefix.
        if real == rec.root:
            why = "it is the run directory itself, not a file"
        elif not real.startswith(os.path.join(rec.root, "")):
            why = f"it resolves to {real!r}, outside {rec.root!r}"
        elif mode is not None and not stat.S_ISREG(mode):
            why = "it is not a regular file"
        else:
            return real
    raise RunError(f"{rec.index}:{rec.lineno}: refused path {file!r}: {why}")


def _realpath(root, file, dirs):
    """os.path.realpath(root/file); with `dirs`, the directory part's real path
    is taken from it (or put in it), and only the last component looked at."""
    path = os.path.join(root, file)
    head, tail = os.path.split(file)
    if dirs is None or not head or tail in ("", ".", ".."):
        return os.path.realpath(path)
    key = (root, head)
    real_dir = dirs.get(key)
    if real_dir is None:
        real_dir = dirs[key] = os.path.realpath(os.path.join(root, head))
    candidate = os.path.join(real_dir, tail)
    try:
        link = stat.S_ISLNK(os.lstat(candidate).st_mode)
    except OSError:
        link = True  # missing or unreadable: realpath says what it says
    return os.path.realpath(candidate) if link else candidate
