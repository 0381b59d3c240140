"""The names tensortap writes in a run directory, and only those: the
writers' kRunFileNames (writers/src/run_dir.cpp), the index's segments
(index.<n>.jsonl, a run under Budget::KeepLatest), the TensorBoard event
files (kEventsPrefix, kEventsSuffix) and the lock RunDir holds.
tests/python/test_file_names.py checks that both sides list the same names
and that the runs the suite writes hold no others."""

from typing import Optional

RUN_JSON = "run.json"
INDEX = "index.jsonl"
DUMPS = "dumps.jsonl"
NPY_DIR = "npy"
PACKED_DIR = "packed"
HDF5_FILE = "tensors.h5"
HDF5_JOURNAL = ".tensors.h5.journal"
STATS_TABLE = "stats.npy"
STATS_SERIES = "stats_series.jsonl"
# tensortap ctl's channel (sdk/src/back/control.h, docs/leaving-it-on.md).
CONTROL_DIR = "control"
CONTROL_ANSWERS = "control.jsonl"
CONTROL_HEARTBEAT = "control.heartbeat"


def ballast_name(lines_file: str) -> str:
    """The room a lines file keeps where the file system has no fallocate
    (LinesFile::ballast_name, writers/src/lines_file.h)."""
    return "." + lines_file + ".room"


RUN_FILE_NAMES = (RUN_JSON, INDEX, NPY_DIR, PACKED_DIR, HDF5_FILE, HDF5_JOURNAL, STATS_TABLE, STATS_SERIES, DUMPS,
                  ballast_name(INDEX), ballast_name(STATS_SERIES), ballast_name(DUMPS),
                  CONTROL_DIR, CONTROL_ANSWERS, CONTROL_HEARTBEAT)

# TensorBoard event files (writers/src/tensorboard/EVENTS.md): the
# recorder's own (Options::tensorboard) and `tensortap tensorboard`'s, named
# events.out.tfevents.<seconds>.<host>.<pid>.tensortap. Every name with this
# prefix and suffix is tensortap's.
EVENTS_PREFIX = "events.out.tfevents."
EVENTS_SUFFIX = ".tensortap"


def is_events_file_name(name: str) -> bool:
    """Whether `name` is a tensortap TensorBoard event file's: the prefix, at
    least one character, the suffix (is_event_file_name, writers/src/run_dir.cpp)."""
    return (len(name) > len(EVENTS_PREFIX) + len(EVENTS_SUFFIX) and name.startswith(EVENTS_PREFIX)
            and name.endswith(EVENTS_SUFFIX))


# The index's segments (Budget::KeepLatest, docs/design.md#the-run-directory): index.jsonl
# is segment 0, the writer goes on in index.<n>.jsonl, n = 1, 2, ... in
# decimal (1 to 9 digits, no leading zero), and deletes a segment all of
# whose steps it gave up (index.jsonl too). Each may keep its ballast,
# .index.<n>.jsonl.room, while the recorder runs (is_run_file_name,
# writers/src/run_dir.cpp).
INDEX_SEGMENT_PREFIX = "index."
INDEX_SEGMENT_SUFFIX = ".jsonl"


def index_segment_number(name: str) -> Optional[int]:
    """n of an index segment's name index.<n>.jsonl (n >= 1, 1 to 9 decimal
    digits, no leading zero); None for any other name, index.jsonl (segment
    0) among them."""
    if not (name.startswith(INDEX_SEGMENT_PREFIX) and name.endswith(INDEX_SEGMENT_SUFFIX)):
        return None
    digits = name[len(INDEX_SEGMENT_PREFIX):len(name) - len(INDEX_SEGMENT_SUFFIX)]
    # ASCII digits only: str.isdigit() takes other scripts' digits and superscripts.
    if not 1 <= len(digits) <= 9 or digits[0] == "0" or any(c not in "0123456789" for c in digits):
        return None
    return int(digits)


def index_segment_name(n: int) -> str:
    """The name of index segment `n` (0: index.jsonl)."""
    return INDEX if n == 0 else f"{INDEX_SEGMENT_PREFIX}{n}{INDEX_SEGMENT_SUFFIX}"


def is_index_segment_name(name: str) -> bool:
    """Whether `name` is an index segment's past the first, index.<n>.jsonl."""
    return index_segment_number(name) is not None


def numbered_part(name: str, stem: str, ext: str) -> Optional[int]:
    """n of <stem>.<n>.<ext> (n >= 1, 1 to 9 decimal digits, no leading zero);
    None for any other name (numbered_part, writers/src/run_dir.cpp)."""
    head, tail = stem + ".", "." + ext
    if not (name.startswith(head) and name.endswith(tail)) or len(name) <= len(head) + len(tail):
        return None
    digits = name[len(head):len(name) - len(tail)]
    if not 1 <= len(digits) <= 9 or digits[0] == "0" or any(c not in "0123456789" for c in digits):
        return None
    return int(digits)


# Files that roll (docs/design.md#leaving-it-on): under Budget::KeepLatest the
# statistics in segments, stats.npy (segment 0) then stats.<n>.npy, each
# whole steps; with a budget, one older generation of control.jsonl and
# dumps.jsonl, control.1.jsonl and dumps.1.jsonl.
CONTROL_ANSWERS_OLD = "control.1.jsonl"
DUMPS_OLD = "dumps.1.jsonl"


def stats_segment_number(name: str) -> Optional[int]:
    """n of a statistics segment: 0 for stats.npy, n for stats.<n>.npy; None
    for any other name."""
    return 0 if name == STATS_TABLE else numbered_part(name, "stats", "npy")


def is_rolled_file_name(name: str) -> bool:
    """Whether `name` is a statistics segment past the first or an older
    generation of a lines file, or such a lines file's ballast
    (is_rolled_file_name, writers/src/run_dir.cpp)."""
    if name.startswith(".") and name.endswith(".room"):
        return name[1:-len(".room")] in (CONTROL_ANSWERS_OLD, DUMPS_OLD)
    return numbered_part(name, "stats", "npy") is not None or name in (CONTROL_ANSWERS_OLD, DUMPS_OLD)


def is_run_file_name(name: str) -> bool:
    """Whether `name` is one tensortap writes in a run directory (the lock aside)."""
    if name in RUN_FILE_NAMES or is_events_file_name(name) or is_index_segment_name(name) or is_rolled_file_name(name):
        return True
    # A segment's ballast, .index.<n>.jsonl.room.
    return name.startswith(".") and name.endswith(".room") and is_index_segment_name(name[1:-len(".room")])


# The advisory lock a writer holds on its run directory (RunDir). It stays
# after the run, so it is not among the names `overwrite` removes.
LOCK = ".tensortap.lock"
