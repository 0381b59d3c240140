"""`tensortap diff` and `tensortap.diff` (issue 45), and the Python twin's
run layout (tensortap.torch, tensortap/_writer.py). The diff at its edges and
its page: test_diff_edges.py; the noise floor and where a difference arises:
test_diff_floor.py (both need no build).

    TT_ANALYSIS_DIR=build/tests/analysis TT_ANALYSIS_PROC=build/tests/analysis_runs \
    TT_E2E_DIR=build/tests/e2e [TT_TWIN_PYTHON=a-python-with-torch] \
    PYTHONPATH=python python3 tests/python/test_diff.py

The runs of the C++ programs: analysis_runs (the same training as .npy,
HDF5 and two ranks) and e2e_writer (npy, packed, HDF5). The value rules on
runs written here with the twin's writer, which needs no torch. The twin
itself where TT_TWIN_PYTHON names a Python with torch.
"""

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import numpy as np

import tensortap
from tensortap import __main__ as cli
from tensortap import _index
from tensortap._names import LOCK, is_run_file_name
from tensortap._writer import RunWriter, default_options, encode_name, index_line

ANALYSIS = os.environ.get("TT_ANALYSIS_DIR", "build/tests/analysis")
ANALYSIS_PROC = os.environ.get("TT_ANALYSIS_PROC", "")
E2E = os.environ.get("TT_E2E_DIR", "build/tests/e2e")
TWIN_PYTHON = os.environ.get("TT_TWIN_PYTHON", "")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def command(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["diff", *args])
    return rc, out.getvalue(), err.getvalue()


def write_run(path, records, world=1, rank=0):
    """A run of `records` [(kind, name, step, array, dtype)] by the twin's writer."""
    w = RunWriter(path, default_options(1, ["tensor"]), overwrite=True, rank=rank, world_size=world)
    for kind, name, step, a, dtype in records:
        w.write(kind, name, step, np.asarray(a), dtype)
    w.close()
    return path


class TempCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-diff-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def copy(self, run, name):
        dst = os.path.join(self.tmp, name)
        shutil.copytree(run, dst, symlinks=True)
        return dst

    def pair(self, a, b, dtype, **tol):
        """The one row of two one-record runs holding `a` and `b`."""
        ra = write_run(os.path.join(self.tmp, "a"), [("tensor", "x", 0, a, dtype)])
        rb = write_run(os.path.join(self.tmp, "b"), [("tensor", "x", 0, b, dtype)])
        df = tensortap.diff(ra, rb, **tol)
        self.assertEqual(len(df), 1)
        return df.iloc[0]


class ProgramRunsTest(TempCase):
    """Runs of the C++ programs."""

    @classmethod
    def setUpClass(cls):
        cls.npy = os.path.join(ANALYSIS, "npy")
        if not os.path.isdir(cls.npy):
            raise unittest.SkipTest(f"no analysis runs in {ANALYSIS} (ctest fixture analysis_runs)")

    def test_the_same_program_twice_differs_nowhere(self):
        if not ANALYSIS_PROC:
            self.skipTest("TT_ANALYSIS_PROC is not set")
        again = os.path.join(self.tmp, "again")
        subprocess.run([ANALYSIS_PROC, again], check=True, capture_output=True, timeout=300)
        for sub in ("npy", "ranks"):
            with self.subTest(run=sub):
                rc, out, err = command(os.path.join(ANALYSIS, sub), os.path.join(again, sub))
                self.assertEqual(rc, 0, out + err)
                n = len(tensortap.open(os.path.join(ANALYSIS, sub)).records)
                self.assertEqual(out.splitlines()[-1], f"compared {n}, differ 0, only in A 0, only in B 0")

    def test_formats_compare_as_their_values(self):
        pairs = [(os.path.join(ANALYSIS, "npy"), os.path.join(ANALYSIS, "hdf5")),
                 (os.path.join(E2E, "train"), os.path.join(E2E, "train_packed")),
                 (os.path.join(E2E, "train_packed"), os.path.join(E2E, "train_h5"))]
        compared = 0
        for a, b in pairs:
            if not (os.path.isdir(a) and os.path.isdir(b)):
                continue  # HDF5 needs a build with it
            with self.subTest(a=a, b=b):
                df = tensortap.diff(a, b)
                self.assertGreaterEqual(len(df), 50)
                self.assertTrue((df.status == "equal").all(), df[df.status != "equal"].head().to_string())
                self.assertIsNone(df.attrs["first_divergence"])
                compared += 1
        self.assertGreater(compared, 0)

    def test_two_ranks(self):
        ranks = os.path.join(ANALYSIS, "ranks")
        df = tensortap.diff(ranks, ranks)
        self.assertEqual(sorted(df["rank"].unique()), [0, 1])
        self.assertTrue((df.status == "equal").all())
        # The single-rank run trained as rank 0 did (the same seed): rank 1
        # is on B's side only.
        df = tensortap.diff(self.npy, ranks)
        only_b = df[df.status == "only_b"]
        self.assertGreater(len(only_b), 0)
        self.assertEqual(set(only_b["rank"]), {1})
        self.assertTrue((df[df["rank"] == 0].status == "equal").all())
        rc, out, _ = command(self.npy, ranks)
        self.assertEqual(rc, 1)
        self.assertIn(f"only in B {len(only_b)}", out.splitlines()[-1])
        self.assertIn(" rank 1", out)
        rc, out, _ = command(self.npy, ranks, "--common-only")
        self.assertEqual(rc, 0, out)

    def test_one_ulp_in_one_record_is_found_named_and_counted(self):
        b = self.copy(self.npy, "b")
        run = tensortap.open(b)
        rec = next(r for r in run.records if r["kind"] == "activation" and r["name"] == "hidden" and r["step"] == 9)
        path = os.path.join(b, rec["file"])
        a = np.load(path)
        i = int(np.flatnonzero(np.abs(a) > 0.1)[0])  # one ULP of it is within rtol 1e-6
        a.flat[i] = np.nextafter(a.flat[i], np.float32(np.inf))
        np.save(path, a)
        df = tensortap.diff(self.npy, b)
        bad = df[df.status != "equal"]
        self.assertEqual(len(bad), 1, bad.to_string())
        row = bad.iloc[0]
        self.assertEqual((row["kind"], row["name"], row["step"]), ("activation", "hidden", 9))
        self.assertEqual((row["n_bad"], row["max_ulp"]), (1, 1.0))
        first = dict(df.attrs["first_divergence"])
        # The step's first activation: nothing of its forward agrees before it
        # (its params and buffers are the step's state, not its forward: issue 74).
        self.assertEqual(first.pop("arises"), "in the forward before activation hidden", first)
        self.assertEqual(first, {"rank": 0, "kind": "activation", "name": "hidden", "step": 9})
        rc, out, _ = command(self.npy, b)
        self.assertEqual(rc, 1)
        lines = out.splitlines()
        self.assertTrue(lines[0].startswith("first divergence: activation hidden step 9: arises in the forward "
                                            "before activation hidden; "), out)
        self.assertIn("; 1 element(s) beyond tolerance", lines[0])
        self.assertIn("max ulp 1", lines[0])
        # Nor is a parameter or buffer named as the last record that agrees:
        # the step's state is no clue to its forward.
        self.assertNotIn("last agreeing before it", out)
        self.assertEqual(lines[-1], f"compared {len(df)}, differ 1, only in A 0, only in B 0")
        # A tolerance the one ULP is within.
        self.assertEqual(command(self.npy, b, "--rtol", "1e-6")[0], 0)

    def test_missing_records_fail_unless_common_only(self):
        b = self.copy(self.npy, "b")
        index = os.path.join(b, "index.jsonl")
        with open(index) as f:
            lines = f.readlines()
        dropped = [json.loads(x) for x in lines[3:5]]
        with open(index, "w") as f:
            f.writelines(lines[:3] + lines[5:])
        df = tensortap.diff(self.npy, b)
        only_a = df[df.status == "only_a"]
        self.assertEqual(sorted(zip(only_a.kind, only_a.name, only_a.step)),
                         sorted((d["kind"], d["name"], d["step"]) for d in dropped))
        self.assertTrue(only_a.n_bad.isna().all())
        rc, out, _ = command(self.npy, b)
        self.assertEqual(rc, 1)
        self.assertIn("only in A (2):", out)
        self.assertEqual(command(self.npy, b, "--common-only")[0], 0)
        # The other way round: B has more.
        self.assertEqual(command(b, self.npy)[0], 1)

    def test_a_shape_or_dtype_change_is_a_mismatch(self):
        # A float32 against a float64 is judged as float32 (issue 74,
        # test_diff_port.py); an integer against a float is a mismatch.
        b = self.copy(self.npy, "b")
        index = os.path.join(b, "index.jsonl")
        with open(index) as f:
            lines = f.readlines()
        for i, line in enumerate(lines):
            rec = json.loads(line)
            if rec["kind"] == "grad" and rec["name"] == "fc2.bias" and rec["step"] == 0:
                path = os.path.join(b, rec["file"])
                np.save(path, np.load(path).astype(np.int64))
                rec["dtype"] = "int64"
                lines[i] = json.dumps(rec, separators=(",", ":")) + "\n"
        with open(index, "w") as f:
            f.writelines(lines)
        df = tensortap.diff(self.npy, b)
        bad = df[df.status != "equal"]
        self.assertEqual(list(bad.status), ["mismatch"])
        self.assertEqual(df.attrs["first_divergence"]["name"], "fc2.bias")
        rc, out, _ = command(self.npy, b)
        self.assertEqual(rc, 1)
        self.assertIn("shape or dtype differs (A float32 [4], B int64 [4])", out)


class ValueRulesTest(TempCase):
    """DESIGN.md section 9's rules, on runs written by the twin's writer."""

    def test_nan_inf_and_signed_zero(self):
        nan, inf = np.float32(np.nan), np.float32(np.inf)
        a = np.array([0.0, nan, inf, 1.0, -inf], dtype=np.float32)
        b = np.array([-0.0, -nan, inf, 1.0, -inf], dtype=np.float32)
        # A NaN's payload does not matter either.
        b_bits = b.view(np.uint32).copy()
        b_bits[1] |= 0x1234
        row = self.pair(a, b_bits.view(np.float32), "float32")
        self.assertEqual(row.status, "equal")
        self.assertEqual(row.n_bad, 0)
        for i, other in ((1, 0.5), (3, np.nan), (2, -np.inf), (4, 3.0)):
            with self.subTest(element=i, b=other):
                c = a.copy()
                c[i] = other
                row = self.pair(a, c, "float32", rtol=1.0, atol=1.0)
                self.assertEqual((row.status, row.n_bad), ("differ", 1))
                self.assertTrue(math.isinf(row.max_abs) and math.isinf(row.max_ulp))

    def test_tolerance_is_relative_to_a(self):
        a = np.array([100.0, 1.0], dtype=np.float64)
        b = np.array([101.0, 1.0], dtype=np.float64)
        self.assertEqual(self.pair(a, b, "float64", rtol=0.01).status, "equal")
        self.assertEqual(self.pair(a, b, "float64", rtol=0.0099).status, "differ")
        self.assertEqual(self.pair(a, b, "float64", atol=1.0).status, "equal")
        # A is the reference: 1 <= 0.00991 * 101, but not <= 0.00991 * 100.
        self.assertEqual(self.pair(b, a, "float64", rtol=0.00991).status, "equal")
        self.assertEqual(self.pair(a, b, "float64", rtol=0.00991).status, "differ")
        row = self.pair(a, b, "float64")
        self.assertAlmostEqual(row.max_abs, 1.0)
        self.assertAlmostEqual(row.max_rel, 0.01)
        # float64 values that are all float32 values are judged as float32 (issue 74): its ulps.
        self.assertEqual(row.max_ulp, 1.0 * (np.float32(101).view(np.int32) - np.float32(100).view(np.int32)))
        c = a + 2.0 ** -30
        row = self.pair(c, c + np.array([1.0, 0.0]), "float64")
        self.assertEqual(row.max_ulp, 1.0 * (np.float64(c[0] + 1).view(np.int64) - np.float64(c[0]).view(np.int64)))

    def test_integers_and_bool_are_exact_whatever_the_tolerance(self):
        for dtype, a, b in (("int64", [1, 2, 3], [1, 2, 4]), ("uint8", [0, 255], [0, 254]),
                            ("bool", [True, False], [True, True])):
            with self.subTest(dtype=dtype):
                row = self.pair(np.array(a, dtype=dtype), np.array(b, dtype=dtype), dtype, rtol=1.0, atol=10.0)
                self.assertEqual((row.status, row.n_bad), ("differ", 1))
                self.assertTrue(math.isnan(row.max_ulp))
        row = self.pair(np.array([5, 7], dtype=np.int32), np.array([5, 7], dtype=np.int32), "int32")
        self.assertEqual((row.status, row.max_abs, row.cosine), ("equal", 0.0, 1.0))

    def test_ulps_in_the_records_own_dtype(self):
        one = np.float32(1.0)
        # bfloat16, stored as float32: one bfloat16 ULP is 2**16 float32 ULPs.
        b = np.array([1.0 + 2.0 ** -7], dtype=np.float32)
        row = self.pair(np.array([one]), b, "bfloat16")
        self.assertEqual(row.max_ulp, 1.0)
        row = self.pair(np.array([one]), np.array([np.nextafter(one, np.float32(2))]), "float32")
        self.assertEqual(row.max_ulp, 1.0)
        h = np.array([1.0], dtype=np.float16)
        row = self.pair(h, np.nextafter(h, np.float16(2)), "float16")
        self.assertEqual(row.max_ulp, 1.0)
        # Across zero: -min_subnormal to +min_subnormal is two ULPs (-0 and +0 one value).
        tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
        row = self.pair(np.array([-tiny]), np.array([tiny]), "float32")
        self.assertEqual(row.max_ulp, 2.0)
        # Far apart: exact, with no int64 overflow.
        big = np.finfo(np.float64).max
        row = self.pair(np.array([-big]), np.array([big]), "float64")
        self.assertEqual(row.max_ulp, 2.0 * float(np.float64(big).view(np.int64)))

    def test_float8_ulps_count_its_values(self):
        from tensortap import _float8

        codes = np.array([0x38, 0x39, 0x80, 0x01], dtype=np.uint8)  # 1.0, 1.125, -0, the least subnormal
        other = np.array([0x39, 0x39, 0x00, 0x81], dtype=np.uint8)
        a_dir = os.path.join(self.tmp, "a8")
        b_dir = os.path.join(self.tmp, "b8")
        write_run(a_dir, [("tensor", "q", 0, codes, "float8_e4m3fn")])
        write_run(b_dir, [("tensor", "q", 0, other, "float8_e4m3fn")])
        self.assertEqual(tensortap.open(a_dir).load("q", 0, kind="tensor").tolist(),
                         _float8.table("float8_e4m3fn")[codes].tolist())
        row = tensortap.diff(a_dir, b_dir).iloc[0]
        self.assertEqual((row.status, row.n_bad, row.max_ulp), ("differ", 2, 2.0))

    def test_complex_compares_its_parts(self):
        a = np.array([1 + 1j, 2 + 0j], dtype=np.complex64)
        b = np.array([1 + 1j, 2 - 0j], dtype=np.complex64)
        self.assertEqual(self.pair(a, b, "complex64").status, "equal")
        c = np.array([1 + 1j, complex(2, np.nan)], dtype=np.complex64)
        row = self.pair(a, c, "complex64")
        self.assertEqual((row.status, row.n_bad), ("differ", 1))

    def test_cosine(self):
        z = np.zeros(4, dtype=np.float32)
        self.assertEqual(self.pair(z, z, "float32").cosine, 1.0)
        self.assertEqual(self.pair(z, np.ones(4, dtype=np.float32), "float32").cosine, 0.0)
        self.assertAlmostEqual(self.pair(np.array([1.0, 0.0]), np.array([0.0, 1.0]), "float64").cosine, 0.0)
        self.assertAlmostEqual(self.pair(np.array([1.0, 1.0]), np.array([-1.0, -1.0]), "float64").cosine, -1.0)

    def test_large_records_compare_block_by_block(self):
        from tensortap._diff import values as _diff_values

        a = np.arange(3_000_000, dtype=np.float32)
        b = a.copy()
        b[-1] += 1
        with mock.patch.object(_diff_values, "BLOCK", 1 << 20):
            row = self.pair(a, b, "float32")
        self.assertEqual((row.status, row.n_bad, row.max_abs), ("differ", 1, 1.0))

    def test_the_python_api(self):
        a = write_run(os.path.join(self.tmp, "a"), [("tensor", "x", s, np.full(3, s, np.float32), "float32")
                                                    for s in range(4)] + [("grad", "w", 2, np.zeros(2), "float64")])
        b = write_run(os.path.join(self.tmp, "b"), [("tensor", "x", s, np.full(3, 0 if s == 2 else s, np.float32),
                                                     "float32") for s in range(4)] + [("tensor", "y", 0, [1.0],
                                                                                       "float64")])
        df = tensortap.diff(a, tensortap.open(b))
        self.assertEqual(list(df.columns), ["rank", "kind", "name", "step", "status", "max_abs", "max_rel",
                                            "max_ulp", "n_bad", "cosine", "rel_norm", "floor_rel_norm"])
        self.assertEqual(list(df.status), ["equal", "equal", "differ", "equal", "only_a", "only_b"])
        self.assertEqual(df.attrs["first_divergence"], {"rank": 0, "kind": "tensor", "name": "x", "step": 2,
                                                        "arises": "between steps 1 and 2 (record kind param to "
                                                                  "tell the update from the forward)"})
        self.assertEqual(df.rel_norm.iloc[2], 1.0)  # ||a - b|| / ||a||: b is 0
        self.assertTrue(df.floor_rel_norm.isna().all())
        with self.assertRaises(ValueError):
            tensortap.diff(a, b, rtol=-1)


class BadInputTest(TempCase):
    def test_a_directory_that_is_not_a_run(self):
        os.makedirs(os.path.join(self.tmp, "empty"))
        a = write_run(os.path.join(self.tmp, "a"), [("tensor", "x", 0, [1.0], "float32")])
        for args in ((os.path.join(self.tmp, "empty"), a), (a, os.path.join(self.tmp, "missing"))):
            rc, out, err = command(*args)
            self.assertEqual(rc, 2, out + err)
            self.assertIn("tensortap: ", err)
            self.assertNotIn("Traceback", err)
        self.assertEqual(command(a, a, "--rtol", "nan")[0], 2)

    def test_a_truncated_npy(self):
        # Unreadable, a difference, named with its file; the diff goes on (issue 56).
        a = write_run(os.path.join(self.tmp, "a"), [("tensor", "x", 0, np.arange(100, dtype=np.float32), "float32"),
                                                    ("tensor", "y", 0, np.arange(3, dtype=np.float32), "float32")])
        b = self.copy(a, "b")
        path = os.path.join(b, "npy", "tensor", "x", "00000000.npy")
        with open(path, "r+b") as f:
            f.truncate(200)
        rc, out, err = command(a, b)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("tensor x step 0: unreadable: B: cannot be read from npy/tensor/x/00000000.npy", out)
        self.assertEqual(out.splitlines()[-1], "compared 2, differ 1, only in A 0, only in B 0")


class PageTest(TempCase):
    def test_the_html_page(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("matplotlib is not installed")
        a = write_run(os.path.join(self.tmp, "a"), [("activation", f"layer{i}", s, np.full(8, i + s, np.float32),
                                                     "float32") for s in range(5) for i in range(6)])
        b = write_run(os.path.join(self.tmp, "b"), [("activation", f"layer{i}", s,
                                                     np.full(8, i + s + (1e-3 * s if i >= 3 else 0), np.float32),
                                                     "float32") for s in range(5) for i in range(6) if (i, s) != (0, 4)])
        page = os.path.join(self.tmp, "diff.html")
        rc, out, err = command(a, b, "--html", page)
        self.assertEqual(rc, 1, err)
        with open(page, encoding="utf-8") as f:
            text = f.read()
        self.assertIn("first divergence: activation layer3 step 1", text)
        self.assertIn('src="data:image/png;base64,', text)
        self.assertNotIn("http://", text.replace("http://www.w3.org", ""))
        self.assertIn("only in A", text)


class WriterLayoutTest(TempCase):
    """What the twin writes is what the C++ writers write."""

    def test_names_are_encoded_as_the_cpp_writers_encode_them(self):
        # tests/unit/test_paths.cpp's cases.
        for name, want in (("encoder.0.weight", "encoder.0.weight"), ("hidden#1", "hidden#1"), ("a/b", "a%2Fb"),
                           ("..", "%2E."), (".hidden", "%2Ehidden"), ("../../etc/passwd", "%2E.%2F..%2Fetc%2Fpasswd"),
                           ("a\0b", "a%00b"), ("100%", "100%25"), ("poids/\u00e9t\u00e9", "poids%2F%C3%A9t%C3%A9"),
                           ("", "%00empty")):
            self.assertEqual(encode_name(name), want, name)
        long = encode_name("/" * 400)
        self.assertLessEqual(len(long), 200)
        self.assertRegex(long, r"^(%2F)+~[0-9a-f]{16}$")

    def test_index_lines_take_the_readers_fast_path(self):
        records = [("tensor", n, s, np.arange(6, dtype=np.float32).reshape(2, 3), "float32")
                   for n in ("loss", "a/b", "q\"uote", "\u00e9t\u00e9", "tab\there") for s in (0, 7)]
        run = write_run(os.path.join(self.tmp, "r"), records)
        with mock.patch.object(_index.Index, "_slow_lines", side_effect=AssertionError("a slow line")):
            r = tensortap.open(run)
        self.assertEqual(len(r.records), len(records))
        with open(os.path.join(run, "index.jsonl")) as f:
            self.assertEqual([json.loads(x) for x in f], list(r.records))
        self.assertEqual(index_line(3, "grad", "w", "bfloat16", [2], "npy/grad/w/00000003.npy"),
                         '{"step":3,"kind":"grad","name":"w","dtype":"bfloat16","shape":[2],'
                         '"file":"npy/grad/w/00000003.npy"}\n')
        names = set(os.listdir(run))
        self.assertTrue(all(is_run_file_name(n) or n == LOCK for n in names), names)
        self.assertTrue(r.closed)

    def test_the_lock_and_overwrite(self):
        path = os.path.join(self.tmp, "r")
        w = RunWriter(path, default_options(1, ["tensor"]))
        with self.assertRaisesRegex(tensortap.RunError, "in use by another recorder"):
            RunWriter(path, default_options(1, ["tensor"]))
        w.close()
        with self.assertRaisesRegex(tensortap.RunError, "already holds a run"):
            RunWriter(path, default_options(1, ["tensor"]))
        keep = os.path.join(path, "mine.txt")
        with open(keep, "w") as f:
            f.write("a user's file")
        RunWriter(path, default_options(1, ["tensor"]), overwrite=True).close()
        self.assertTrue(os.path.exists(keep))

    def test_links_planted_in_the_run_are_never_followed(self):
        # As the C++ writers: a link planted at a name's folder is refused,
        # one at a file's final or temporary name replaced, and nothing is
        # written outside the run.
        outside = os.path.join(self.tmp, "outside")
        os.makedirs(outside)
        path = os.path.join(self.tmp, "r")
        w = RunWriter(path, default_options(1, ["tensor"]))
        w.write("tensor", "x", 0, np.ones(2, np.float32), "float32")
        os.symlink(outside, os.path.join(path, "npy", "tensor", "y"))
        with self.assertRaisesRegex(tensortap.RunError, r"npy/tensor/y is not a folder of the run"):
            w.write("tensor", "y", 0, np.ones(2, np.float32), "float32")
        folder = os.path.join(path, "npy", "tensor", "x")
        os.symlink(os.path.join(outside, "final"), os.path.join(folder, "00000001.npy"))
        os.symlink(os.path.join(outside, "tmp"), os.path.join(folder, ".00000002.npy.tmp"))
        os.symlink(os.path.join(outside, "json"), os.path.join(path, ".run.json.tmp"))
        w.write("tensor", "x", 1, np.full(2, 1, np.float32), "float32")
        w.write("tensor", "x", 2, np.full(2, 2, np.float32), "float32")
        os.unlink(os.path.join(path, "run.json"))
        os.symlink(os.path.join(outside, "run"), os.path.join(path, "run.json"))
        w.close()
        self.assertEqual(os.listdir(outside), [])
        r = tensortap.open(path)
        self.assertTrue(r.closed)
        self.assertEqual(r.load("x", 2, kind="tensor").tolist(), [2.0, 2.0])
        self.assertEqual(r.names(), ["x"])

    def test_a_file_where_a_folder_goes_and_names_that_leave_a_folder_are_refused(self):
        # _safe_write.py, which the export shares: a folder is one name,
        # never a path through others, and a file in its place is refused.
        from tensortap import _safe_write

        path = os.path.join(self.tmp, "r")
        w = RunWriter(path, default_options(1, ["tensor"]))
        os.makedirs(os.path.join(path, "npy"))
        with open(os.path.join(path, "npy", "tensor"), "w"):
            pass
        with self.assertRaisesRegex(tensortap.RunError, r"npy/tensor is not a folder of the run: not a folder"):
            w.write("tensor", "x", 0, np.ones(2, np.float32), "float32")
        w.close()
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for bad in ("", ".", "..", "a/b", "../r", "a\0b"):
                with self.assertRaisesRegex(tensortap.RunError, "not the name of one file or folder"):
                    _safe_write.open_folder(fd, bad, os.path.join(path, bad), create=True)
                with self.assertRaisesRegex(tensortap.RunError, "not the name of one file or folder"):
                    _safe_write.create_new(fd, bad, os.path.join(path, bad))
        finally:
            os.close(fd)
        self.assertEqual(sorted(os.listdir(self.tmp)), ["r"])

    def test_importable_without_torch(self):
        code = ("import sys; sys.modules['torch'] = None\n"
                "import tensortap.torch as ttt\n"
                "try:\n    ttt.watch(object(), 'x')\nexcept ImportError as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")), timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("pip install torch", out.stdout)


# The twin on a small model, run by a Python that has torch (TT_TWIN_PYTHON).
TWIN_SCRIPT = r"""
import sys, torch, tensortap, tensortap.torch as ttt
torch.manual_seed(0)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 6)
        self.block = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU())
        self.norm = torch.nn.BatchNorm1d(6)
        self.head = torch.nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight  # tied, as a language model's
        self.rnn = torch.nn.GRU(6, 4)

    def forward(self, x):
        h = self.norm(self.block(self.emb(x)))
        h = self.block(h)  # the same block twice: block.0#1
        o, _ = self.rnn(h.unsqueeze(1))
        return self.head(h) + o.sum()

model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kinds = ("activation", "activation_grad", "param", "buffer", "grad", "tensor")
with ttt.watch(model, sys.argv[1], every=2, kinds=kinds, rename={"block.1": "gelu"}) as rec:
    for step in range(4):
        rec.step(step)
        loss = model(torch.arange(8) % 10).pow(2).mean()
        rec.capture("loss", loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    rec.step(4)
    model(torch.arange(8) % 10)  # eval: no activations
    for bad in (4, 3, -1, 1 << 47):  # as C++: steps increase, from 0, below 2^47
        try:
            rec.step(bad)
            sys.exit(f"step({bad}) was taken")
        except ValueError:
            pass
print("twin", rec.records)
"""


@unittest.skipUnless(TWIN_PYTHON, "TT_TWIN_PYTHON (a Python with torch) is not set")
class TwinTest(TempCase):
    def test_a_model_recorded_by_the_twin(self):
        run = os.path.join(self.tmp, "twin")
        out = subprocess.run([TWIN_PYTHON, "-c", TWIN_SCRIPT, run], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep
                                      + os.environ.get("PYTHONPATH", "")))
        self.assertEqual(out.returncode, 0, out.stderr)
        with mock.patch.object(_index.Index, "_slow_lines", side_effect=AssertionError("a slow line")):
            r = tensortap.open(run)
        self.assertTrue(r.closed)
        self.assertEqual(r.info["writer"], "python")
        self.assertEqual(r.kinds(), ["activation", "activation_grad", "param", "buffer", "grad", "tensor"])
        # Module paths; a module run twice is name#1; a GRU's tuple is .0 and .1;
        # rename gives a path the C++ name.
        self.assertEqual(r.names("activation"), ["block.0", "block.0#1", "emb", "gelu", "gelu#1", "head", "norm",
                                                 "rnn.0", "rnn.1"])
        # A tied weight is one tensor: recorded once, under its first name.
        self.assertEqual(r.names("grad"), ["block.0.bias", "block.0.weight", "emb.weight", "norm.bias", "norm.weight",
                                           "rnn.bias_hh_l0", "rnn.bias_ih_l0", "rnn.weight_hh_l0", "rnn.weight_ih_l0"])
        self.assertIn("norm.running_mean", r.names("buffer"))
        # every=2: steps 0 and 2; step 4 in eval mode records parameters only.
        self.assertEqual(r.steps("loss", kind="tensor"), [0, 2])
        self.assertEqual(r.steps("emb.weight", kind="param"), [0, 2, 4])
        self.assertEqual(r.steps("emb", kind="activation"), [0, 2])
        self.assertEqual(r.load("loss", 0, kind="tensor").shape, ())
        names = set(os.listdir(run))
        self.assertTrue(all(is_run_file_name(n) or n == LOCK for n in names), names)
        for line in open(os.path.join(run, "index.jsonl")):
            rec = json.loads(line)
            self.assertTrue(os.path.isfile(os.path.join(run, rec["file"])), rec)
        # And it compares with itself.
        self.assertEqual(command(run, run)[0], 0)

    def test_the_model_itself_is_root(self):
        # As the C++ side names a watched Tapped<M>'s own output (issue 47).
        run = os.path.join(self.tmp, "root")
        code = ("import sys, torch, tensortap.torch as ttt\n"
                "m = torch.nn.Sequential(torch.nn.Linear(3, 2))\n"
                "with ttt.watch(m, sys.argv[1], kinds=('activation',), modules=['', '0']) as rec:\n"
                "    rec.step(0)\n"
                "    m(torch.ones(4, 3))\n")
        out = subprocess.run([TWIN_PYTHON, "-c", code, run], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep
                                      + os.environ.get("PYTHONPATH", "")))
        self.assertEqual(out.returncode, 0, out.stderr)
        with tensortap.open(run) as r:
            self.assertEqual(r.names("activation"), ["0", "root"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
