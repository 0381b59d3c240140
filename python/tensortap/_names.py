"""The names tensortap writes in a run directory, and only those: the
writers' kRunFileNames (writers/src/run_dir.cpp), the TensorBoard event
files (kEventsPrefix, kEventsSuffix) and the lock RunDir holds.
tests/python/test_file_names.py checks that both sides list the same names
and that the runs the suite writes hold no others."""

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


def is_events_file_name(name):
    """Whether `name` is a tensortap TensorBoard event file's: the prefix, at
    least one character, the suffix (is_event_file_name, writers/src/run_dir.cpp)."""
    return (len(name) > len(EVENTS_PREFIX) + len(EVENTS_SUFFIX) and name.startswith(EVENTS_PREFIX)
            and name.endswith(EVENTS_SUFFIX))


def is_run_file_name(name):
    """Whether `name` is one tensortap writes in a run directory (the lock aside)."""
    return name in RUN_FILE_NAMES or is_events_file_name(name)


# The advisory lock a writer holds on its run directory (RunDir). It stays
# after the run, so it is not among the names `overwrite` removes.
LOCK = ".tensortap.lock"
