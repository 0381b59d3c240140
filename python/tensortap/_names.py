"""The names tensortap writes in a run directory, and only those: the
writers' kRunFileNames (writers/src/run_dir.cpp) and the lock RunDir holds.
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

RUN_FILE_NAMES = (RUN_JSON, INDEX, NPY_DIR, PACKED_DIR, HDF5_FILE, HDF5_JOURNAL, STATS_TABLE, STATS_SERIES, DUMPS)

# The advisory lock a writer holds on its run directory (RunDir). It stays
# after the run, so it is not among the names `overwrite` removes.
LOCK = ".tensortap.lock"
