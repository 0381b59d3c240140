"""The Python reader and `python3 -m tensortap inspect`, on the runs e2e_writer made.

    TT_E2E_DIR=build/tests/e2e PYTHONPATH=python python3 tests/python/test_reader.py
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import warnings

import numpy as np

import tensortap
from tensortap import __main__ as cli

E2E = os.environ.get("TT_E2E_DIR", "build/tests/e2e")
TRAIN = os.path.join(E2E, "train")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def inspect(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["inspect", *args])
    return rc, out.getvalue()


class TempCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-reader-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


class ReaderTest(TempCase):
    def test_names_kinds_steps(self):
        run = tensortap.open(TRAIN)
        self.assertTrue(run.closed)
        self.assertEqual(run.kinds(), ["activation", "activation_grad", "param", "grad", "tensor"])
        self.assertEqual(run.names("grad"), ["fc.bias", "fc.weight"])
        self.assertIn("probe", run.names())
        self.assertEqual(run.steps("fc.weight", kind="grad"), [0, 2, 4, 6, 8])
        with open(os.path.join(TRAIN, "index.jsonl")) as f:
            self.assertEqual(run.records, [json.loads(line) for line in f])

    def test_load_is_memory_mapped_and_series_stacks(self):
        run = tensortap.open(TRAIN)
        a = run.load("fc.weight", 4, kind="grad")
        self.assertIsInstance(a, np.memmap)
        b = run.load("fc.weight", 4, kind="grad", mmap=False)
        self.assertNotIsInstance(b, np.memmap)
        np.testing.assert_array_equal(a, b)
        s = run.series("fc.weight", kind="grad")
        self.assertEqual(s.shape, (5, 3, 5))
        np.testing.assert_array_equal(s[2], b)

    def test_kind_by_position_still_works_with_a_deprecation_warning(self):
        run = tensortap.open(TRAIN)
        for call, old, new in (
                ("steps", ("fc.weight", "grad"), dict(kind="grad")),
                ("load", ("fc.weight", 4, "grad"), dict(kind="grad")),
                ("series", ("fc.weight", "grad"), dict(kind="grad")),
                ("stats", ("fc.weight", "grad"), dict(kind="grad"))):
            method = getattr(run, call)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    got = method(*old)
                except tensortap.RunError:
                    got = None  # stats() of a run without statistics: the same either way
            self.assertEqual([w.category for w in caught], [DeprecationWarning], call)
            self.assertIn("kind='grad'", str(caught[0].message))
            want = None
            try:
                want = method(*old[:-1], **new)
            except tensortap.RunError:
                pass
            if isinstance(want, (np.ndarray, list)):
                np.testing.assert_array_equal(got, want)
            # The new spelling warns of nothing.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    method(*old[:-1], **new)
                except tensortap.RunError:
                    pass
            self.assertEqual(caught, [], call)
        with self.assertRaises(TypeError):
            run.steps("fc.weight", "grad", kind="grad")

    def test_clear_errors(self):
        run = tensortap.open(TRAIN)
        with self.assertRaisesRegex(KeyError, "no grad records of 'nope'.*fc.bias"):
            run.steps("nope", kind="grad")
        with self.assertRaisesRegex(KeyError, "at step 3"):
            run.load("fc.weight", 3, kind="grad")
        with self.assertRaisesRegex(tensortap.RunError, "unknown kind 'grads'"):
            run.steps("fc.weight", kind="grads")
        with self.assertRaisesRegex(tensortap.RunError, "not a tensortap run"):
            tensortap.open(self.tmp)

    def test_torn_last_index_line_is_skipped(self):
        run_dir = os.path.join(self.tmp, "run")
        shutil.copytree(TRAIN, run_dir)
        with open(os.path.join(run_dir, "index.jsonl"), "a") as f:
            f.write('{"step":10,"kind":"gr')  # a crash mid-append
        self.assertEqual(len(tensortap.open(run_dir).records), len(tensortap.open(TRAIN).records))
        with open(os.path.join(run_dir, "index.jsonl"), "a") as f:
            f.write('\n{"step":11}\n')  # now the broken line is in the middle
        # A torn line in the middle (a full disk, then more appends) costs
        # that line, not the run: it is skipped with a warning.
        with self.assertWarnsRegex(tensortap.RunWarning, r"index.jsonl:\d+: skipped: not a JSON line"):
            run = tensortap.open(run_dir)
        self.assertEqual(len(run.records), len(tensortap.open(TRAIN).records))

    def test_ranks_merge(self):
        for r in (0, 1):
            d = os.path.join(self.tmp, f"rank{r}")
            shutil.copytree(TRAIN, d)
            with open(os.path.join(d, "run.json")) as f:
                info = json.load(f)
            info.update(rank=r, world_size=2)
            with open(os.path.join(d, "run.json"), "w") as f:
                json.dump(info, f)
        # Rank 1's gradients are twice rank 0's.
        for rec in tensortap.open(os.path.join(self.tmp, "rank1")).records:
            if rec["kind"] == "grad":
                p = os.path.join(self.tmp, "rank1", rec["file"])
                np.save(p, np.load(p) * 2)
        run = tensortap.open(self.tmp)
        self.assertEqual(run.ranks, [0, 1])
        self.assertEqual(len(run.records), 2 * len(tensortap.open(TRAIN).records))
        s = run.series("fc.weight", kind="grad")
        self.assertEqual(s.shape, (2, 5, 3, 5))
        np.testing.assert_array_equal(s[1], 2 * s[0])
        np.testing.assert_array_equal(run.series("fc.weight", kind="grad", rank=1), s[1])
        np.testing.assert_array_equal(run.load("fc.weight", 2, kind="grad", rank=1), s[1][1])
        self.assertEqual(run.steps("fc.weight", kind="grad", rank=0), [0, 2, 4, 6, 8])
        one = tensortap.open(self.tmp, rank=1)
        self.assertEqual(one.ranks, [1])
        np.testing.assert_array_equal(one.series("fc.weight", kind="grad"), s[1][np.newaxis])
        with self.assertRaisesRegex(tensortap.RunError, "no rank 5"):
            tensortap.open(self.tmp, rank=5)

    def test_hdf5_layout(self):
        try:
            import h5py
        except ImportError:
            self.skipTest("h5py is not installed")
        # The layout DESIGN section 3 fixes for Format::Hdf5.
        g = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
        with h5py.File(os.path.join(self.tmp, "tensors.h5"), "w") as f:
            f["/grad/fc.weight/data"] = g
            f["/grad/fc.weight/steps"] = np.array([0, 10, 20], dtype=np.int64)
        with open(os.path.join(self.tmp, "run.json"), "w") as f:
            json.dump({"format_version": 1, "closed": True, "options": {"format": "hdf5"}}, f)
        with open(os.path.join(self.tmp, "index.jsonl"), "w") as f:
            for row, step in enumerate([0, 10, 20]):
                f.write(json.dumps({"step": step, "kind": "grad", "name": "fc.weight", "dtype": "float32",
                                    "shape": [2, 2], "file": "tensors.h5", "dataset": "/grad/fc.weight/data",
                                    "row": row}) + "\n")
        with tensortap.open(self.tmp) as run:
            np.testing.assert_array_equal(run.load("fc.weight", 10, kind="grad"), g[1])
            np.testing.assert_array_equal(run.series("fc.weight", kind="grad"), g)
            self.assertEqual(run.steps("fc.weight", kind="grad"), [0, 10, 20])
        rc, out = inspect(self.tmp, "--check")
        self.assertEqual(rc, 0, out)


class PackedTest(TempCase):
    """Format::Packed runs (e2e_writer's train_packed and dtypes_packed) hold
    the same tensors as their .npy twins."""

    def pairs(self, packed, npy):
        a, b = tensortap.open(os.path.join(E2E, packed)), tensortap.open(os.path.join(E2E, npy))
        self.assertEqual(a.info["options"]["format"], "packed")
        self.assertEqual(len(a.records), len(b.records))
        want = {(r["kind"], r["name"], r["step"]): r for r in b.records}
        for rec in a.records:
            yield a, b, rec, want[(rec["kind"], rec["name"], rec["step"])]

    def test_np_load_at_the_offset_is_the_tensor(self):
        for name in ("train", "dtypes"):
            files = set()
            for a, b, rec, twin in self.pairs(name + "_packed", name):
                with self.subTest(run=name, name=rec["name"], step=rec["step"]):
                    self.assertRegex(rec["file"], r"^packed/\d{8}\.npys$")
                    self.assertEqual(rec["offset"] % 64, 0)
                    files.add(rec["file"])
                    with open(os.path.join(a.path, rec["file"]), "rb") as f:
                        f.seek(rec["offset"])
                        got = np.load(f, allow_pickle=False)
                        self.assertEqual(f.tell(), rec["offset"] + rec["nbytes"])
                    want = np.load(os.path.join(b.path, twin["file"]), allow_pickle=False)
                    self.assertEqual(got.dtype, want.dtype)
                    np.testing.assert_array_equal(got, want)
            if name == "dtypes":
                self.assertGreater(len(files), 1)  # 4 KiB segments: several

    def test_images_are_what_np_save_writes(self):
        # bench/bench_reader_scale.py builds its packed run with np.save: the
        # same bytes as the C++ writer's, header padding included.
        for name in ("train_packed", "dtypes_packed"):
            with open(os.path.join(E2E, name, "index.jsonl")) as f:
                recs = [json.loads(line) for line in f]
            for rec in recs:
                with self.subTest(run=name, name=rec["name"], step=rec["step"]):
                    with open(os.path.join(E2E, name, rec["file"]), "rb") as f:
                        f.seek(rec["offset"])
                        written = f.read(rec["nbytes"])
                    b = io.BytesIO()
                    np.save(b, np.load(io.BytesIO(written), allow_pickle=False), allow_pickle=False)
                    self.assertEqual(b.getvalue(), written)

    def test_load_series_and_check(self):
        for name in ("train", "dtypes"):
            for a, b, rec, twin in self.pairs(name + "_packed", name):
                with self.subTest(run=name, name=rec["name"], step=rec["step"]):
                    for mmap in (True, False):
                        got = a.load(rec["name"], rec["step"], kind=rec["kind"], mmap=mmap)
                        want = b.load(rec["name"], rec["step"], kind=rec["kind"], mmap=False)
                        self.assertEqual(got.dtype, want.dtype)
                        np.testing.assert_array_equal(got, want)
        a, b = tensortap.open(os.path.join(E2E, "train_packed")), tensortap.open(TRAIN)
        self.assertIsInstance(a.load("fc.weight", 4, kind="grad"), np.memmap)
        np.testing.assert_array_equal(a.series("fc.weight", kind="grad"), b.series("fc.weight", kind="grad"))
        for name in ("train_packed", "dtypes_packed"):
            rc, out = inspect(os.path.join(E2E, name), "--check")
            self.assertEqual(rc, 0, out)

    def test_damaged_offsets_are_refused(self):
        src = os.path.join(E2E, "train_packed")
        run_dir = os.path.join(self.tmp, "run")
        shutil.copytree(src, run_dir)
        with open(os.path.join(run_dir, "index.jsonl")) as f:
            recs = [json.loads(line) for line in f]
        first = recs[0]
        size = os.path.getsize(os.path.join(run_dir, first["file"]))
        bad = [dict(first, step=1001, offset=size),                    # past the end
               dict(first, step=1002, nbytes=first["nbytes"] + 64),    # the image is not that long
               dict(first, step=1003, offset=first["offset"] + 64),    # not an image's start
               dict(first, step=1004, file="../../etc/passwd")]       # outside the run
        with open(os.path.join(run_dir, "index.jsonl"), "a") as f:
            for r in bad:
                f.write(json.dumps(r) + "\n")
        run = tensortap.open(run_dir)
        for r, why in zip(bad, ("past the end", "the index says", "not a .npy image", "refused path")):
            with self.subTest(step=r["step"]):
                with self.assertRaisesRegex(tensortap.RunError, why):
                    run.load(r["name"], r["step"], kind=r["kind"])
        rc, out = inspect(run_dir, "--check")
        self.assertNotEqual(rc, 0)
        self.assertIn("4 problems", out)


class CompactIndexTest(TempCase):
    """The index as columns (tensortap/_index.py) on what the C++ writer wrote."""

    RUNS = ("train", "dtypes", "train_packed", "dtypes_packed", "train_h5", "dtypes_h5", "shapes_h5")

    def test_every_line_the_writer_wrote_takes_the_fast_path(self):
        from unittest import mock

        from tensortap import _index

        for name in self.RUNS:
            path = os.path.join(E2E, name)
            if not os.path.isdir(path):
                continue  # HDF5 runs need a build with HDF5
            with self.subTest(run=name):
                with mock.patch.object(_index.Index, "_slow_lines", side_effect=AssertionError("a slow line")):
                    run = tensortap.open(path)
                with open(os.path.join(path, "index.jsonl")) as f:
                    want = [json.loads(line) for line in f]
                self.assertEqual(run.records, want)
                self.assertEqual([r.lineno for r in run.records], list(range(1, len(want) + 1)))
                # The same records read line by line, the way any other line is.
                with mock.patch.object(_index, "_LINE", _index.re.compile(rb"(?!)")):
                    self.assertEqual(tensortap.open(path).records, want)
                for kind in run.kinds():
                    for n in run.names(kind):
                        self.assertEqual(run.steps(n, kind=kind), sorted({r["step"] for r in want
                                                                     if (r["kind"], r["name"]) == (kind, n)}))

    def test_index_frame_of_a_packed_run(self):
        try:
            import pandas  # noqa: F401
        except ImportError:
            self.skipTest("pandas is not installed")
        run = tensortap.open(os.path.join(E2E, "dtypes_packed"))
        df = run.index_frame()
        self.assertEqual(len(df), len(run.records))
        for row, rec in zip(df.itertuples(index=False), run.records):
            self.assertEqual((row.step, row.kind, row.name, row.dtype, row.shape, row.file, row.offset, row.nbytes),
                             (rec["step"], rec["kind"], rec["name"], rec["dtype"], tuple(rec["shape"]), rec["file"],
                              rec["offset"], rec["nbytes"]))
            self.assertIsNone(row.dataset)
            self.assertIs(row.row, pandas.NA)


class InspectTest(TempCase):
    def test_summary_of_a_known_run(self):
        rc, out = inspect(TRAIN)
        self.assertEqual(rc, 0)
        n = len(tensortap.open(TRAIN).records)
        self.assertIn(f"closed cleanly: {n} records", out)
        self.assertIn("0 dropped, 0 errors", out)
        rows = {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines() if line.startswith("  ")}
        self.assertEqual(rows[("grad", "fc.weight")], ["5", "0..8", "(3,", "5)", "float32", "300", "B"])
        self.assertEqual(rows[("tensor", "loss")], ["5", "0..8", "()", "float32", "20", "B"])
        self.assertEqual(rows[("activation", "out")], ["5", "0..8", "(8,", "3)", "float32", "480", "B"])
        self.assertIn(f"total: {n} records", out)

    def test_check_finds_wrong_and_missing_files(self):
        run_dir = os.path.join(self.tmp, "run")
        shutil.copytree(TRAIN, run_dir)
        rc, out = inspect(run_dir, "--check")
        self.assertEqual(rc, 0, out)
        self.assertIn("0 problems", out)
        np.save(os.path.join(run_dir, "npy/grad/fc.weight/00000004.npy"), np.zeros((5, 3), np.float64))
        os.remove(os.path.join(run_dir, "npy/grad/fc.bias/00000006.npy"))
        with open(os.path.join(run_dir, "run.json")) as f:
            info = json.load(f)
        info["closed"] = False
        with open(os.path.join(run_dir, "run.json"), "w") as f:
            json.dump(info, f)
        rc, out = inspect(run_dir, "--check")
        self.assertEqual(rc, 1)
        self.assertIn("NOT closed", out)
        self.assertIn("BAD grad 'fc.weight' step 4", out)
        self.assertIn("holds float64[5, 3], the index says float32[3, 5]", out)
        self.assertIn("BAD grad 'fc.bias' step 6: cannot read", out)
        self.assertIn("2 problems", out)

    def test_command_line(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        p = subprocess.run([sys.executable, "-m", "tensortap", "inspect", TRAIN, "--check"],
                           capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("check:", p.stdout)
        p = subprocess.run([sys.executable, "-m", "tensortap", "inspect", self.tmp],
                           capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 2)
        self.assertIn("not a tensortap run", p.stderr)


class InstallTest(TempCase):
    def test_pip_install(self):
        try:
            import pip  # noqa: F401
        except ImportError:
            self.skipTest("pip is not installed for this interpreter")
        target = os.path.join(self.tmp, "site")
        # Offline: no build isolation, so the interpreter's own setuptools builds it.
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                        "--target", target, os.path.join(ROOT, "python")], check=True,
                       env=dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1"))
        shutil.rmtree(os.path.join(ROOT, "python", "build"), ignore_errors=True)
        p = subprocess.run([sys.executable, "-c", "import tensortap; print(tensortap.__file__)"],
                           capture_output=True, text=True, cwd=self.tmp, env=dict(os.environ, PYTHONPATH=target))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith(target), p.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
