"""The Python reader on hostile or damaged run directories, built by hand here
(no C++ build needed):

    PYTHONPATH=python /usr/bin/python3 tests/python/test_reader_hostile.py
"""

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import re
import tempfile
import time
import unittest
import warnings
from unittest import mock

import numpy as np

import tensortap
from tensortap import __main__ as cli
from tensortap import _index

RUN_JSON = {"format_version": 1, "closed": True, "options": {"format": "npy"}, "rank": 0, "world_size": 1}


def record(step, name="w", kind="grad", shape=(2, 3), **extra):
    rec = {"step": step, "kind": kind, "name": name, "dtype": "float32", "shape": list(shape) if isinstance(shape, tuple) else shape,
           "file": f"npy/{kind}/{name}/{str(step).zfill(8)}.npy"}
    rec.update(extra)
    return rec


def line(rec):
    return json.dumps(rec, ensure_ascii=False).encode() + b"\n"


def value(step):
    return np.full((2, 3), step, np.float32)


def make_run(path, lines, arrays=True):
    """A run directory: run.json, index.jsonl of `lines` (bytes, joined as they
    are, so a test can tear them), and the .npy file of each record that parses."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump(RUN_JSON, f)
    with open(os.path.join(path, "index.jsonl"), "wb") as f:
        f.write(b"".join(lines))
    if arrays:
        for raw in b"".join(lines).split(b"\n"):
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("file"), str) and rec["file"].endswith(".npy") \
                    and not os.path.isabs(rec["file"]) and ".." not in rec["file"]:
                os.makedirs(os.path.dirname(os.path.join(path, rec["file"])), exist_ok=True)
                np.save(os.path.join(path, rec["file"]), value(rec["step"]))
    return path


def open_run(path):
    """The run and the messages of the RunWarnings opening it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = tensortap.open(path)
    return run, [str(w.message) for w in caught if issubclass(w.category, tensortap.RunWarning)]


def inspect(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["inspect", *args])
    return rc, out.getvalue(), err.getvalue()


def stats_table(rows):
    dtype = [("step", "<i8"), ("series", "<i8")] + [(f, "<f8") for f in ("min", "max", "mean", "std", "norm")] \
        + [(f, "<i8") for f in ("nan", "posinf", "neginf", "zeros", "numel")]
    table = np.zeros(rows, dtype)
    table["step"] = np.arange(rows)
    table["max"] = np.arange(rows) * 2.0
    table["numel"] = 6
    return table


class TempCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-hostile-")
        self.run_dir = os.path.join(self.tmp, "runs", "exp")
        # A valid .npy outside the run: a refusal that works only because the
        # target is unreadable would not show here.
        self.outside = os.path.join(self.tmp, "x.npy")
        np.save(self.outside, value(99))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


class PathTest(TempCase):
    def assert_refused(self, run, step, path, lineno, name="w", kind="grad"):
        with self.assertRaises(tensortap.RunError) as cm:
            run.load(name, step, kind=kind)
        msg = str(cm.exception)
        self.assertIn(os.path.join(self.run_dir, "index.jsonl") + f":{lineno}:", msg)
        self.assertIn(path, msg)
        self.assertIn("refused", msg)
        return msg

    def test_parent_components_are_refused(self):
        # From runs/exp, ../../x.npy is self.outside, a valid array.
        make_run(self.run_dir, [line(record(0)),
                                line(record(1, file="../../x.npy")),
                                line(record(2, file="npy/../../../x.npy")),
                                line(record(3, file="npy/grad/../grad/w/00000000.npy"))])
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        np.testing.assert_array_equal(run.load("w", 0, kind="grad"), value(0))
        self.assertIn("'..'", self.assert_refused(run, 1, "../../x.npy", 2))
        self.assert_refused(run, 2, "npy/../../../x.npy", 3)
        # '..' is refused even where it would stay inside: the writer never
        # writes one, so it is a forged line.
        self.assert_refused(run, 3, "npy/grad/../grad/w/00000000.npy", 4)
        with self.assertRaises(tensortap.RunError):
            run.series("w", kind="grad")

    def test_absolute_paths_are_refused(self):
        make_run(self.run_dir, [line(record(0)), line(record(1, file="/etc/hostname")),
                                line(record(2, file=self.outside))])
        run, _ = open_run(self.run_dir)
        self.assertIn("absolute", self.assert_refused(run, 1, "/etc/hostname", 2))
        self.assert_refused(run, 2, self.outside, 3)
        np.testing.assert_array_equal(run.load("w", 0, kind="grad"), value(0))

    def test_symlinks_out_of_the_run_are_refused(self):
        make_run(self.run_dir, [line(record(0)), line(record(1)), line(record(2, name="v"))])
        planted = os.path.join(self.run_dir, "npy/grad/w/00000001.npy")
        os.remove(planted)
        os.symlink(self.outside, planted)
        # A planted directory link: every file under it lies outside.
        elsewhere = os.path.join(self.tmp, "elsewhere")
        shutil.move(os.path.join(self.run_dir, "npy/grad/v"), elsewhere)
        os.symlink(elsewhere, os.path.join(self.run_dir, "npy/grad/v"))
        run, _ = open_run(self.run_dir)
        msg = self.assert_refused(run, 1, "npy/grad/w/00000001.npy", 2)
        self.assertIn("outside", msg)
        self.assertIn(os.path.realpath(self.outside), msg)
        self.assert_refused(run, 2, "npy/grad/v/00000002.npy", 3, name="v")
        np.testing.assert_array_equal(run.load("w", 0, kind="grad"), value(0))

    def test_symlinks_inside_the_run_are_followed(self):
        make_run(self.run_dir, [line(record(0)), line(record(1))])
        target = os.path.join(self.run_dir, "npy/grad/w/00000001.npy")
        moved = os.path.join(self.run_dir, "moved.npy")
        os.rename(target, moved)
        os.symlink("../../../moved.npy", target)
        # The run directory itself reached through a link is still one run.
        link = os.path.join(self.tmp, "latest")
        os.symlink(self.run_dir, link)
        for path in (self.run_dir, link):
            run, _ = open_run(path)
            np.testing.assert_array_equal(run.load("w", 1, kind="grad"), value(1))
            np.testing.assert_array_equal(run.series("w", kind="grad"), np.stack([value(0), value(1)]))

    def test_directories_and_fifos_are_refused(self):
        make_run(self.run_dir, [line(record(0)), line(record(1, file="npy")), line(record(2, file="fifo.npy"))])
        os.remove(os.path.join(self.run_dir, "fifo.npy"))
        os.mkfifo(os.path.join(self.run_dir, "fifo.npy"))
        run, _ = open_run(self.run_dir)
        self.assertIn("not a regular file", self.assert_refused(run, 1, "npy", 2))
        # Opening a FIFO waits for a writer; fail instead of hanging if it is tried.
        previous = signal.signal(signal.SIGALRM, lambda *_: self.fail("the reader opened a FIFO"))
        signal.alarm(10)
        try:
            self.assert_refused(run, 2, "fifo.npy", 3)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    def test_hdf5_records_are_refused_the_same_way(self):
        h5 = {"dataset": "/grad/w/data", "row": 0}
        make_run(self.run_dir, [line(record(0, file="../../t.h5", **h5)),
                                line(record(1, file=os.path.join(self.tmp, "t.h5"), **h5))])
        with open(os.path.join(self.tmp, "t.h5"), "wb") as f:
            f.write(b"\x89HDF\r\n\x1a\n")
        run, _ = open_run(self.run_dir)
        # Refused before h5py is imported or the file opened.
        self.assert_refused(run, 0, "../../t.h5", 1)
        self.assertIn("absolute", self.assert_refused(run, 1, os.path.join(self.tmp, "t.h5"), 2))

    def test_a_record_naming_the_run_directory_itself_is_refused_as_such(self):
        make_run(self.run_dir, [line(record(0, file=".")), line(record(1, file="npy/.."))])
        run, _ = open_run(self.run_dir)
        self.assertIn("the run directory itself", self.assert_refused(run, 0, "'.'", 1))
        self.assertIn("'..' component", self.assert_refused(run, 1, "'npy/..'", 2))

    def test_a_rank_cannot_reach_into_another(self):
        for r in (0, 1):
            make_run(os.path.join(self.run_dir, f"rank{r}"), [line(record(0))])
        with open(os.path.join(self.run_dir, "rank1", "index.jsonl"), "ab") as f:
            f.write(line(record(1, file="../rank0/npy/grad/w/00000000.npy")))
        run, _ = open_run(self.run_dir)
        with self.assertRaisesRegex(tensortap.RunError, r"rank1/index\.jsonl:2: refused path '\.\./rank0/"):
            run.load("w", 1, kind="grad", rank=1)
        np.testing.assert_array_equal(run.load("w", 0, kind="grad", rank=1), value(0))

    def test_inspect_check_reports_refused_records(self):
        # The forged line repeats a good record's name and step: a check that
        # looks records up by name and step would read the good one instead.
        make_run(self.run_dir, [line(record(0)), line(record(1)), line(record(1, file="../../x.npy")),
                                line(record(2, name="v", file="/etc/hostname"))])
        rc, out, err = inspect(self.run_dir, "--check")
        self.assertEqual(rc, 1, out + err)
        self.assertIn("BAD grad 'w' step 1: " + os.path.join(self.run_dir, "index.jsonl") + ":3: refused path "
                      "'../../x.npy'", out)
        self.assertIn("BAD grad 'v' step 2: ", out)
        self.assertIn("'/etc/hostname': it is absolute", out)
        self.assertIn("check: 4 records, 2 problems", out)
        self.assertEqual(err, "")
        # Without --check the summary lists them and exits 0: nothing was read.
        rc, out, _ = inspect(self.run_dir)
        self.assertEqual(rc, 0)
        self.assertIn("total: 4 records", out)


class IndexLineTest(TempCase):
    def index(self):
        return os.path.join(self.run_dir, "index.jsonl")

    def test_torn_middle_line_is_skipped_with_a_warning(self):
        # A disk that filled mid-line, then freed: the next record is glued on.
        torn = line(record(1))[:20]
        make_run(self.run_dir, [line(record(0)), torn + line(record(2)), line(record(3)), line(record(4))])
        run, warned = open_run(self.run_dir)
        self.assertEqual(len(warned), 1, warned)
        self.assertTrue(warned[0].startswith(self.index() + ":2: skipped: not a JSON line"), warned)
        self.assertEqual(run.steps("w", kind="grad"), [0, 3, 4])
        self.assertEqual(run.records, [record(0), record(3), record(4)])
        for step in (0, 3, 4):
            np.testing.assert_array_equal(run.load("w", step, kind="grad"), value(step))

    def test_garbage_and_invalid_utf8_lines_cost_only_themselves(self):
        make_run(self.run_dir, [line(record(0)), b"\x00\x00\x00garbage\n", b'{"step":1,"name":"\xff\xfe"}\n',
                                line(record(3))])
        run, warned = open_run(self.run_dir)
        self.assertEqual([w.split(": skipped: ")[0] for w in warned], [self.index() + ":2", self.index() + ":3"])
        self.assertIn("not UTF-8", warned[1])
        self.assertEqual(run.steps("w", kind="grad"), [0, 3])

    def test_torn_last_line_is_skipped_silently(self):
        # Torn inside the two bytes of "é": the file does not end in valid UTF-8.
        last = line(record(2, name="poids_é"))
        cut = last.index("é".encode()) + 1
        make_run(self.run_dir, [line(record(0)), line(record(1)), last[:cut]])
        with open(self.index(), "rb") as f:
            with self.assertRaises(UnicodeDecodeError):
                f.read().decode("utf-8")
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        self.assertEqual(run.records, [record(0), record(1)])
        # A torn last line of plain ASCII, as before.
        with open(self.index(), "wb") as f:
            f.write(line(record(0)) + line(record(1))[:25])
        run, warned = open_run(self.run_dir)
        self.assertEqual((warned, run.steps("w", kind="grad")), ([], [0]))
        # A complete last line without its newline is kept.
        with open(self.index(), "wb") as f:
            f.write(line(record(0)) + line(record(1)).rstrip(b"\n"))
        run, warned = open_run(self.run_dir)
        self.assertEqual((warned, run.steps("w", kind="grad")), ([], [0, 1]))

    def test_lines_that_are_not_objects(self):
        make_run(self.run_dir, [b"[1,2]\n", line(record(0)), b"42\n", b'"grad"\n', b"null\n", line(record(1)),
                                b"[1,2]\n"])
        run, warned = open_run(self.run_dir)
        self.assertEqual([w.split(": skipped: ")[0] for w in warned],
                         [f"{self.index()}:{n}" for n in (1, 3, 4, 5, 7)])
        self.assertIn("an array, not an object", warned[0])
        self.assertIn("a number, not an object", warned[1])
        self.assertEqual(run.records, [record(0), record(1)])

    def test_records_missing_members_or_of_wrong_types(self):
        bad = {
            2: {k: v for k, v in record(1).items() if k != "name"},
            3: record("3"),
            4: record(True),
            5: record(4, kind="grads"),
            6: record(5, kind=["grad"]),
            7: record(6, shape=[2, "3"]),
            8: record(7, shape=[-1]),
            9: record(8, shape=6),
            10: record(9, shape=[1 << 40, 1 << 40]),
            11: record(10, file=7),
            12: record(11, file=""),
            13: record(12, dtype=None),
            14: record(13, dataset="/grad/w/data"),
            15: record(14, dataset="/grad/w/data", row=-1),
            16: {k: v for k, v in record(15).items() if k not in ("step", "file")},
        }
        make_run(self.run_dir, [line(record(0))] + [line(bad[n]) for n in sorted(bad)] + [line(record(16))])
        run, warned = open_run(self.run_dir)
        self.assertEqual([w.split(": skipped: ")[0] for w in warned], [f"{self.index()}:{n}" for n in sorted(bad)])
        why = dict(zip(sorted(bad), (w.split(": skipped: ")[1] for w in warned)))
        self.assertEqual(why[2], 'no "name"')
        self.assertEqual(why[3], '"step" is a string, not an integer')
        self.assertEqual(why[4], '"step" is a boolean, not an integer')
        self.assertEqual(why[5], "unknown kind 'grads'")
        self.assertEqual(why[14], 'no "row"')
        self.assertEqual(why[16], 'no "step", "file"')
        self.assertEqual(run.records, [record(0), record(16)])
        self.assertEqual(run.names(), ["w"])

    def test_buffer_is_a_kind(self):
        self.assertEqual(tensortap.KINDS, ("activation", "activation_grad", "param", "buffer", "grad", "tensor"))
        make_run(self.run_dir, [line(record(0, kind="grad")), line(record(0, kind="buffer", name="bn.running_mean")),
                                line(record(0, kind="param"))])
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        self.assertEqual(run.kinds(), ["param", "buffer", "grad"])
        np.testing.assert_array_equal(run.load("bn.running_mean", 0, kind="buffer"), value(0))

    def test_inspect_says_what_a_disk_budget_did(self):
        # Issue 59: run.json's "budget" (Options::max_bytes) in inspect.
        make_run(self.run_dir, [line(record(0))])
        with open(os.path.join(self.run_dir, "run.json")) as f:
            info = json.load(f)
        info["budget"] = {"max_bytes": 2 << 20, "policy": "stop_capture", "reached_at_step": 13,
                          "refused_records": 10, "refused_bytes": 216364, "given_up_below": None}
        with open(os.path.join(self.run_dir, "run.json"), "w") as f:
            json.dump(info, f)
        rc, out, err = inspect(self.run_dir)
        self.assertEqual(rc, 0, out)
        self.assertIn("disk budget 2.0 MiB (stop_capture): reached at step 13, 10 full records refused (211.3 KiB)", out)

    def test_inspect_says_what_a_stall_was(self):
        # Issue 60: a stall dump (Options::stall_after) says how long and who
        # waited, escaped as every name (a waiting line is the recorder's,
        # but the file is outside anyone's control once written).
        make_run(self.run_dir, [line(record(0))])
        with open(os.path.join(self.run_dir, "run.json")) as f:
            info = json.load(f)
        info["closed"] = False
        with open(os.path.join(self.run_dir, "run.json"), "w") as f:
            json.dump(info, f)
        with open(os.path.join(self.run_dir, "dumps.jsonl"), "w") as f:
            f.write(json.dumps({"step": 20, "reason": "stall", "steps": [], "last_step": 20,
                                "stalled_seconds": 601.25, "waiting": ["thread 4242 in flush() for 600.5 s\u202e"]})
                    + "\n")
        rc, out, err = inspect(self.run_dir)
        self.assertEqual(rc, 0, out)
        self.assertIn("flight recorder dump at step 20 (stall: no step() for 601 s; waiting: thread 4242 in flush() "
                      "for 600.5 s\\u202e): no steps", out)

    def test_bidi_and_zero_width_characters_in_names_are_escaped(self):
        # A name holding U+202E (right-to-left override) reordered the rest
        # of its line on a terminal; zero-width ones hid text (issue 56).
        evil = "fc1\u202eexe.gpj\u200b\u2066"
        make_run(self.run_dir, [line(record(0, name=evil))])
        rc, out, err = inspect(self.run_dir, "--check")
        self.assertEqual(rc, 0, out)
        self.assertFalse(any(c in out + err for c in "\u202e\u200b\u2066"), repr(out))
        self.assertIn("fc1\\u202eexe.gpj\\u200b\\u2066", out)

    def test_inspect_check_counts_skipped_lines(self):
        make_run(self.run_dir, [line(record(0)), b"{\"step\":1,\"ki\n", b"[1]\n", line(record(2))])
        rc, out, err = inspect(self.run_dir, "--check")
        self.assertEqual(rc, 1, out)
        self.assertIn(f"BAD {self.index()}:2: skipped: not a JSON line", out)
        self.assertIn(f"BAD {self.index()}:3: skipped: an array, not an object", out)
        self.assertIn("check: 2 records, 2 problems", out)
        self.assertIn(f"tensortap: warning: {self.index()}:2: skipped", err)
        self.assertIn("grad  w     2      0..2", out)
        # The summary alone still succeeds: the run is readable.
        rc, out, err = inspect(self.run_dir)
        self.assertEqual(rc, 0)
        self.assertIn("total: 2 records", out)
        # A torn last line is what a crash leaves: not a problem.
        with open(self.index(), "wb") as f:
            f.write(line(record(0)) + line(record(2)) + b'{"step":3,"kind":"gr')
        rc, out, err = inspect(self.run_dir, "--check")
        self.assertEqual((rc, err), (0, ""), out)
        self.assertIn("check: 2 records, 0 problems", out)

    def test_command_line_never_shows_a_traceback(self):
        make_run(self.run_dir, [line(record(0)), b"\xff\n", b"[1]\n", line(record(1, file="../../x.npy"))])
        # The tensortap this test imported, not whichever the path finds first.
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(tensortap.__file__))))
        p = subprocess.run([sys.executable, "-m", "tensortap", "inspect", self.run_dir, "--check"],
                           capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertIn("check: 2 records, 3 problems", p.stdout)


class StatsTest(TempCase):
    def setUp(self):
        super().setUp()
        make_run(self.run_dir, [line(record(0))])
        self.table_path = os.path.join(self.run_dir, "stats.npy")
        self.series_path = os.path.join(self.run_dir, "stats_series.jsonl")
        np.save(self.table_path, stats_table(4))
        with open(self.series_path, "w") as f:
            f.write('{"series":0,"kind":"grad","name":"w"}\n')

    def stats(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            st = tensortap.open(self.run_dir).stats("w", kind="grad")
        return st, [str(w.message) for w in caught if issubclass(w.category, tensortap.RunWarning)]

    def assert_unreadable(self, *fragments):
        run = tensortap.open(self.run_dir)
        for call in (lambda: run.stats_table(), lambda: run.stats("w", kind="grad")):
            with self.assertRaises(tensortap.RunError) as cm:
                call()
            self.assertIn(self.table_path, str(cm.exception))
            for fragment in fragments:
                self.assertIn(fragment, str(cm.exception))
        rc, out, err = inspect(self.run_dir)
        self.assertEqual(rc, 0, err)
        self.assertIn(f"statistics cannot be read: {self.table_path}", out)
        rc, out, err = inspect(self.run_dir, "--check")
        self.assertEqual(rc, 1)
        self.assertIn("BAD statistics cannot be read", out)

    def test_a_good_table(self):
        st, warned = self.stats()
        self.assertEqual(warned, [])
        np.testing.assert_array_equal(st["step"], [0, 1, 2, 3])
        np.testing.assert_array_equal(st["max"], [0, 2, 4, 6])
        rc, out, _ = inspect(self.run_dir, "--check")
        self.assertEqual(rc, 0, out)
        self.assertIn("statistics: 4 rows of 1 tensors, all finite", out)

    def test_rows_appended_before_the_header_counts_them_are_ignored(self):
        # What a reader of a live run sees: the writer appends, then recounts.
        with open(self.table_path, "ab") as f:
            f.write(stats_table(1).tobytes()[:50])
        st, _ = self.stats()
        self.assertEqual(len(st["step"]), 4)

    def test_truncated_table(self):
        size = os.path.getsize(self.table_path)
        os.truncate(self.table_path, size - 10)
        self.assert_unreadable("truncated", "counts 4 rows")

    def test_empty_table(self):
        os.truncate(self.table_path, 0)
        self.assert_unreadable("empty")

    def test_truncated_header(self):
        os.truncate(self.table_path, 40)
        self.assert_unreadable("not a statistics table")

    def test_not_a_table(self):
        np.save(self.table_path, np.zeros((4, 12)))
        self.assert_unreadable("no field step")
        np.save(self.table_path, stats_table(4).astype([(n, "<f8") for n in stats_table(0).dtype.names]))
        self.assert_unreadable("field types")
        np.save(self.table_path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        self.assert_unreadable("not a statistics table")
        with open(self.table_path, "w") as f:
            f.write("step,series\n0,0\n")
        self.assert_unreadable("not a statistics table")

    def test_damaged_series_lines(self):
        with open(self.series_path, "wb") as f:
            f.write(b'{"series":1,"kind":"grad","na\n{"series":2,"kind":"grad"}\n[3]\n'
                    b'{"series":0,"kind":"grad","name":"w"}\n{"series":"4","kind":"grad","name":"u"}\n')
        st, warned = self.stats()
        self.assertEqual([w.split(": skipped: ")[0] for w in warned],
                         [f"{self.series_path}:{n}" for n in (1, 2, 3, 5)])
        self.assertIn('no "name"', warned[1])
        np.testing.assert_array_equal(st["step"], [0, 1, 2, 3])
        rc, out, _ = inspect(self.run_dir, "--check")
        self.assertEqual(rc, 1)
        self.assertIn(f"BAD {self.series_path}:2: skipped", out)


class RunJsonTest(TempCase):
    def test_run_json_not_json_or_not_an_object(self):
        make_run(self.run_dir, [line(record(0))])
        path = os.path.join(self.run_dir, "run.json")
        for content, why in ((b'{"format_version": 1, "clo', "not valid JSON"), (b"[1, 2]", "not a JSON object"),
                             (b"\xff\xfe{}", "not valid JSON"), (b"", "not valid JSON")):
            with self.subTest(content=content):
                with open(path, "wb") as f:
                    f.write(content)
                with self.assertRaises(tensortap.RunError) as cm:
                    tensortap.open(self.run_dir)
                self.assertIn(path, str(cm.exception))
                self.assertIn(why, str(cm.exception))
                rc, out, err = inspect(self.run_dir, "--check")
                self.assertEqual(rc, 2)
                self.assertTrue(err.startswith(f"tensortap: {path}: {why}"), err)

    def test_odd_members_do_not_break_inspect(self):
        make_run(self.run_dir, [line(record(0, name="evil\x1b]0;title\x07"))])
        with open(os.path.join(self.run_dir, "run.json"), "w") as f:
            json.dump(dict(RUN_JSON, options=5, torch_version="\x1b[2J", dumps=[7, {"step": 3}]), f)
        run, _ = open_run(self.run_dir)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            self.assertEqual(run.dumps, [{"step": 3}])
        rc, out, err = inspect(self.run_dir, "--check")
        self.assertEqual(rc, 1, out + err)
        self.assertNotIn("\x1b", out + err)
        self.assertIn("torch \\x1b[2J", out)
        self.assertIn("dump 0 is a number, not an object", out)
        self.assertIn("flight recorder dump at step 3 (?): no steps", out)
        self.assertIn("check: 1 records, 1 problems", out)


class KilledHdf5WriterTest(TempCase):
    """tensors.h5 left with its consistency flags set by a writer killed out
    of SWMR mode: HDF5 alone refuses such a file to every reader."""

    def killed_writer(self, hold_lock=False):
        import h5py

        os.makedirs(self.run_dir)
        path = os.path.join(self.run_dir, "tensors.h5")
        # A child makes the file as tensortap's writer does (latest format),
        # flushes a row, and is killed with the file open for writing.
        pid = os.fork()
        if pid == 0:
            try:
                f = h5py.File(path, "w", libver="latest")
                f.create_dataset("/grad/w/data", data=np.stack([value(0), value(1)]), maxshape=(None, 2, 3))
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            finally:
                os._exit(1)
        os.waitpid(pid, 0)
        with open(path, "rb") as f:
            self.assertEqual(f.read(12)[11], 1, "the killed writer left the write-access flag set")
        make_run(self.run_dir, [line(record(s, file="tensors.h5", dataset="/grad/w/data", row=s)) for s in (0, 1)])
        holder = None
        if hold_lock:  # a live writer: a process holding the run directory's lock
            holder = subprocess.Popen([sys.executable, "-c", "import fcntl,sys,time\n"
                                       "f=open(sys.argv[1],'w'); fcntl.flock(f, fcntl.LOCK_EX)\n"
                                       "print('locked', flush=True); time.sleep(60)",
                                       os.path.join(self.run_dir, ".tensortap.lock")], stdout=subprocess.PIPE, text=True)
            self.assertEqual(holder.stdout.readline().strip(), "locked")
            self.addCleanup(holder.wait)
            self.addCleanup(holder.kill)
        return path

    def test_dead_writer_is_read_as_of_its_last_flush(self):
        path = self.killed_writer()
        with open(path, "rb") as f:
            before = f.read()
        run = tensortap.open(self.run_dir)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", tensortap.RunWarning)
            np.testing.assert_array_equal(run.load("w", 1, kind="grad"), value(1))
            np.testing.assert_array_equal(run.series("w", kind="grad"), np.stack([value(0), value(1)]))
        run.close()
        self.assertEqual([str(w.message).count("killed?") for w in caught], [1])
        with open(path, "rb") as f:
            self.assertEqual(f.read(), before, "the reader wrote to the run")

    def test_live_writer_is_waited_for_then_named(self):
        from tensortap import _hdf5

        self.killed_writer(hold_lock=True)
        self.assertTrue(_hdf5.writer_alive(self.run_dir))
        old, _hdf5.WAIT_FOR_WRITER_S = _hdf5.WAIT_FOR_WRITER_S, 0.2
        try:
            run = tensortap.open(self.run_dir)
            with self.assertRaisesRegex(tensortap.RunError, "writer is alive.*out of SWMR mode"):
                run.load("w", 0, kind="grad")
        finally:
            _hdf5.WAIT_FOR_WRITER_S = old
        self.assertFalse(_hdf5.writer_alive(self.tmp))

    def torn_run_with_journal(self, extra_records=b""):
        """A run whose tensors.h5 had rows 0 and 1 of w when its writer left
        SWMR mode, was then torn (every metadata block the span overwrote is
        garbage on disk), and whose journal holds what those blocks were."""
        import h5py

        os.makedirs(self.run_dir)
        path = os.path.join(self.run_dir, "tensors.h5")
        with h5py.File(path, "w", libver="latest") as f:
            f.create_dataset("/grad/w/data", data=np.stack([value(0), value(1)]), maxshape=(None, 2, 3))
        with open(path, "rb") as f:
            before = f.read()
        with h5py.File(path, "r+", libver="latest") as f:  # the span: new names, out of SWMR mode
            for i in range(40):
                f.create_dataset(f"/grad/new{i}/data", data=np.full((1, 4), i))
        with open(path, "rb") as f:
            after = bytearray(f.read())
        block = 64
        journal = bytearray(b"TTHDF5J1" + len(before).to_bytes(8, "little"))
        for at in range(0, len(before), block):
            old = before[at:at + block]
            if after[at:at + block] != old:
                journal += at.to_bytes(8, "little") + len(old).to_bytes(8, "little") + old
                after[at:at + len(old)] = b"\xee" * len(old)  # torn: never written whole
        self.assertGreater(len(journal), 16, "the span overwrote nothing: the test proves nothing")
        with open(path, "wb") as f:
            f.write(after)
        with open(os.path.join(self.run_dir, ".tensors.h5.journal"), "wb") as f:
            f.write(journal + extra_records)
        make_run(self.run_dir, [line(record(s, file="tensors.h5", dataset="/grad/w/data", row=s)) for s in (0, 1)])
        return path

    def test_journal_of_a_dead_writer_rolls_the_file_back(self):
        import h5py

        path = self.torn_run_with_journal()
        with self.assertRaises(OSError):  # HDF5 alone cannot read the torn file
            h5py.File(path, "r")
        with open(path, "rb") as f:
            on_disk = f.read()
        run = tensortap.open(self.run_dir)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", tensortap.RunWarning)
            np.testing.assert_array_equal(run.series("w", kind="grad"), np.stack([value(0), value(1)]))
        run.close()
        self.assertEqual(["rolled back" in str(w.message) for w in caught], [True])
        with open(path, "rb") as f:
            self.assertEqual(f.read(), on_disk, "the reader wrote to the run")

    def test_journal_record_cut_short_is_ignored_and_the_first_save_wins(self):
        # A later record over the same bytes (garbage), then one cut short by
        # the crash: the first saved bytes are what the file held.
        later = (0).to_bytes(8, "little") + (64).to_bytes(8, "little") + b"\x00" * 64
        cut = (0).to_bytes(8, "little") + (4096).to_bytes(8, "little") + b"\x01" * 100
        self.torn_run_with_journal(later + cut)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tensortap.RunWarning)
            np.testing.assert_array_equal(tensortap.open(self.run_dir).series("w", kind="grad"),
                                          np.stack([value(0), value(1)]))

    def test_journal_of_a_live_writer_is_not_rolled_back(self):
        from tensortap import _hdf5

        self.killed_writer(hold_lock=True)
        with open(os.path.join(self.run_dir, ".tensors.h5.journal"), "wb") as f:
            f.write(b"TTHDF5J1" + (10).to_bytes(8, "little"))
        old, _hdf5.WAIT_FOR_WRITER_S = _hdf5.WAIT_FOR_WRITER_S, 0.2
        try:
            with self.assertRaisesRegex(tensortap.RunError, "writer is alive.*out of SWMR mode"):
                tensortap.open(self.run_dir).load("w", 0, kind="grad")
        finally:
            _hdf5.WAIT_FOR_WRITER_S = old

    def test_journal_planted_as_a_link_is_not_read(self):
        self.killed_writer()
        os.symlink("/dev/zero", os.path.join(self.run_dir, ".tensors.h5.journal"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", tensortap.RunWarning)
            np.testing.assert_array_equal(tensortap.open(self.run_dir).load("w", 1, kind="grad"), value(1))
        self.assertEqual(["rolled back" in str(w.message) for w in caught], [False])

    def test_not_hdf5_is_a_run_error_naming_the_file(self):
        os.makedirs(self.run_dir)
        with open(os.path.join(self.run_dir, "tensors.h5"), "wb") as f:
            f.write(b"\x89HDF\r\n\x1a\n" + b"\xff" * 100)
        make_run(self.run_dir, [line(record(0, file="tensors.h5", dataset="/grad/w/data", row=0))])
        with self.assertRaisesRegex(tensortap.RunError, "tensors.h5: HDF5 cannot open it"):
            tensortap.open(self.run_dir).load("w", 0, kind="grad")

    def test_lookup3_is_hdf5s_checksum(self):
        import h5py
        from tensortap import _hdf5

        path = os.path.join(self.tmp, "clean.h5")
        with h5py.File(path, "w", libver="latest") as f:
            f["x"] = np.arange(3)
        with open(path, "rb") as f:
            head = f.read(48)
        self.assertEqual(_hdf5.lookup3(head[:44]), int.from_bytes(head[44:], "little"))
        self.assertEqual(_hdf5.lookup3(b""), 0xDEADBEEF)


class SmallItemsTest(TempCase):
    """Damaged indexes and small things (issue 30, item 15)."""

    def test_a_step_indexed_twice_is_one_row_of_series(self):
        make_run(self.run_dir, [line(record(0)), line(record(1)), line(record(1)), line(record(2))])
        run, _ = open_run(self.run_dir)
        self.assertEqual(run.steps("w", kind="grad"), [0, 1, 2])
        self.assertEqual(run.series("w", kind="grad").shape, (3, 2, 3))
        self.assertEqual(run.series("w", kind="grad", lazy=True).compute().shape, (3, 2, 3))

    def test_lazy_series_refuses_a_file_unlike_its_index(self):
        make_run(self.run_dir, [line(record(0)), line(record(1))])
        np.save(os.path.join(self.run_dir, "npy/grad/w/00000001.npy"), np.zeros((3, 2), np.float32))
        lazy = tensortap.open(self.run_dir).series("w", kind="grad", lazy=True)
        self.assertEqual(lazy.shape, (2, 2, 3))
        with self.assertRaisesRegex(tensortap.RunError, r"holds shape \[3, 2\], the index says \[2, 3\]"):
            lazy.compute()

    def test_closed_must_be_json_true(self):
        make_run(self.run_dir, [line(record(0))])
        for closed, want in (("false", False), ("true", False), (1, False), (True, True), (None, False)):
            with open(os.path.join(self.run_dir, "run.json"), "w") as f:
                json.dump(dict(RUN_JSON, closed=closed), f)
            self.assertIs(tensortap.open(self.run_dir).closed, want, closed)

    def test_a_missing_name_lists_a_few_names_and_the_count(self):
        make_run(self.run_dir, [line(record(0, name=f"layer{i}.weight")) for i in range(500)])
        with self.assertRaises(KeyError) as caught:
            tensortap.open(self.run_dir).load("nope", 0, kind="grad")
        message = str(caught.exception)
        self.assertIn("'layer0.weight'", message)
        self.assertIn("(500 in all)", message)
        self.assertLess(len(message), 600)

    def test_report_page_follows_the_umask(self):
        make_run(self.run_dir, [line(record(s)) for s in range(3)])
        out = os.path.join(self.tmp, "report.html")
        old = os.umask(0o022)
        try:
            from tensortap._pages import report
            report.write_report(tensortap.open(self.run_dir), out)
        finally:
            os.umask(old)
        self.assertEqual(os.stat(out).st_mode & 0o777, 0o644)


class MixedRunsTest(TempCase):
    """Runs of two layouts in one directory, as an older tensortap left them
    (issue 30, item 14): the reader shows the run that is there."""

    def rank_run(self, r, world, step):
        d = make_run(os.path.join(self.run_dir, f"rank{r}"), [line(record(step))])
        with open(os.path.join(d, "run.json"), "w") as f:
            json.dump(dict(RUN_JSON, rank=r, world_size=world), f)
        return d

    def test_a_two_rank_rerun_over_four_ranks_reads_as_two(self):
        for r in range(4):
            self.rank_run(r, 4, 0)
        time.sleep(0.02)
        for r in range(2):
            self.rank_run(r, 2, 7)
        run = tensortap.open(self.run_dir)
        self.assertEqual(run.ranks, [0, 1])
        self.assertEqual(run.series("w", kind="grad").shape, (2, 1, 2, 3))

    def test_a_stale_single_rank_root_does_not_hide_a_newer_multi_rank_run(self):
        make_run(self.run_dir, [line(record(0))])
        time.sleep(0.02)
        for r in range(2):
            self.rank_run(r, 2, 3)
        self.assertEqual(tensortap.open(self.run_dir).ranks, [0, 1])
        # And the other way round: a newer single-rank run over old rank folders.
        time.sleep(0.02)
        make_run(self.run_dir, [line(record(5))])
        run = tensortap.open(self.run_dir)
        self.assertEqual(run.ranks, [])
        self.assertEqual(run.steps("w", kind="grad"), [5])


class DumpsTest(TempCase):
    """dumps.jsonl (issue 30, item 7): the writer appends a line per dump and
    writes run.json's "dumps" once, at close. A closed run's dumps come from
    run.json; one still going or cut short, from dumps.jsonl; an older run's,
    from run.json."""

    # Two dumps as the writer prints them (sdk/src/sinks/run_json.cpp, append_dump_json).
    LINES = [
        b'{"step": 3, "reason": "user", "steps": [1,2,3]}\n',
        b'{"step": 7, "reason": "spike", "steps": [5,6,7], "kind": "tensor", "name": "loss", '
        b'"trigger": {"kind": "spike", "factor": 5, "window": 10}, "value": 50, "median": 1.25}\n',
    ]
    WANT = [
        {"step": 3, "reason": "user", "steps": [1, 2, 3]},
        {"step": 7, "reason": "spike", "steps": [5, 6, 7], "kind": "tensor", "name": "loss",
         "trigger": {"kind": "spike", "factor": 5, "window": 10}, "value": 50, "median": 1.25},
    ]

    def run_with(self, lines, closed=False, dumps=(), path=None, **info):
        path = path or self.run_dir
        make_run(path, [line(record(0))])
        with open(os.path.join(path, "run.json"), "w") as f:
            json.dump(dict(RUN_JSON, closed=closed, dumps=list(dumps), **info), f)
        if lines is not None:
            with open(os.path.join(path, "dumps.jsonl"), "wb") as f:
                f.write(b"".join(lines))
        return path

    def dumps(self):
        """The run's dumps and the messages of the RunWarnings reading them gave."""
        run = tensortap.open(self.run_dir)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dumps = run.dumps
        return dumps, [str(w.message) for w in caught if issubclass(w.category, tensortap.RunWarning)]

    def test_a_run_cut_short_reads_its_dumps_from_dumps_jsonl(self):
        # A crash: run.json as written at open (no dumps, not closed).
        self.run_with(self.LINES)
        self.assertEqual(self.dumps(), (self.WANT, []))

    def test_a_torn_last_line_is_skipped_and_a_bad_line_warned_about(self):
        self.run_with(self.LINES + [b'{"step": 9, "reason": "us'])
        self.assertEqual(self.dumps(), (self.WANT, []))
        self.run_with([self.LINES[0], b"garbage\n", b"[1, 2]\n", self.LINES[1], b"{\"step\": 9"])
        dumps, warned = self.dumps()
        self.assertEqual(dumps, self.WANT)
        self.assertEqual(len(warned), 2, warned)
        self.assertIn("dumps.jsonl:2: skipped: not a JSON line", warned[0])
        self.assertIn("dumps.jsonl:3: skipped: an array, not an object", warned[1])

    def test_an_older_run_reads_its_dumps_from_run_json(self):
        # A tensortap before dumps.jsonl rewrote run.json with each dump,
        # closed or not.
        for closed in (True, False):
            self.run_with(None, closed=closed, dumps=self.WANT)
            self.assertEqual(self.dumps(), (self.WANT, []))

    def test_a_closed_run_reads_run_json_which_lists_every_dump(self):
        # close() lists every dump; dumps.jsonl may lack one whose append
        # failed on a full disk.
        self.run_with(self.LINES[:1], closed=True, dumps=self.WANT)
        self.assertEqual(self.dumps(), (self.WANT, []))

    def test_each_rank_reads_its_own(self):
        # Rank 0 crashed (dumps.jsonl), rank 1 closed (run.json).
        self.run_with(self.LINES[:1], path=os.path.join(self.run_dir, "rank0"), rank=0, world_size=2)
        self.run_with(self.LINES, closed=True, dumps=self.WANT[1:], path=os.path.join(self.run_dir, "rank1"),
                      rank=1, world_size=2)
        dumps, warned = self.dumps()
        self.assertEqual(warned, [])
        self.assertEqual(dumps, [dict(self.WANT[0], rank=0), dict(self.WANT[1], rank=1)])

    def test_a_fifo_or_a_link_at_dumps_jsonl_is_not_read(self):
        self.run_with(None)
        path = os.path.join(self.run_dir, "dumps.jsonl")
        os.mkfifo(path)
        # Opening a FIFO waits for a writer; fail instead of hanging if it is tried.
        previous = signal.signal(signal.SIGALRM, lambda *_: self.fail("the reader opened a FIFO"))
        signal.alarm(10)
        try:
            dumps, warned = self.dumps()
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        self.assertEqual(dumps, [])
        self.assertEqual(len(warned), 1, warned)
        self.assertIn("dumps.jsonl: not a regular file", warned[0])
        # A link out of the run, to dumps that look real: never followed.
        os.remove(path)
        outside = os.path.join(self.tmp, "outside.jsonl")
        with open(outside, "wb") as f:
            f.write(b"".join(self.LINES))
        os.symlink(outside, path)
        dumps, warned = self.dumps()
        self.assertEqual(dumps, [])
        self.assertEqual(len(warned), 1, warned)
        self.assertIn("dumps.jsonl: a symbolic link", warned[0])
        # A dangling one too.
        os.remove(outside)
        self.assertEqual(self.dumps()[0], [])


class PlantedHdf5Test(TempCase):
    """An HDF5 run whose tensors.h5 points outside itself: HDF5 would follow
    an external link, external storage or a virtual dataset's sources to
    another file (outside the run, or a FIFO that blocks forever). The reader
    refuses each, and inspect --check reports it."""

    def run_with(self, plant):
        import h5py

        os.makedirs(self.run_dir)
        outside = os.path.join(self.tmp, "secret.bin")
        with open(outside, "wb") as f:
            f.write(np.full((2, 3), 42, np.float32).tobytes())
        other = os.path.join(self.tmp, "other.h5")
        with h5py.File(other, "w") as f:
            f.create_dataset("data", data=np.full((1, 2, 3), 42, np.float32))
        with h5py.File(os.path.join(self.run_dir, "tensors.h5"), "w", libver="latest") as f:
            f.create_dataset("grad/w/data", data=value(0)[None])
            plant(f, h5py, outside, other)
        make_run(self.run_dir, [line(record(0, name="v", file="tensors.h5", dataset="/grad/v/data", row=0)),
                                line(record(0, name="w", file="tensors.h5", dataset="/grad/w/data", row=0))])
        return self.run_dir

    def assert_refused_load(self, why):
        run = tensortap.open(self.run_dir)
        np.testing.assert_array_equal(run.load("w", 0, kind="grad"), value(0))  # the honest one still reads
        with self.assertRaisesRegex(tensortap.RunError, why):
            run.load("v", 0, kind="grad")
        rc, out, err = inspect(self.run_dir, "--check")
        self.assertNotEqual(rc, 0, out + err)
        self.assertRegex(out + err, why)

    def test_external_storage_is_refused(self):
        self.run_with(lambda f, h5py, outside, other: f.create_dataset(
            "grad/v/data", shape=(1, 2, 3), dtype="f4", external=[(outside, 0, 24)]))
        self.assert_refused_load("stored outside the file")

    def test_external_link_is_refused(self):
        def plant(f, h5py, outside, other):
            f["grad/v"] = h5py.ExternalLink(other, "/")
        self.run_with(plant)
        self.assert_refused_load("external link")

    def test_soft_link_through_an_external_link_is_refused(self):
        def plant(f, h5py, outside, other):
            f["elsewhere"] = h5py.ExternalLink(other, "/")
            f["grad/v"] = h5py.SoftLink("/elsewhere")
        self.run_with(plant)
        self.assert_refused_load("external link")

    def test_virtual_dataset_is_refused(self):
        def plant(f, h5py, outside, other):
            layout = h5py.VirtualLayout(shape=(1, 2, 3), dtype="f4")
            layout[:] = h5py.VirtualSource(other, "data", shape=(1, 2, 3))
            f["grad"].create_virtual_dataset("v/data", layout)
        self.run_with(plant)
        self.assert_refused_load("virtual dataset")

    def test_external_storage_on_a_fifo_does_not_hang(self):
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        self.run_with(lambda f, h5py, outside, other: f.create_dataset(
            "grad/v/data", shape=(1, 2, 3), dtype="f4", external=[(fifo, 0, 24)]))
        self.assert_refused_load("stored outside the file")

    def test_journal_planted_as_a_fifo_does_not_hang(self):
        self.run_with(lambda *a: None)
        os.mkfifo(os.path.join(self.run_dir, ".tensors.h5.journal"))
        np.testing.assert_array_equal(tensortap.open(self.run_dir).load("w", 0, kind="grad"), value(0))


def compact(rec, ascii=True):
    """The index line of `rec` as the C++ writer prints it: no spaces, members
    in the dict's order (record() has the writer's); with ascii=False, other
    characters as UTF-8, not escaped, as the writer has them."""
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=ascii).encode("utf-8", "surrogatepass") + b"\n"


def lines_read_one_by_one(fn):
    """fn(), and how many lines went through the line-by-line path."""
    seen = []
    slow = _index.Index._slow_lines

    def counting(self, lines, *args, **kwargs):
        seen.extend(lines)
        return slow(self, lines, *args, **kwargs)

    with mock.patch.object(_index.Index, "_slow_lines", counting):
        return fn(), len(seen)


def never_fast():
    """Every block read line by line, as if no line were in the writer's form."""
    return mock.patch.object(_index, "_LINE", re.compile(rb"(?!)"))


def image(a):
    b = io.BytesIO()
    np.save(b, a, allow_pickle=False)
    return b.getvalue()


def make_packed_run(path, arrays, segment_bytes=1 << 30):
    """A Format::Packed run as packed/writer.cpp writes one: each (step, name,
    array) a .npy image at a 64-byte-aligned offset of packed/<n>.npys, a new
    segment when the next record would pass segment_bytes; index lines in
    the writer's form. Returns the index records."""
    os.makedirs(os.path.join(path, "packed"))
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump(dict(RUN_JSON, options={"format": "packed"}), f)
    recs, seg, end = [], 0, 0
    for step, name, a in arrays:
        img = image(a)
        offset = -(-end // 64) * 64
        if end and offset + len(img) > segment_bytes:
            seg, offset = seg + 1, 0
        rel = f"packed/{seg:08d}.npys"
        with open(os.path.join(path, rel), "ab") as f:
            f.write(b"\0" * (offset - f.tell()) + img)
        end = offset + len(img)
        recs.append(record(step, name=name, shape=list(a.shape), dtype=str(a.dtype), file=rel, offset=offset,
                           nbytes=len(img)))
    with open(os.path.join(path, "index.jsonl"), "wb") as f:
        f.write(b"".join(compact(r) for r in recs))
    return recs


class CompactIndexTest(TempCase):
    """The index held as columns (tensortap/_index.py) gives the records the
    lines hold, whether a block is read by the fast path or line by line."""

    def open_both(self, max_slow_lines):
        """The run opened as it is and with every line read one by one; at
        most `max_slow_lines` went one by one the first time."""
        (fast, fast_warned), slow_lines = lines_read_one_by_one(lambda: open_run(self.run_dir))
        self.assertLessEqual(slow_lines, max_slow_lines)
        with never_fast():
            slow, slow_warned = open_run(self.run_dir)
        self.assertEqual(fast_warned, slow_warned)
        return fast, slow, fast_warned

    def test_records_are_the_lines_on_both_paths(self):
        names = ["w", 'quote"d', "back\\slash", "tab\tnew\nline", "poids_é", "\udc80raw", "a/b", "日本"]
        lines = [compact(record(s, name=n, kind=k)) for s in range(3) for n in names for k in ("grad", "param")]
        lines.append(compact(record(0, name="h", file="tensors.h5", dataset="/grad/h\"x/data", row=4)))
        lines.append(compact(record(1, name="p", file="packed/00000000.npys", offset=128, nbytes=4096)))
        # Characters as UTF-8; a byte that is not UTF-8 the writer escapes, as above.
        lines += [compact(record(s, name=n), ascii=False) for s in (5, 6) for n in names if n != "\udc80raw"]
        make_run(self.run_dir, lines, arrays=False)
        fast, slow, warned = self.open_both(max_slow_lines=0)
        self.assertEqual(warned, [])
        want = [json.loads(raw) for raw in lines]
        self.assertEqual(fast.records, want)
        self.assertEqual(slow.records, want)
        self.assertEqual(list(fast.records), want)
        for i, rec in enumerate(fast.records):
            self.assertEqual((rec.index, rec.lineno, rec.root),
                             (os.path.join(self.run_dir, "index.jsonl"), i + 1, os.path.realpath(self.run_dir)))
        self.assertEqual(fast.names("grad"), sorted(set(names) | {"h", "p"}))
        # What repeats is held once: a name's kind, dtype, shape and directory;
        # a file name per step (.npy) or segment.
        self.assertEqual(len(fast._index.metas), 2 * len(names) + 2)
        self.assertEqual(sorted(fast._index.bases), sorted([f"{s:08d}.npy" for s in (0, 1, 2, 5, 6)] +
                                                           ["00000000.npys", "tensors.h5"]))
        self.assertEqual(fast.steps("back\\slash", kind="param"), [0, 1, 2])

    def test_block_boundaries_and_damage_in_every_block(self):
        # Blocks of 200 bytes: lines cross them, and one line is longer than a block.
        good = [compact(record(s, name="n" * (300 if s == 7 else 1))) for s in range(40)]
        lines = list(good)
        lines[10] = b"garbage\n"
        lines[20] = compact(record(20, kind="grads"))   # the writer's form, an unknown kind
        lines[30] = b"\n"                               # blank: skipped without a word
        lines[35] = line(record(35))                    # json.dumps with spaces: a record, not the writer's form
        lines.append(good[0][:30])                     # torn last line
        make_run(self.run_dir, lines, arrays=False)
        with mock.patch.object(_index, "_BLOCK", 200):
            # The blocks with no such line are read by the fast path.
            fast, slow, warned = self.open_both(max_slow_lines=12)
        index = os.path.join(self.run_dir, "index.jsonl")
        self.assertEqual([w.split(": skipped: ")[0] for w in warned], [f"{index}:11", f"{index}:21"])
        self.assertIn("unknown kind 'grads'", warned[1])
        want = [json.loads(raw) for i, raw in enumerate(lines[:-1]) if i not in (10, 20, 30)]
        self.assertEqual(want[32], record(35))
        self.assertEqual(fast.records, want)
        self.assertEqual(slow.records, want)
        self.assertEqual([r.lineno for r in fast.records], [i + 1 for i in range(40) if i not in (10, 20, 30)])
        # The kind of the damaged line is no kind of the run: only "grad" records remain.
        self.assertEqual(fast.kinds(), ["grad"])

    def test_lines_of_many_blocks(self):
        # Lines of 60 blocks of 200 bytes, in the middle and torn at the end:
        # each costs only itself (and is read in one piece, not re-joined
        # at every block).
        long = compact(record(1, name="n" * 12000))
        make_run(self.run_dir, [compact(record(0)), long, b"x" * 12000 + b"\n", compact(record(2)),
                                b"y" * 12000], arrays=False)
        with mock.patch.object(_index, "_BLOCK", 200):
            run, warned = open_run(self.run_dir)
        self.assertEqual(run.records, [record(0), json.loads(long), record(2)])
        self.assertEqual([w.split(": skipped: ")[0] for w in warned], [f"{self.run_dir}/index.jsonl:3"])

    def test_lines_with_members_of_their_own_keep_them(self):
        make_run(self.run_dir, [compact(record(0)), compact(record(1, note="by hand", retries=2)),
                                compact(record(2))])
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        self.assertEqual(run.records[1], record(1, note="by hand", retries=2))
        self.assertEqual(run.records[-1], record(2))
        np.testing.assert_array_equal(run.series("w", kind="grad"), np.stack([value(s) for s in range(3)]))

    def test_records_is_a_sequence_of_dicts(self):
        make_run(self.run_dir, [compact(record(s)) for s in range(5)])
        records = tensortap.open(self.run_dir).records
        self.assertEqual(len(records), 5)
        self.assertEqual(records[-1], record(4))
        self.assertEqual(records[1:3], [record(1), record(2)])
        self.assertEqual(records, tuple(record(s) for s in range(5)))
        self.assertNotEqual(records, [record(s) for s in range(4)])
        self.assertEqual([r["step"] for r in records], list(range(5)))
        with self.assertRaises(IndexError):
            records[5]
        self.assertIn("'step': 4", repr(records))

    def test_a_file_that_grew_since_the_columns_were_sized(self):
        # A live run appends between the sizing and the read: nothing is lost.
        make_run(self.run_dir, [compact(record(s)) for s in range(3)] + [line(record(s)) for s in range(3, 6)])
        with mock.patch.object(_index, "_capacity", lambda paths: 2):
            run, _ = open_run(self.run_dir)
        self.assertEqual(run.records, [record(s) for s in range(6)])
        np.testing.assert_array_equal(run.series("w", kind="grad"), np.stack([value(s) for s in range(6)]))

    def test_inspect_summary_from_the_columns(self):
        make_run(self.run_dir, [compact(record(0)), compact(record(1, shape=(3, 2))), compact(record(2)),
                                compact(record(0, name="v", kind="param"))], arrays=False)
        rc, out, _ = inspect(self.run_dir)
        self.assertEqual(rc, 0)
        rows = {tuple(r.split()[:2]): r.split()[2:] for r in out.splitlines() if r.startswith("  ")}
        self.assertEqual(rows[("grad", "w")], ["3", "0..2", "2", "shapes", "float32", "72", "B"])
        self.assertEqual(rows[("param", "v")], ["1", "0..0", "(2,", "3)", "float32", "24", "B"])
        self.assertIn("total: 4 records, 96 B", out)


class SeriesReadTest(TempCase):
    """series() reads a segment's records through one open and one map, and
    each exactly as np.load at its offset does."""

    def opens(self, run, *args, **kwargs):
        """series(*args, **kwargs) and the files it opened through _open_regular."""
        opened = []
        real = tensortap._files._open_regular

        def counting(path):
            opened.append(path)
            return real(path)

        # Every module opens through _files._open_regular, looked up when called.
        with mock.patch.object(tensortap._files, "_open_regular", counting):
            return run.series(*args, **kwargs), opened

    def test_one_open_per_segment_and_every_record_exact(self):
        rng = np.random.default_rng(0)
        want = {n: [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(40)] for n in ("a", "b")}
        arrays = [(s, n, want[n][s]) for s in range(40) for n in ("a", "b")]
        recs = make_packed_run(self.run_dir, arrays, segment_bytes=2048)
        segments = sorted({r["file"] for r in recs if r["name"] == "a"})
        self.assertGreater(len(segments), 3)
        run = tensortap.open(self.run_dir)
        s, opened = self.opens(run, "a", kind="grad")
        self.assertEqual(sorted(os.path.relpath(p, os.path.realpath(self.run_dir)) for p in opened), segments)
        np.testing.assert_array_equal(s, np.stack(want["a"]))
        for rec in recs:
            with open(os.path.join(self.run_dir, rec["file"]), "rb") as f:
                f.seek(rec["offset"])
                np.testing.assert_array_equal(run.load(rec["name"], rec["step"], kind="grad"), np.load(f))

    def test_dtypes_orders_and_shapes(self):
        values = [np.arange(6, dtype=np.int16).reshape(2, 3), np.asfortranarray(np.arange(6.0).reshape(2, 3)),
                  np.array([[True, False, True]] * 2), np.arange(6, dtype=">f4").reshape(2, 3)]
        make_packed_run(self.run_dir, [(s, "x", a) for s, a in enumerate(values)] +
                        [(0, "empty", np.zeros((0, 4), np.float32)), (0, "scalar", np.array(2.5))])
        run = tensortap.open(self.run_dir)
        s = run.series("x", kind="grad")
        self.assertEqual(s.dtype, np.stack(values).dtype)
        np.testing.assert_array_equal(s, np.stack(values))
        self.assertEqual(run.series("empty", kind="grad").shape, (1, 0, 4))
        np.testing.assert_array_equal(run.series("scalar", kind="grad"), [2.5])

    def test_a_damaged_record_in_a_series_is_refused_as_by_load(self):
        arrays = [(s, "w", value(s)) for s in range(4)]
        for fault, why in ((dict(offset=64), "not a .npy image"), (dict(nbytes=10 ** 6), "past the end"),
                           (dict(shape=[2, 3]), None)):
            with self.subTest(fault=fault):
                shutil.rmtree(self.run_dir, ignore_errors=True)
                recs = make_packed_run(self.run_dir, arrays)
                if why is None:  # the segment's bytes damaged, not the index
                    with open(os.path.join(self.run_dir, recs[2]["file"]), "r+b") as f:
                        f.seek(recs[2]["offset"])
                        f.write(b"NOTNPY")
                    why = "not a .npy image"
                else:
                    recs[2].update(fault)
                    with open(os.path.join(self.run_dir, "index.jsonl"), "wb") as f:
                        f.write(b"".join(compact(r) for r in recs))
                run = tensortap.open(self.run_dir)
                with self.assertRaisesRegex(tensortap.RunError, "index.jsonl:3: .*" + why):
                    run.series("w", kind="grad")
                with self.assertRaisesRegex(tensortap.RunError, "index.jsonl:3: .*" + why):
                    run.load("w", 2, kind="grad")

    def test_npy_series_reads_what_np_load_reads(self):
        make_run(self.run_dir, [compact(record(s)) for s in range(4)])
        files = [os.path.join(self.run_dir, record(s)["file"]) for s in range(4)]
        # Another dtype, a Fortran-order array, a .npy of version 3.0 (NumPy
        # reads it; tensortap never writes one): each as np.load has it.
        np.save(files[1], value(1).astype(np.float64))
        np.save(files[2], np.asfortranarray(value(2)))
        with open(files[3], "wb") as f:
            np.lib.format.write_array(f, value(3), version=(3, 0))
        s = tensortap.open(self.run_dir).series("w", kind="grad")
        np.testing.assert_array_equal(s, np.stack([np.load(p) for p in files]))
        self.assertEqual(s.dtype, np.float64)
        # An object array is never unpickled: np.load's refusal, as before.
        np.save(files[2], np.array([{"a": 1}] * 6, dtype=object).reshape(2, 3), allow_pickle=True)
        with self.assertRaisesRegex(ValueError, "allow_pickle"):
            tensortap.open(self.run_dir).series("w", kind="grad")
        os.remove(files[2])
        with self.assertRaises(FileNotFoundError):
            tensortap.open(self.run_dir).series("w", kind="grad")

    def test_directory_links_out_of_the_run_are_refused_in_a_series(self):
        make_run(self.run_dir, [compact(record(s)) for s in range(3)])
        elsewhere = os.path.join(self.tmp, "elsewhere")
        shutil.move(os.path.join(self.run_dir, "npy/grad/w"), elsewhere)
        os.symlink(elsewhere, os.path.join(self.run_dir, "npy/grad/w"))
        with self.assertRaisesRegex(tensortap.RunError, r"index\.jsonl:1: refused path .*outside"):
            tensortap.open(self.run_dir).series("w", kind="grad")


class PackageTest(unittest.TestCase):
    def test_no_module_imports_from_the_package_itself(self):
        # Each module takes a name from the module that defines it: a name
        # taken from __init__ works only in the order __init__ imports.
        import ast

        folder = os.path.dirname(tensortap.__file__)
        files = sorted(os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder)
                       for n in names if n.endswith(".py"))
        # A module's name, or a feature folder's; tensortap._engine is the
        # compiled engine, built into a build tree's tensortap/.
        submodules = {n.split(os.sep)[0][:-3] if n.endswith(".py") and os.sep not in n else n.split(os.sep)[0]
                      for n in files} | {"_engine"}
        found = []
        for name in files:
            if name == "__init__.py":
                continue
            depth = name.count(os.sep)  # 0 for a module of the package, 1 in a feature folder
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                tree = ast.parse(f.read(), name)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    package = (node.level == depth + 1 and node.module is None) or \
                        (node.level == 0 and node.module == "tensortap")
                    names = [a.name for a in node.names if a.name not in submodules] if package else []
                    if node.level > depth + 1 or names:
                        found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
                elif isinstance(node, ast.Import) and any(a.name == "tensortap" for a in node.names):
                    found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
        self.assertEqual(found, [])

    def test_the_old_module_paths_warn_once_and_work(self):
        # report, diff_page, summary and frames looked public: they moved
        # into private folders and their old paths stay for one release.
        code = ("import warnings, sys\n"
                "warnings.simplefilter('always')\n"
                "with warnings.catch_warnings(record=True) as w:\n"
                "    from tensortap.summary import check\n"
                "    import tensortap.report, tensortap.diff_page, tensortap.frames\n"
                "    import tensortap.summary\n"
                "    from tensortap.diff_page import Collector\n"
                "from tensortap._views import summary\n"
                "assert check is summary.check and tensortap.report.write_report and Collector\n"
                "print(sorted(str(x.message).split()[0] for x in w if x.category is DeprecationWarning))\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(tensortap.__file__))})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), str(sorted(["tensortap.summary", "tensortap.report", "tensortap.diff_page",
                                                          "tensortap.frames"])))

    def test_the_public_names_are_tensortaps(self):
        for name in ("open", "Run", "diff", "doctor", "RunError", "RunWarning"):
            self.assertEqual(getattr(tensortap, name).__module__, "tensortap", name)


if __name__ == "__main__":
    unittest.main(verbosity=2)
