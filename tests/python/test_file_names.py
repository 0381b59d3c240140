"""The names on disk agree between the C++ writers and the Python reader.

The writers list every name they write in a run directory in kRunFileNames
(writers/src/run_dir.cpp: `overwrite` removes those, and a directory holding
one without a run is refused); the reader knows them as
tensortap._names.RUN_FILE_NAMES. The two lists must be the same. TensorBoard
event files are named by a pattern, kEventsPrefix and kEventsSuffix there,
EVENTS_PREFIX and EVENTS_SUFFIX here (events.out.tfevents.*.tensortap,
writers/src/tensorboard/EVENTS.md): the same strings on both sides. Every run
the suite's programs wrote (TT_RUN_ROOTS: folders of runs, a run at any
depth) holds no other name (_names.is_run_file_name).

    TT_RUN_ROOTS=build/tests/e2e:build/tests/analysis PYTHONPATH=python python3 tests/python/test_file_names.py
"""
import os
import re
import unittest

from tensortap import _names

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_dir_cpp():
    with open(os.path.join(ROOT, "writers", "src", "run_dir.cpp"), encoding="utf-8") as f:
        return f.read()


def writers_names():
    """kRunFileNames as writers/src/run_dir.cpp defines it."""
    text = run_dir_cpp()
    m = re.search(r"kRunFileNames\[(\d+)\]\s*=\s*\{([^}]*)\}", text)
    assert m, "kRunFileNames not found in writers/src/run_dir.cpp"
    names = re.findall(r'"([^"]*)"', m.group(2))
    assert len(names) == int(m.group(1)), (names, m.group(1))
    return names


def run_dirs(top):
    """Every directory below `top` that holds a run (its run.json)."""
    for d, subdirs, files in os.walk(top):
        if _names.RUN_JSON in files:
            yield d
        # A run's own folders (npy/, packed/) hold records, not runs.
        subdirs[:] = [s for s in subdirs if s not in (_names.NPY_DIR, _names.PACKED_DIR)]


# Names the index segments' rule takes, and names it does not (the writers'
# rule must agree: writers/src/run_dir.cpp).
INDEX_SEGMENTS = ("index.1.jsonl", "index.2.jsonl", "index.10.jsonl", "index.999999999.jsonl",
                  ".index.1.jsonl.room", ".index.10.jsonl.room", ".index.999999999.jsonl.room")
NOT_INDEX_SEGMENTS = ("index.0.jsonl", "index.01.jsonl", "index.00.jsonl", "index.-1.jsonl", "index.+1.jsonl",
                      "index.1000000000.jsonl", "index..jsonl", "index.x.jsonl", "index.1x.jsonl", "index. 1.jsonl",
                      "index.1.jsonl.tmp", "index.1.json", "xindex.1.jsonl", "index.1.jsonlx", "index.\u0661.jsonl",
                      ".index.0.jsonl.room", ".index.01.jsonl.room", "index.1.jsonl.room", ".index.1.jsonl",
                      ".index.1.jsonl.room.tmp", "..index.1.jsonl.room", ".index.jsonl.room.room")


# Rolled files (is_rolled_file_name, writers/src/run_dir.cpp), and names like them.
ROLLED = ["stats.1.npy", "stats.2.npy", "stats.999999999.npy", "control.1.jsonl", "dumps.1.jsonl",
          ".control.1.jsonl.room", ".dumps.1.jsonl.room"]
NOT_ROLLED = ["stats.0.npy", "stats.01.npy", "stats..npy", "stats.x.npy", "stats.1000000000.npy", ".stats.1.npy.room",
              "control.2.jsonl", "dumps.2.jsonl", "control.0.jsonl", "dumps.01.jsonl", "stats.1.npy.tmp",
              "xstats.1.npy", "stats.1.npyx", ".control.2.jsonl.room"]


class FileNamesTest(unittest.TestCase):
    def test_writers_and_reader_list_the_same_names(self):
        self.assertEqual(sorted(writers_names()), sorted(_names.RUN_FILE_NAMES))
        self.assertEqual(len(set(_names.RUN_FILE_NAMES)), len(_names.RUN_FILE_NAMES))

    def test_the_lock_is_the_writers(self):
        self.assertIn('kLockName = "%s"' % _names.LOCK, run_dir_cpp())

    def test_event_file_names_are_the_writers(self):
        text = run_dir_cpp()
        header = os.path.join(ROOT, "writers", "src", "run_dir.h")
        if os.path.exists(header):  # declared there and used in run_dir.cpp, maybe
            with open(header, encoding="utf-8") as f:
                text += f.read()
        for constant, value in (("kEventsPrefix", _names.EVENTS_PREFIX), ("kEventsSuffix", _names.EVENTS_SUFFIX)):
            found = re.findall(constant + r'(?:\[\])?\s*=\s*"([^"]*)"', text)
            if not found and constant not in text:
                continue  # a writer without TensorBoard events yet
            self.assertEqual(found, [value], f"{constant} in writers/src/run_dir.cpp")
        self.assertEqual(_names.EVENTS_PREFIX, "events.out.tfevents.")
        self.assertEqual(_names.EVENTS_SUFFIX, ".tensortap")

    def test_which_names_are_tensortaps(self):
        for name in _names.RUN_FILE_NAMES + ("events.out.tfevents.1732579200.node-1_lan.4242.tensortap",
                                             "events.out.tfevents.x.tensortap"):
            self.assertTrue(_names.is_run_file_name(name), name)
        for name in ("events.out.tfevents.1732579200.node-1", "events.out.tfevents.tensortap",
                     "events.out.tfevents..tensortap", "x.tensortap",
                     "events.out.tfevents", "report.html", "npy.tmp", _names.LOCK):
            self.assertFalse(_names.is_run_file_name(name), name)

    def test_index_segments_are_tensortaps(self):
        # Budget::KeepLatest's index segments and their ballast, named by a
        # rule (is_index_segment_name, writers/src/run_dir.cpp): n from 1,
        # 1 to 9 decimal digits, no leading zero.
        for name in INDEX_SEGMENTS:
            self.assertTrue(_names.is_run_file_name(name), name)
        for name in NOT_INDEX_SEGMENTS:
            self.assertFalse(_names.is_run_file_name(name), name)
        for name in INDEX_SEGMENTS:
            if not name.startswith("."):
                self.assertEqual(_names.index_segment_name(_names.index_segment_number(name)), name)

    def test_rolled_files_are_tensortaps(self):
        # DESIGN section 11: statistics segments stats.<n>.npy (no ballast),
        # the one older generation of control.jsonl and dumps.jsonl (with
        # their ballasts); the same samples as tests/unit/test_budget_outputs.cpp.
        for name in ROLLED:
            self.assertTrue(_names.is_rolled_file_name(name), name)
            self.assertTrue(_names.is_run_file_name(name), name)
        for name in NOT_ROLLED:
            self.assertFalse(_names.is_rolled_file_name(name), name)
            self.assertFalse(_names.is_run_file_name(name), name)
        self.assertEqual([_names.stats_segment_number(n) for n in ("stats.npy", "stats.1.npy", "stats.12.npy")],
                         [0, 1, 12])

    def test_runs_written_by_the_suite_hold_only_those_names(self):
        roots = [r for r in os.environ.get("TT_RUN_ROOTS", "").split(os.pathsep) if r]
        if not roots:
            self.skipTest("TT_RUN_ROOTS is not set: no runs to look at")
        seen = set()
        runs = 0
        for top in roots:
            self.assertTrue(os.path.isdir(top), top)
            for d in run_dirs(top):
                runs += 1
                for entry in os.listdir(d):
                    if re.fullmatch(r"rank\d+", entry) and os.path.isdir(os.path.join(d, entry)):
                        continue  # a rank's own run, walked on its own
                    self.assertTrue(_names.is_run_file_name(entry) or entry == _names.LOCK,
                                    f"{d} holds {entry!r}, a name the reader does not know")
                    seen.add(entry)
        self.assertGreater(runs, 0, f"no run under {roots}")
        # The runs cover the formats: each writes its own names.
        for name in (_names.RUN_JSON, _names.INDEX, _names.NPY_DIR, _names.PACKED_DIR, _names.STATS_TABLE):
            self.assertIn(name, seen)


if __name__ == "__main__":
    unittest.main()
