"""The reader on runs whose disk budget gave up its oldest steps
(Options::max_bytes(n).on_budget(Budget::KeepLatest)), built by hand here (no
C++ build needed): the index in segments (index.jsonl, index.<n>.jsonl, any
of them deleted), run.json's marker "budget": {"given_up_below": k}, the
dumped steps it keeps, the states a crash leaves between the marker and the
deletions, and what inspect, diff and tensorboard say of them.

    PYTHONPATH=python /usr/bin/python3 tests/python/test_keep_latest.py
"""

import contextlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import warnings
from unittest import mock

import numpy as np

import tensortap
from tensortap import __main__ as cli
from tensortap import _index, _names
from tensortap._views import summary
from tensortap._writer import index_line
from test_reader_hostile import open_run  # this folder: the script's own

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")


def value(step, name="w"):
    return np.full((2, 3), step + (0.5 if name != "w" else 0), np.float32)


def segment_name(n):
    return "index.jsonl" if n == 0 else f"index.{n}.jsonl"


def npy_file(step, name="w"):
    return f"npy/grad/{name}/{step:08d}.npy"


def make_run(path, segments, k=None, dumps=None, closed=True, names=("w",), rank=None, world=1, budget=None):
    """A Format::Npy run in `path`: index segment n ({n: [steps]}) holds a
    record of each of `names` per step, in the writer's exact line form, and
    each record's .npy file; run.json with the marker `k` (unless None) and,
    closed, the `dumps` (dicts), else dumps.jsonl of them. Returns path."""
    os.makedirs(path, exist_ok=True)
    for n, steps in segments.items():
        with open(os.path.join(path, segment_name(n)), "w") as f:
            for step in steps:
                for name in names:
                    os.makedirs(os.path.join(path, "npy", "grad", name), exist_ok=True)
                    np.save(os.path.join(path, npy_file(step, name)), value(step, name))
                    f.write(index_line(step, "grad", name, "float32", (2, 3), npy_file(step, name)))
    write_info(path, k, dumps, closed, rank, world, budget)
    return path


def write_info(path, k=None, dumps=None, closed=True, rank=None, world=1, budget=None):
    info = {"format_version": 1, "closed": closed, "options": {"format": "npy"}, "rank": rank or 0,
            "world_size": world}
    if budget is None:
        budget = {"max_bytes": 1 << 20, "policy": "keep_latest", "reached_at_step": 9}
        if k is not None:
            budget["given_up_below"] = k
    info["budget"] = budget
    if dumps is not None and closed:
        info["dumps"] = dumps
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump(info, f)
    if dumps is not None and not closed:
        with open(os.path.join(path, "dumps.jsonl"), "w") as f:
            f.writelines(json.dumps(d) + "\n" for d in dumps)


def packed_file(seg):
    return f"packed/{seg:08d}.npys"


def make_packed_run(path, segments, index_segment, k=None, dumps=None, closed=True):
    """A Format::Packed run in `path`: packed segment n ({n: [steps]}) holds
    an image of "w" per step, each indexed in index segment
    index_segment(step); run.json as make_run's. Returns path."""
    os.makedirs(os.path.join(path, "packed"), exist_ok=True)
    lines = {}  # index segment: lines
    for seg, steps in segments.items():
        rel = packed_file(seg)
        with open(os.path.join(path, rel), "wb") as f:
            for s in steps:
                offset = -(-f.tell() // 64) * 64
                f.write(b"\0" * (offset - f.tell()))
                image = io.BytesIO()
                np.save(image, value(s), allow_pickle=False)
                f.write(image.getvalue())
                line = index_line(s, "grad", "w", "float32", (2, 3), rel)
                lines.setdefault(index_segment(s), []).append(
                    line[:-2] + f',"offset":{offset},"nbytes":{len(image.getvalue())}}}\n')
    for n, text in lines.items():
        with open(os.path.join(path, segment_name(n)), "w") as f:
            f.writelines(text)
    write_info(path, k=k, dumps=dumps, closed=closed)
    with open(os.path.join(path, "run.json")) as f:
        info = json.load(f)
    info["options"]["format"] = "packed"
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump(info, f)
    return path


def dump(step, steps):
    return {"step": step, "reason": "user", "steps": steps}


def command(*args):
    """(exit status, stdout, stderr) of the command line, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        rc = cli.main(list(args))
    return rc, out.getvalue(), err.getvalue()


def have(module):
    return importlib.util.find_spec(module) is not None


def steps_of(run, name="w", rank=None):
    return run.steps(name, kind="grad", rank=rank)


class TempCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-keep-latest-")
        self.run_dir = os.path.join(self.tmp, "run")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def assert_no_fifo_opened(self):
        """Fails, instead of hanging, if a FIFO is opened for reading."""
        previous = signal.signal(signal.SIGALRM, lambda *_: self.fail("the reader opened a FIFO"))
        signal.alarm(5)
        self.addCleanup(signal.signal, signal.SIGALRM, previous)
        self.addCleanup(signal.alarm, 0)


class SegmentTest(TempCase):
    def test_segments_are_read_in_the_order_of_their_numbers(self):
        # Text order would put index.10.jsonl before index.2.jsonl and index.9.jsonl.
        make_run(self.run_dir, {0: [0, 1], 2: [2, 3], 9: [4], 10: [5, 6]})
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        self.assertEqual([r["step"] for r in run.records], [0, 1, 2, 3, 4, 5, 6])
        # Each record names its own segment and its line in it.
        where = [(os.path.basename(r.index), r.lineno) for r in run.records]
        self.assertEqual(where, [("index.jsonl", 1), ("index.jsonl", 2), ("index.2.jsonl", 1),
                                 ("index.2.jsonl", 2), ("index.9.jsonl", 1), ("index.10.jsonl", 1),
                                 ("index.10.jsonl", 2)])
        self.assertEqual(steps_of(run), list(range(7)))
        np.testing.assert_array_equal(run.series("w", kind="grad"), np.stack([value(s) for s in range(7)]))
        np.testing.assert_array_equal(run.load("w", 5, kind="grad"), value(5))
        self.assertEqual(run.given_up_below, {})
        self.assertEqual(run.given_up_records, {})

    def test_an_index_that_grew_past_its_capacity_while_read(self):
        # A live run's segments grow between the listing (the columns sized
        # from their bytes) and the reading: the columns grow, and finish()
        # still cuts them to size (np.resize's views could not be).
        from tensortap import _index
        make_run(self.run_dir, {0: list(range(40)), 1: list(range(40, 50))})
        index = _index.Index(7, [(os.path.join(self.run_dir, "index.jsonl"), self.run_dir, None)],
                             [(os.path.join(self.run_dir, "index.jsonl"), 0),
                              (os.path.join(self.run_dir, "index.1.jsonl"), 0)])
        index.read(0)
        index.read(1)
        index.finish()
        self.assertEqual(index.step.tolist(), list(range(50)))

    def test_a_step_indexed_in_two_segments_reads_as_its_last_line(self):
        make_run(self.run_dir, {0: [0, 1], 1: [1, 2]})
        run, _ = open_run(self.run_dir)
        self.assertEqual(steps_of(run), [0, 1, 2])
        self.assertEqual(len(run.series("w", kind="grad")), 3)

    def test_no_index_jsonl(self):
        # The recorder deleted segment 0 (every step of it given up).
        make_run(self.run_dir, {7: [7], 8: [8, 9]}, k=7)
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        self.assertEqual(steps_of(run), [7, 8, 9])
        self.assertEqual(run.given_up_records, {None: 0})

    def test_names_that_only_look_like_segments_are_not_read(self):
        make_run(self.run_dir, {0: [0], 1: [1]})
        decoys = ["index.01.jsonl", "index.0.jsonl", "index.-1.jsonl", "index.1.jsonl.tmp", "index.x.jsonl",
                  "index.1234567890.jsonl", "index..jsonl", "index.1.json", "index.\u0661.jsonl", "index.+1.jsonl"]
        for step, name in enumerate(decoys, start=100):
            np.save(os.path.join(self.run_dir, npy_file(step)), value(step))
            with open(os.path.join(self.run_dir, name), "w") as f:
                f.write(index_line(step, "grad", "w", "float32", (2, 3), npy_file(step)))
            self.assertFalse(_names.is_run_file_name(name), name)
        with open(os.path.join(self.run_dir, ".index.1.jsonl.room"), "wb") as f:
            f.write(b"\0" * 64)
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        self.assertEqual(steps_of(run), [0, 1])

    def test_segment_names(self):
        for name, n in (("index.1.jsonl", 1), ("index.10.jsonl", 10), ("index.999999999.jsonl", 999999999)):
            self.assertEqual(_names.index_segment_number(name), n)
            self.assertTrue(_names.is_index_segment_name(name))
            self.assertTrue(_names.is_run_file_name(name))
            self.assertTrue(_names.is_run_file_name(_names.ballast_name(name)))
        for name in ("index.jsonl", "index.0.jsonl", "index.01.jsonl", "index.1000000000.jsonl", "index.-1.jsonl",
                     "index.1.jsonl.tmp", "index.x.jsonl", "index. 1.jsonl", "xindex.1.jsonl"):
            self.assertIsNone(_names.index_segment_number(name), name)
        for name in (".index.0.jsonl.room", ".index.01.jsonl.room", "index.1.jsonl.room", ".index.1.jsonl",
                     ".index.1.jsonl.room.tmp"):
            self.assertFalse(_names.is_run_file_name(name), name)

    def test_a_bad_line_is_named_by_its_segment(self):
        make_run(self.run_dir, {0: [0], 3: [1, 2]})
        path = os.path.join(self.run_dir, "index.3.jsonl")
        with open(path) as f:
            lines = f.readlines()
        with open(path, "w") as f:
            f.writelines([lines[0], "{not json\n", lines[1]])
        run, warned = open_run(self.run_dir)
        self.assertEqual(len(warned), 1)
        self.assertTrue(warned[0].startswith(path + ":2: skipped"), warned)
        self.assertEqual([(r["step"], os.path.basename(r.index), r.lineno) for r in run.records],
                         [(0, "index.jsonl", 1), (1, "index.3.jsonl", 1), (2, "index.3.jsonl", 3)])

    def test_a_segment_deleted_between_listing_and_opening_holds_no_records(self):
        make_run(self.run_dir, {0: [0], 1: [1]})
        listed = _index.segments
        gone = os.path.join(self.run_dir, "index.2.jsonl")
        with mock.patch.object(_index, "segments", lambda d: listed(d) + [gone]):
            run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        self.assertEqual(steps_of(run), [0, 1])

    def test_planted_segments_are_refused_as_a_planted_index(self):
        outside = os.path.join(self.tmp, "outside.jsonl")
        np.save(os.path.join(self.tmp, "x.npy"), value(99))
        with open(outside, "w") as f:
            f.write(index_line(99, "grad", "w", "float32", (2, 3), "../x.npy"))

        def plant(how):
            shutil.rmtree(self.run_dir, ignore_errors=True)
            make_run(self.run_dir, {0: [0]})
            how(os.path.join(self.run_dir, "index.1.jsonl"))

        for how, why in ((lambda p: os.symlink(outside, p), "a symbolic link"),
                         (lambda p: os.symlink("index.jsonl", p), "a symbolic link"),
                         (os.mkfifo, "not a regular file"),
                         (os.mkdir, "not a regular file")):
            with self.subTest(why=why):
                plant(how)
                self.assert_no_fifo_opened()
                with self.assertRaises(tensortap.RunError) as cm:
                    tensortap.open(self.run_dir)
                self.assertIn(os.path.join(self.run_dir, "index.1.jsonl"), str(cm.exception))
                self.assertIn(why, str(cm.exception))
                rc, out, err = command("inspect", self.run_dir)
                self.assertEqual(rc, 2)
                self.assertIn("index.1.jsonl", err)
                self.assertNotIn("Traceback", err)

    def test_inspect_notes_the_room_a_segment_keeps(self):
        make_run(self.run_dir, {0: [0], 4: [1]})
        with open(os.path.join(self.run_dir, ".index.4.jsonl.room"), "wb") as f:
            f.write(b"\0" * 100)
        rc, out, _ = command("inspect", self.run_dir, "--check")
        self.assertEqual(rc, 0, out)
        self.assertIn(".index.4.jsonl.room: 100 bytes kept for index.4.jsonl's lines", out)


class MarkerTest(TempCase):
    def assert_shown(self, run, steps, name="w", rank=None):
        self.assertEqual(steps_of(run, name, rank), steps)
        for s in steps:
            np.testing.assert_array_equal(run.load(name, s, kind="grad", rank=rank), value(s, name))

    def test_the_marker_hides_the_steps_below_it(self):
        make_run(self.run_dir, {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}, k=4, names=("w", "b"))
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        self.assertEqual(run.given_up_below, {None: 4})
        self.assertEqual(run.given_up_records, {None: 8})
        self.assertEqual(len(run.records), 8)
        self.assertTrue(all(r["step"] >= 4 for r in run.records))
        self.assert_shown(run, [4, 5, 6, 7])
        self.assert_shown(run, [4, 5, 6, 7], "b")
        with self.assertRaises(KeyError):
            run.load("w", 2, kind="grad")
        self.assertEqual(run.series("w", kind="grad").shape, (4, 2, 3))
        # The frames, where their packages are there.
        if have("dask"):
            self.assertEqual(run.series("w", kind="grad", lazy=True).compute().shape, (4, 2, 3))
        if have("pandas"):
            self.assertEqual(sorted(set(run.index_frame()["step"].tolist())), [4, 5, 6, 7])
        if have("xarray"):
            self.assertEqual(run.to_xarray("grad")["w"].shape, (4, 2, 3))

    def test_a_name_all_of_whose_records_were_given_up_is_gone(self):
        make_run(self.run_dir, {0: [0, 1]}, names=("old",))
        os.makedirs(os.path.join(self.run_dir, "npy", "grad", "w"))
        with open(os.path.join(self.run_dir, "index.1.jsonl"), "w") as f:
            for s in (2, 3):
                np.save(os.path.join(self.run_dir, npy_file(s)), value(s))
                f.write(index_line(s, "grad", "w", "float32", (2, 3), npy_file(s)))
        write_info(self.run_dir, k=2)
        run, _ = open_run(self.run_dir)
        self.assertEqual(run.names(), ["w"])

    def test_dumped_steps_below_the_marker_are_kept(self):
        # While the run goes on (or after a crash): dumps.jsonl; closed: run.json's "dumps".
        for closed in (False, True):
            with self.subTest(closed=closed):
                shutil.rmtree(self.run_dir, ignore_errors=True)
                make_run(self.run_dir, {0: [0, 1, 2, 3], 1: [4, 5]}, k=4, closed=closed,
                         dumps=[dump(2, [1, 2])])
                run, warned = open_run(self.run_dir)
                self.assertEqual(warned, [])
                self.assert_shown(run, [1, 2, 4, 5])
                self.assertEqual(run.given_up_records, {None: 2})
                rc, out, _ = command("inspect", self.run_dir, "--check")
                self.assertEqual(rc, 0, out)
                self.assertIn("steps below 4 given up: 2 indexed records hidden; steps 1, 2 kept: dumped", out)
                self.assertIn("check: 4 records, 0 problems", out)

    def test_a_dumped_step_whose_file_is_gone_is_hidden(self):
        make_run(self.run_dir, {0: [0, 1, 2, 3], 1: [4, 5]}, k=4, dumps=[dump(2, [1, 2])], names=("w", "b"))
        os.remove(os.path.join(self.run_dir, npy_file(1, "w")))
        run, _ = open_run(self.run_dir)
        self.assert_shown(run, [2, 4, 5])
        self.assert_shown(run, [1, 2, 4, 5], "b")
        self.assertEqual(run.given_up_records, {None: 5})
        rc, out, _ = command("inspect", self.run_dir, "--check")
        self.assertEqual(rc, 0, out)
        self.assertIn("check: 7 records, 0 problems", out)

    def test_the_states_a_crash_leaves(self):
        def files(steps):
            return [os.path.join(self.run_dir, npy_file(s)) for s in steps]

        cases = {
            # The marker written, nothing deleted yet: files and lines there.
            "nothing deleted": lambda: None,
            # Some files deleted, their index lines still there.
            "files deleted": lambda: [os.remove(p) for p in files([0, 1, 2])],
            # Every file deleted, the segment too.
            "segment deleted": lambda: (os.remove(os.path.join(self.run_dir, "index.jsonl")),
                                        [os.remove(p) for p in files([0, 1, 2, 3])]),
            # The segment deleted, the data files not yet.
            "segment deleted, files there": lambda: os.remove(os.path.join(self.run_dir, "index.jsonl")),
        }
        for what, crash in cases.items():
            with self.subTest(what):
                shutil.rmtree(self.run_dir, ignore_errors=True)
                make_run(self.run_dir, {0: [0, 1, 2, 3], 1: [4, 5]}, k=4, closed=False)
                crash()
                run, warned = open_run(self.run_dir)
                self.assertEqual(warned, [])
                self.assert_shown(run, [4, 5])
                rc, out, _ = command("inspect", self.run_dir, "--check")
                self.assertEqual(rc, 0, out)
                self.assertIn("check: 2 records, 0 problems", out)

    def test_markers_that_are_not_steps_are_refused(self):
        for bad, text in ((True, "true"), ("5", '"5"'), (1.5, "1.5"), (-1, "-1"), (2 ** 70, str(2 ** 70)),
                          ([3], "an array")):
            with self.subTest(bad=bad):
                shutil.rmtree(self.run_dir, ignore_errors=True)
                make_run(self.run_dir, {0: [0, 1], 1: [2, 3]}, k=bad)
                run, warned = open_run(self.run_dir)
                self.assertEqual(len(warned), 1, warned)
                self.assertIn(os.path.join(self.run_dir, "run.json"), warned[0])
                self.assertIn(f'"given_up_below" is {text}, not a step', warned[0])
                self.assertEqual(run.given_up_below, {})
                self.assertEqual(run.given_up_records, {})
                self.assert_shown(run, [0, 1, 2, 3])
                rc, out, err = command("inspect", self.run_dir)
                self.assertEqual(rc, 0)
                self.assertIn("ignored: not a step", out)
                self.assertIn("given_up_below", err)

    def test_no_marker_and_a_null_one_show_everything(self):
        for budget in ({"max_bytes": 100, "policy": "keep_latest", "reached_at_step": None},
                       {"max_bytes": 100, "policy": "keep_latest", "reached_at_step": 3, "given_up_below": None},
                       "not an object"):
            with self.subTest(budget=budget):
                shutil.rmtree(self.run_dir, ignore_errors=True)
                make_run(self.run_dir, {0: [0, 1]}, budget=budget)
                run, warned = open_run(self.run_dir)
                self.assertEqual((warned, run.given_up_below), ([], {}))
                self.assertEqual(steps_of(run), [0, 1])

    def test_a_packed_run_whose_first_segment_was_deleted(self):
        make_packed_run(self.run_dir, {0: [0, 1], 1: [2, 3], 2: [4]}, lambda s: 0 if s < 3 else 1, k=2,
                        dumps=[dump(1, [1])])
        os.remove(os.path.join(self.run_dir, packed_file(0)))
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        # Step 1 was dumped, but its packed segment is gone: hidden too.
        self.assert_shown(run, [2, 3, 4])
        self.assertEqual(run.given_up_records, {None: 2})
        np.testing.assert_array_equal(run.series("w", kind="grad"), np.stack([value(s) for s in (2, 3, 4)]))
        rc, out, _ = command("inspect", self.run_dir, "--check")
        self.assertEqual(rc, 0, out)
        self.assertIn("check: 3 records, 0 problems", out)

    def test_each_rank_has_its_own_marker(self):
        make_run(os.path.join(self.run_dir, "rank0"), {0: [0, 1, 2], 1: [3, 4, 5]}, k=2, rank=0, world=2)
        make_run(os.path.join(self.run_dir, "rank1"), {0: [0, 1, 2], 2: [3, 4, 5]}, k=4, rank=1, world=2,
                 dumps=[dump(1, [0, 1])])
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        self.assertEqual(run.given_up_below, {0: 2, 1: 4})
        self.assertEqual(run.given_up_records, {0: 2, 1: 2})
        self.assert_shown(run, [2, 3, 4, 5], rank=0)
        self.assert_shown(run, [0, 1, 4, 5], rank=1)
        self.assertEqual(steps_of(run), [0, 1, 2, 3, 4, 5])
        self.assertEqual([(r["rank"], r["step"], os.path.basename(r.index)) for r in run.records][-3:],
                         [(1, 1, "index.jsonl"), (1, 4, "index.2.jsonl"), (1, 5, "index.2.jsonl")])
        rc, out, _ = command("inspect", self.run_dir, "--check")
        self.assertEqual(rc, 0, out)
        self.assertIn("rank 0: disk budget 1.0 MiB (keep_latest): reached at step 9, steps below 2 given up: "
                      "2 indexed records hidden\n", out)
        self.assertIn("rank 1: disk budget 1.0 MiB (keep_latest): reached at step 9, steps below 4 given up: "
                      "2 indexed records hidden; steps 0, 1 kept: dumped\n", out)
        self.assertIn("check: 8 records, 0 problems", out)


class GivenUpSinceOpenedTest(TempCase):
    """A Run opened on a live run is a snapshot: the recorder may give up a
    step it lists afterwards (marker rewritten, files deleted). Reading such
    a record raises GivenUpError, which says so; any other missing file
    keeps its own error."""

    DUMPS = [dump(1, [1])]

    def give_up(self, k, path=None, deleted=None, dumps=DUMPS, rank=None, world=1):
        """What the recorder does: the marker first (run.json rewritten),
        then the files of the steps below it, but the dumped ones."""
        path = path or self.run_dir
        write_info(path, k=k, dumps=dumps, closed=False, rank=rank, world=world)
        kept = {s for d in dumps or [] for s in d["steps"]}
        for s in deleted if deleted is not None else range(k):
            if s not in kept:
                os.remove(os.path.join(path, npy_file(s)))

    def open_live(self, **kw):
        make_run(self.run_dir, {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}, closed=False, dumps=self.DUMPS, **kw)
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        self.assertEqual(steps_of(run), list(range(8)))
        return run

    def assert_given_up(self, cm, step, k, where=None, rank=None):
        e = cm.exception
        self.assertIsInstance(e, tensortap.GivenUpError)
        self.assertIsInstance(e, tensortap.RunError)
        self.assertEqual((e.kind, e.name, e.step, e.rank, e.given_up_below), ("grad", "w", step, rank, k))
        self.assertEqual(str(e), f"{where or self.run_dir}: grad 'w' step {step} was given up by the run's disk "
                                 f"budget after this Run was opened (run.json's given_up_below is now {k}, "
                                 "Budget::KeepLatest); open the run again")

    def test_load_of_a_step_given_up_after_opening(self):
        run = self.open_live()
        self.give_up(4)
        for mmap in (True, False):
            with self.subTest(mmap=mmap):
                with self.assertRaises(tensortap.GivenUpError) as cm:
                    run.load("w", 2, kind="grad", mmap=mmap)
                self.assert_given_up(cm, 2, 4)
        # The steps still there read as ever, the dumped one too.
        for s in (1, 4, 7):
            np.testing.assert_array_equal(run.load("w", s, kind="grad"), value(s))
        # Opened again: the step is gone from the run, not an error.
        again, _ = open_run(self.run_dir)
        self.assertEqual(steps_of(again), [1, 4, 5, 6, 7])

    def test_a_dumped_steps_file_deleted_is_not_given_up(self):
        run = self.open_live()
        self.give_up(4)
        os.remove(os.path.join(self.run_dir, npy_file(1)))  # a dump keeps step 1: not the budget's doing
        with self.assertRaises(FileNotFoundError):
            run.load("w", 1, kind="grad")

    def test_a_dump_made_after_opening_keeps_its_step(self):
        run = self.open_live()
        self.give_up(4, dumps=self.DUMPS + [dump(3, [2, 3])])
        os.remove(os.path.join(self.run_dir, npy_file(2)))  # dumped: not the budget's doing
        with self.assertRaises(FileNotFoundError):
            run.load("w", 2, kind="grad")
        with self.assertRaises(tensortap.GivenUpError):
            run.load("w", 0, kind="grad")

    def test_a_file_missing_above_the_marker_keeps_its_error(self):
        run = self.open_live()
        self.give_up(4)
        os.remove(os.path.join(self.run_dir, npy_file(5)))
        with self.assertRaises(FileNotFoundError) as cm:
            run.load("w", 5, kind="grad")
        self.assertNotIsInstance(cm.exception, tensortap.RunError)
        # And without any marker: nothing was given up.
        shutil.rmtree(self.run_dir)
        run = self.open_live()
        os.remove(os.path.join(self.run_dir, npy_file(2)))
        with self.assertRaises(FileNotFoundError):
            run.load("w", 2, kind="grad")

    def test_a_run_json_that_cannot_be_read_keeps_the_error(self):
        # Damaged, or not a marker that is a step: the missing file's error.
        for text in ("{not json", json.dumps({"budget": {"given_up_below": "4"}}), "[]"):
            with self.subTest(text=text):
                shutil.rmtree(self.run_dir, ignore_errors=True)
                run = self.open_live()
                self.give_up(4)
                with open(os.path.join(self.run_dir, "run.json"), "w") as f:
                    f.write(text)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    with self.assertRaises(FileNotFoundError):
                        run.load("w", 2, kind="grad")
                self.assertEqual([str(w.message) for w in caught], [])

    def test_series_of_a_name_whose_early_steps_were_given_up(self):
        run = self.open_live()
        self.give_up(4)
        with self.assertRaises(tensortap.GivenUpError) as cm:
            run.series("w", kind="grad")
        self.assert_given_up(cm, 0, 4)
        if have("dask"):
            with self.assertRaises(tensortap.GivenUpError) as cm:
                run.series("w", kind="grad", lazy=True).compute(scheduler="sync")
            self.assert_given_up(cm, 0, 4)
        if have("xarray") and have("dask"):
            with self.assertRaises(tensortap.GivenUpError):
                run.to_xarray("grad", lazy=True).compute(scheduler="sync")
        # A series whose records are all still there reads as ever.
        shutil.rmtree(self.run_dir)
        run = self.open_live()
        self.give_up(4, deleted=[])
        self.assertEqual(run.series("w", kind="grad").shape, (8, 2, 3))

    def test_records_read_one_by_one(self):
        run = self.open_live()
        self.give_up(4)
        failed = {}
        for rec in run.records:
            try:
                run._read(rec, mmap=True)
            except tensortap.GivenUpError as e:
                failed[rec["step"]] = e.given_up_below
        self.assertEqual(failed, {0: 4, 2: 4, 3: 4})

    def test_a_packed_run_whose_segment_was_deleted_after_opening(self):
        make_packed_run(self.run_dir, {0: [0, 1], 1: [2, 3], 2: [4, 5]}, lambda s: 0 if s < 2 else 1,
                        closed=False)
        run, warned = open_run(self.run_dir)
        self.assertEqual(warned, [])
        # The recorder gives up steps below 2: packed segment 0 and index segment 0.
        write_info(self.run_dir, k=2, closed=False)
        self.set_format("packed")
        os.remove(os.path.join(self.run_dir, packed_file(0)))
        os.remove(os.path.join(self.run_dir, "index.jsonl"))
        for mmap in (True, False):
            with self.assertRaises(tensortap.GivenUpError) as cm:
                run.load("w", 1, kind="grad", mmap=mmap)
            self.assert_given_up(cm, 1, 2)
        with self.assertRaises(tensortap.GivenUpError) as cm:
            run.series("w", kind="grad")
        self.assert_given_up(cm, 0, 2)
        np.testing.assert_array_equal(run.load("w", 3, kind="grad"), value(3))
        # A segment of steps above the marker deleted: its own error.
        os.remove(os.path.join(self.run_dir, packed_file(2)))
        with self.assertRaises(FileNotFoundError) as cm2:
            run.load("w", 4, kind="grad")
        self.assertNotIsInstance(cm2.exception, tensortap.GivenUpError)
        out = io.StringIO()
        self.assertEqual(summary.check(run, out), 2, out.getvalue())  # steps 4 and 5
        self.assertIn("note: 2 records (steps 0, 1) given up since the check began", out.getvalue())

    def set_format(self, fmt):
        path = os.path.join(self.run_dir, "run.json")
        with open(path) as f:
            info = json.load(f)
        info["options"]["format"] = fmt
        with open(path, "w") as f:
            json.dump(info, f)

    def test_each_rank_is_looked_up_in_its_own_run_json(self):
        rank0, rank1 = os.path.join(self.run_dir, "rank0"), os.path.join(self.run_dir, "rank1")
        make_run(rank0, {0: [0, 1, 2, 3]}, closed=False, rank=0, world=2)
        make_run(rank1, {0: [0, 1, 2, 3]}, closed=False, rank=1, world=2)
        run, _ = open_run(self.run_dir)
        self.give_up(2, path=rank1, dumps=None, rank=1, world=2)
        os.remove(os.path.join(rank0, npy_file(0)))  # rank 0 gave nothing up: another failure
        with self.assertRaises(tensortap.GivenUpError) as cm:
            run.load("w", 1, kind="grad", rank=1)
        self.assert_given_up(cm, 1, 2, where=rank1, rank=1)
        with self.assertRaises(FileNotFoundError):
            run.load("w", 0, kind="grad", rank=0)
        with self.assertRaises(tensortap.GivenUpError):
            run.series("w", kind="grad", rank=1)
        out = io.StringIO()
        self.assertEqual(summary.check(run, out), 1, out.getvalue())  # rank 0's step 0
        self.assertIn("note: rank 1: 2 records (steps 0, 1) given up since the check began (the disk budget, "
                      "Budget::KeepLatest: run.json's given_up_below is now 2); not read, not a problem",
                      out.getvalue())

    def test_check_notes_records_given_up_since_it_began(self):
        run = self.open_live(names=("w", "b"))
        self.give_up(4, deleted=[])
        for s in (0, 2, 3):
            for name in ("w", "b"):
                os.remove(os.path.join(self.run_dir, npy_file(s, name)))
        out = io.StringIO()
        problems = summary.check(run, out)
        self.assertEqual(problems, 0, out.getvalue())
        text = out.getvalue()
        self.assertNotIn("BAD", text)
        self.assertIn("  note: 6 records (steps 0, 2, 3) given up since the check began (the disk budget, "
                      "Budget::KeepLatest: run.json's given_up_below is now 4); not read, not a problem\n", text)
        self.assertIn("check: 16 records, 0 problems", text)
        # A dumped step's file gone is still a problem.
        os.remove(os.path.join(self.run_dir, npy_file(1)))
        out = io.StringIO()
        self.assertEqual(summary.check(run, out), 1)
        self.assertIn("BAD grad 'w' step 1: cannot read", out.getvalue())

    def test_the_diff_says_a_record_was_given_up(self):
        from tensortap._diff import compare as _diff

        a = make_run(os.path.join(self.tmp, "a"), {0: [0, 1, 2, 3, 4, 5, 6, 7]})
        run_a, _ = open_run(a)
        run_b = self.open_live()
        self.give_up(4)
        side = _diff._Side(run_b, "B")
        pos = [i for i, r in enumerate(run_b.records) if r["step"] in (2, 5)]
        with self.assertRaises(tensortap.GivenUpError) as cm:
            side.read(pos[0])
        self.assertTrue(str(cm.exception).startswith(f"B: {self.run_dir}: grad 'w' step 2 was given up"),
                        str(cm.exception))
        self.assertEqual(side.read(pos[1]).shape, (2, 3))
        os.remove(os.path.join(self.run_dir, npy_file(5)))
        with self.assertRaises(tensortap.RunError) as cm2:
            side.read(pos[1])
        self.assertNotIsInstance(cm2.exception, tensortap.GivenUpError)
        self.assertIn("cannot be read from", str(cm2.exception))
        if have("pandas"):
            df = tensortap.diff(run_a, run_b)
            self.assertEqual(sorted(df.loc[df["status"] == "unreadable", "step"].tolist()), [0, 2, 3, 5])

    def test_the_error_pickles_with_its_fields(self):
        import pickle

        e = tensortap.GivenUpError("m", "grad", "w", 3, 1, 4)
        back = pickle.loads(pickle.dumps(e))
        self.assertIs(type(back), tensortap.GivenUpError)
        self.assertEqual((str(back), back.kind, back.name, back.step, back.rank, back.given_up_below),
                         ("m", "grad", "w", 3, 1, 4))
        self.assertIn("GivenUpError", tensortap.__all__)


class CommandTest(TempCase):
    def test_inspect_through_python_m(self):
        make_run(self.run_dir, {0: [0, 1, 2], 1: [3, 4]}, k=3, closed=False, dumps=[dump(0, [0])])
        os.remove(os.path.join(self.run_dir, npy_file(1)))
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        p = subprocess.run([sys.executable, "-m", "tensortap", "inspect", self.run_dir, "--check"], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("disk budget 1.0 MiB (keep_latest): reached at step 9, steps below 3 given up: "
                      "2 indexed records hidden; step 0 kept: dumped", p.stdout)
        self.assertIn("grad  w     3      0..4", p.stdout)
        self.assertIn("check: 3 records, 0 problems", p.stdout)
        self.assertEqual(p.stderr, "")

    def test_diff_says_what_a_run_gave_up(self):
        a = make_run(os.path.join(self.tmp, "a"), {0: [0, 1, 2, 3, 4, 5]})
        b = make_run(os.path.join(self.tmp, "b"), {0: [0, 1, 2, 3], 1: [4, 5]}, k=4, dumps=[dump(1, [1])])
        rc, out, err = command("diff", a, b)
        self.assertEqual(rc, 0, out + err)
        lines = out.splitlines()
        self.assertEqual(lines[0], "note: B gave up steps below 4 (disk budget, KeepLatest): compared from there, "
                                   "and at the steps it dumped")
        self.assertIn("given up by B: 3 records of A, of steps B's disk budget gave up (not counted as only in A)",
                      lines)
        self.assertEqual(lines[-1], "compared 3, differ 0, only in A 0, only in B 0")
        # The other way round: B is the reference.
        rc, out, _ = command("diff", b, a)
        self.assertEqual(rc, 0, out)
        self.assertTrue(out.startswith("note: A gave up steps below 4"), out)
        self.assertIn("given up by A: 3 records of B", out)
        # A record missing above the marker is still one side only.
        os.remove(os.path.join(self.tmp, "b", "index.1.jsonl"))
        rc, out, _ = command("diff", a, b)
        self.assertEqual(rc, 1, out)
        self.assertIn("only in A (2):", out)
        if not have("pandas"):
            return
        df = tensortap.diff(a, b)
        self.assertEqual(sorted(df.loc[df["status"] == "only_a", "step"].tolist()), [0, 2, 3, 4, 5])

    def test_tensorboard_export_of_a_run_with_steps_given_up(self):
        make_run(self.run_dir, {0: [0, 1, 2], 1: [3, 4]}, k=3)
        for s in (0, 1, 2):  # deleted: a given-up record must never be read
            os.remove(os.path.join(self.run_dir, npy_file(s)))
        logdir = os.path.join(self.tmp, "tb")
        rc, out, err = command("tensorboard", self.run_dir, "--logdir", logdir, "--histograms-every", "1")
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(err, "")
        self.assertIn("tensortap: wrote", out)

    def test_the_report_page_says_what_was_given_up(self):
        if not have("matplotlib"):
            self.skipTest("no matplotlib")
        make_run(self.run_dir, {0: [0, 1, 2], 1: [3, 4]}, k=3)
        for s in (0, 1):
            os.remove(os.path.join(self.run_dir, npy_file(s)))
        page = os.path.join(self.tmp, "report.html")
        rc, out, err = command("report", self.run_dir, "-o", page)
        self.assertEqual(rc, 0, out + err)
        with open(page, encoding="utf-8") as f:
            self.assertIn("steps below 3 given up: 3 indexed records hidden", f.read())


if __name__ == "__main__":
    unittest.main()
