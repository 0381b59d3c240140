"""`tensortap tensorboard RUN`: the reader's export to TensorBoard event files
(python/tensortap/_tensorboard/export.py, writers/src/tensorboard/EVENTS.md), read
back with TensorBoard's own EventAccumulator, on runs built by hand here (no
C++ build needed). TensorBoard is not tensortap's dependency: its folder
(scripts/common.sh: install_tensorboard, tensorboard_dir) goes on PYTHONPATH;
without it the test fails, saying so.

    PYTHONPATH=python:$(bash -c 'source scripts/common.sh; tensorboard_dir') \\
        /usr/bin/python3 tests/python/test_tensorboard_export.py

With TT_E2E_DIR (build/tests/e2e) set, each run there is exported and checked too.
"""

import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import unittest
import warnings
from unittest import mock

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tb_check  # noqa: E402
import tensortap  # noqa: E402
from tensortap import __main__ as cli  # noqa: E402
from tensortap import _names  # noqa: E402
from tensortap._tensorboard import events as _tb_events  # noqa: E402
from tensortap._tensorboard import values as _tb_values  # noqa: E402
from tensortap._tensorboard import export as _tensorboard  # noqa: E402

DBL_MAX = sys.float_info.max
SIZES = {"scalars": 0, "histograms": 0, "tensors": 0}

# Dumps as the writer prints their lines (append_dump_json).
DUMP_LINES = [
    '{"step": 3, "reason": "user", "steps": [1,2,3]}',
    '{"step": 4, "reason": "spike", "steps": [2,3,4], "kind": "tensor", "name": "loss", '
    '"trigger": {"kind": "spike", "factor": 5, "window": 10}, "value": 50.5, "median": 1.25}',
    '{"step": 1, "reason": "nan", "steps": [0,1], "kind": "activation", "name": "h\u00e9\\"x\\u0001\\udcff", '
    '"trigger": {"kind": "non_finite"}}',
]


def setUpModule():
    tb_check.tensorboard()  # fails the test, with how to install it, when TensorBoard is missing


def make_run(path, records=(), stats=(), dumps=(), lines=True, closed=True, rank=0, world_size=1):
    """A run directory: run.json, index.jsonl and a .npy file per record
    ((kind, name, step, array)), stats.npy and stats_series.jsonl of `stats`
    ((step, kind, name, ten values)), and dumps (lines as the writer prints
    them): in dumps.jsonl if `lines`, and in run.json's "dumps"."""
    os.makedirs(path, exist_ok=True)
    info = {"format_version": 1, "closed": closed, "options": {"format": "npy"}, "rank": rank,
            "world_size": world_size, "dumps": [json.loads(d) for d in dumps]}
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump(info, f)
    with open(os.path.join(path, "index.jsonl"), "w") as f:
        for n, (kind, name, step, array) in enumerate(records):
            array = np.asarray(array)
            file = f"npy/{kind}/r{n}/{step:08d}.npy"
            os.makedirs(os.path.dirname(os.path.join(path, file)), exist_ok=True)
            np.save(os.path.join(path, file), array)
            f.write(json.dumps({"step": step, "kind": kind, "name": name, "dtype": array.dtype.name,
                                "shape": list(array.shape), "file": file}) + "\n")
    if stats:
        series = {}
        for _, kind, name, _ in stats:
            series.setdefault((kind, name), len(series))
        dtype = [("step", "<i8"), ("series", "<i8")] + [(f, "<f8") for f in tb_check.STATS_FIELDS[:5]] \
            + [(f, "<i8") for f in tb_check.STATS_FIELDS[5:]]
        table = np.zeros(len(stats), dtype)
        for i, (step, kind, name, values) in enumerate(stats):
            table[i] = (step, series[(kind, name)], *values)
        np.save(os.path.join(path, "stats.npy"), table)
        with open(os.path.join(path, "stats_series.jsonl"), "w") as f:
            for (kind, name), s in series.items():
                f.write(json.dumps({"series": s, "kind": kind, "name": name}, separators=(",", ":")) + "\n")
    if dumps and lines:
        with open(os.path.join(path, "dumps.jsonl"), "w") as f:
            f.write("".join(d + "\n" for d in dumps))
    return path


def rich_records(seed=0):
    """Records of every kind of element the spec speaks of, at steps -2..5."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(-2, 6):
        w = rng.standard_normal((2, 3)).astype(np.float32)
        if step == 2:
            w[0, 0], w[1, 2] = np.nan, np.inf
        out.append(("grad", "w", step, w))
        out.append(("tensor", "loss", step, np.float32(1.0 / (step + 3))))
        out.append(("tensor", "lr", step, np.float64(0.1 * 0.9 ** step)))
    # Limits hit exactly, both zeros, denormals, the ends of the doubles.
    edges = np.array([0.0, -0.0, 1e-12, -1e-12, 1e-320, -1e-320, 1.0, -1.0, 1e25, -1e25,
                      DBL_MAX, -DBL_MAX, np.nan, -np.inf, 3.5, 3.5, 3.5, 1e-13], np.float64)
    out += [("activation", "edges", 0, edges), ("activation", "edges", 2, edges[::-1].copy()),
            ("activation", "h", 4, rng.standard_normal((4, 5))),
            ("activation", "c", 0, (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype(np.complex64)),
            ("activation", "half", 2, rng.standard_normal(7).astype(np.float16)),
            ("activation", "empty", 0, np.zeros((0,), np.float32)),
            ("activation", "allnan", 0, np.full((3,), np.nan, np.float32)),
            ("buffer", "mask", 0, np.array([True, False, True, True])),
            ("param", "b", 0, np.array([-(2 ** 62) - 1, 3, 7, 2 ** 53 + 1], np.int64)),
            ("param", "u8", 4, np.arange(10, dtype=np.uint8)),
            ("tensor", "flag", 0, np.bool_(True)), ("tensor", "flag", 1, np.bool_(False)),
            ("tensor", "count", 2, np.int64(2 ** 40 + 1)), ("tensor", "big", 0, np.int64(2 ** 62 + 2 ** 38 + 1)),
            ("tensor", "z", 0, np.complex64(3 + 4j)),
            ("tensor", "nanloss", 0, np.float32(np.nan)), ("tensor", "nanloss", 1, np.float32(-np.inf))]
    return out


def rich_stats():
    """Rows out of step order, NaN and counts among them."""
    rows = []
    for step in (3, 1, 0, 2, 5, 4):
        rows.append((step, "grad", "w", (-step - 0.1, step + 0.2, 1 / 3, np.nan if step == 2 else 0.7, 12.3456789,
                                         1 if step == 2 else 0, 1, 0, 2, 6)))
        rows.append((step, "activation", "h", (-1e30, 1e30, 1e-40, 2.0 ** 0.5, 3e38 * 10, 0, 0, 3, 0, 2 ** 40 + 1)))
    return rows


SCALARS = "tensortap: 0-d tensors (loss, learning rate)"
NORMS = "tensortap: gradient norms"
STDS = "tensortap: activations' std"


def ten(v):
    """A statistics row's ten values for a tensor of four elements, all `v`."""
    return (v, v, v, 0.0, abs(v) * 2, 0, 0, 0, 0, 4)


def export_path(run, *args, **kwargs):
    """export_tensorboard of `run`, an open Run or the path of one (it takes
    an open Run)."""
    if not isinstance(run, tensortap.Run):
        with tensortap.open(run) as opened:
            return _tensorboard.export_tensorboard(opened, *args, **kwargs)
    return _tensorboard.export_tensorboard(run, *args, **kwargs)


def export_warned(*args, **kwargs):
    """export_path's result, and the messages of the RunWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_path(*args, **kwargs)
    return result, [str(w.message) for w in caught if issubclass(w.category, tensortap.RunWarning)]


def export(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tensortap.RunWarning)
        return export_path(*args, **kwargs)


def accumulator(path):
    event_accumulator, _, _ = tb_check.tensorboard()
    acc = event_accumulator.EventAccumulator(path, size_guidance=SIZES)
    with np.errstate(over="ignore"):  # its distributions interpolate up to DBL_MAX
        acc.Reload()
    return acc


def main_cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(list(args))
    return rc, out.getvalue(), err.getvalue()


def listing(top):
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs)


class TempCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-tb-")
        self.run_dir = os.path.join(self.tmp, "runs", "exp")
        self.logdir = os.path.join(self.tmp, "logs")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


class EncodingTest(unittest.TestCase):
    def test_crc32c_known_answers(self):
        self.assertEqual(_tb_events.crc32c(b"123456789"), 0xE3069283)
        self.assertEqual(_tb_events.crc32c(b""), 0)
        self.assertEqual(_tb_events.crc32c(bytes(32)), 0x8A9136AA)  # RFC 3720 B.4
        self.assertEqual(_tb_events.crc32c(b"\xff" * 32), 0x62A8AB43)
        self.assertEqual(_tb_events.crc32c(bytes(range(32))), 0x46DD794E)
        # Masked, against TensorBoard's own implementation.
        _, _, masked = tb_check.tensorboard()
        rng = np.random.default_rng(1)
        for n in (0, 1, 7, 8, 100, 4097):
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            self.assertEqual(_tb_events.masked_crc32c(data), masked(data), n)

    def test_bucket_limits_are_the_specs(self):
        limits = _tb_values.BUCKET_LIMITS
        self.assertEqual(limits.tolist(), tb_check.LIMITS)
        positive = []
        v = 1e-12
        while v < 1e20:
            positive.append(v)
            v *= 1.1
        n = len(positive) + 1
        self.assertEqual(len(limits), 2 * n + 1)
        self.assertEqual(limits[n], 0.0)
        self.assertEqual(limits[n + 1], 1e-12)
        self.assertEqual(limits[-1], DBL_MAX)
        self.assertEqual(limits[0], -DBL_MAX)
        self.assertTrue(limits[-2] < 1e20 <= limits[-2] * 1.1)
        self.assertTrue((np.diff(limits) > 0).all())
        np.testing.assert_array_equal(limits[:n], -limits[::-1][:n])

    def test_histogram_buckets_and_collapsed_runs(self):
        limits = _tb_values.BUCKET_LIMITS
        zero = int(np.flatnonzero(limits == 0.0)[0])
        h = _tb_values.histogram(np.array([0.0, -0.0, 1e-12, 5e-13, np.nan, np.inf]))
        # 0.0 and -0.0 fall in the bucket above the limit 0.0 (bisect_right),
        # as does 5e-13; 1e-12 in the one above it.
        self.assertEqual(h.bucket_limit, [limits[zero], limits[zero + 1], limits[zero + 2], DBL_MAX])
        self.assertEqual(h.bucket, [0.0, 3.0, 1.0, 0.0])
        self.assertEqual((h.min, h.max, h.num, h.sum), (0.0, 1e-12, 4.0, 1.5e-12))
        h = _tb_values.histogram(np.array([DBL_MAX, -DBL_MAX]))
        self.assertEqual(h.bucket_limit, [-DBL_MAX, limits[1], limits[-2], DBL_MAX])
        self.assertEqual(h.bucket, [0.0, 1.0, 0.0, 1.0])
        self.assertIsNone(_tb_values.histogram(np.array([np.nan, -np.inf])))
        self.assertIsNone(_tb_values.histogram(np.zeros((0, 3))))

    def test_histogram_sums_in_the_recorders_order_block_by_block(self):
        # Round 4: NumPy's pairwise sum differed from the recorder's, which
        # adds element by element, in the last bits (as they do here).
        rng = np.random.default_rng(0)
        v = rng.standard_normal(1000) * 10.0 ** np.random.default_rng(1).integers(-3, 12, 1000)
        v[7] = np.inf
        sequential = squares = 0.0
        for x in v[np.isfinite(v)]:
            sequential += float(x)
            squares += float(x) * float(x)
        self.assertNotEqual(sequential, float(np.sum(v[np.isfinite(v)])))
        for block in (3, 1 << 18):
            with self.subTest(block=block), mock.patch.object(_tb_values, "HISTOGRAM_BLOCK", block):
                h = _tb_values.histogram(v)
                finite = v[np.isfinite(v)]
                self.assertEqual((h.sum, h.sum_squares, h.num, h.min, h.max),
                                 (sequential, squares, 999.0, finite.min(), finite.max()))
        # Bounded memory: a large record is binned a block at a time.
        big = np.ones(1 << 24, dtype=np.float32)  # 64 MiB
        import tracemalloc
        tracemalloc.start()
        h = _tb_values.histogram(big)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        self.assertEqual(h.num, big.size)
        self.assertLess(peak, 16 << 20, "the histogram held a copy of the record")

    def test_dump_lines_match_in_linear_time(self):
        # Round 4: each dump scanned the lines from the start (quadratic:
        # 32,000 dumps took 11 s). Equal dumps take their lines in order.
        d = os.path.join(tempfile.mkdtemp(prefix="tensortap-dumps-"), "run")
        self.addCleanup(shutil.rmtree, os.path.dirname(d), True)
        os.makedirs(d)
        n = 20000
        dumps = [{"step": i, "reason": "user", "steps": [i]} for i in range(n)] + [{"step": 5, "reason": "user",
                                                                                      "steps": [5]}]
        lines = [_tensorboard.dump_line(x) for x in dumps]
        lines[1] = lines[1].replace('"reason": "user"', '"steps": [1], "reason": "user"').replace(', "steps": [1]}', "}")
        with open(os.path.join(d, "dumps.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
        import time
        t = time.perf_counter()
        got = _tensorboard.dump_lines(d, {"closed": False})
        took = time.perf_counter() - t
        self.assertEqual(len(got), n + 1)
        self.assertEqual(got[1][1], lines[1].encode())  # its own line, keys in its own order
        self.assertEqual([s for s, _ in got[-2:]], [n - 1, 5])
        print(f"\ndump_lines: {n} dumps matched to their lines in {took:.2f} s")

    def test_dump_line_is_the_writers(self):
        for line in DUMP_LINES:
            self.assertEqual(_tensorboard.dump_line(json.loads(line)), line)

    def test_event_file_names(self):
        name = _tensorboard.events_file_name(seconds=42, host="node-1.example.org", pid=7)
        self.assertEqual(name, "events.out.tfevents.0000000042.node-1_example_org.7.tensortap")
        self.assertTrue(_names.is_run_file_name(name))
        self.assertTrue(_names.is_events_file_name(name))
        for other in ("events.out.tfevents.tensortap", "events.out.tfevents.1.h.2", "x.tensortap", "run.jsonl"):
            self.assertFalse(_names.is_run_file_name(other), other)
        self.assertTrue(_names.is_run_file_name("stats.npy"))


class ExportTest(TempCase):
    def make(self, **kwargs):
        kwargs.setdefault("records", rich_records())
        kwargs.setdefault("stats", rich_stats())
        kwargs.setdefault("dumps", DUMP_LINES)
        return make_run(self.run_dir, **kwargs)

    def test_values_read_back_with_tensorboard(self):
        self.make()
        paths = export(self.run_dir, self.logdir, histograms_every=2)
        self.assertEqual(len(paths), 1)
        folder = os.path.join(self.logdir, "exp")
        self.assertEqual(os.path.dirname(paths[0]), folder)
        self.assertRegex(os.path.basename(paths[0]), r"^events\.out\.tfevents\.\d{10}\.[A-Za-z0-9_-]+\.\d+\.tensortap$")
        acc = accumulator(paths[0])
        run = tensortap.open(self.run_dir)

        # Statistics: every row, each of the five a float32 of the table's
        # value; the counts are not written, their sum is nonfinite (both
        # series have an Inf from their first step).
        table, series = run.stats_table()
        for row in table:
            kind, name = series[int(row["series"])]
            for f in ("mean", "std", "min", "max", "norm"):
                got = [e.value for e in acc.Scalars(f"{kind}/{name}/{f}") if e.step == row["step"]]
                want = tb_check.f32(row[f])
                self.assertEqual(len(got), 1, (kind, name, f, int(row["step"])))
                self.assertTrue(got[0] == want or (np.isnan(got[0]) and np.isnan(want)), (f, got, want))
        scalar_tags = acc.Tags()["scalars"]
        for f in ("nan", "posinf", "neginf", "zeros", "numel"):
            self.assertFalse([t for t in scalar_tags if t.endswith("/" + f)], f)
        self.assertEqual([(e.step, e.value) for e in acc.Scalars("grad/w/nonfinite")],
                         [(0, 1.0), (1, 1.0), (2, 2.0), (3, 1.0), (4, 1.0), (5, 1.0)])
        self.assertEqual({e.value for e in acc.Scalars("activation/h/nonfinite")}, {3.0})

        # 0-d tensors: the element as a float32 (bool 0/1); complex gives none.
        loss = {e.step: e.value for e in acc.Scalars("tensor/loss")}
        self.assertEqual(loss, {s: float(np.float32(1.0 / (s + 3))) for s in range(-2, 6)})
        lr = {e.step: e.value for e in acc.Scalars("tensor/lr")}
        self.assertEqual(lr, {s: float(np.float32(0.1 * 0.9 ** s)) for s in range(-2, 6)})
        self.assertEqual([(e.step, e.value) for e in acc.Scalars("tensor/flag")], [(0, 1.0), (1, 0.0)])
        self.assertEqual([(e.step, e.value) for e in acc.Scalars("tensor/count")], [(2, float(2 ** 40))])
        # As a double first, as the recorder does: 2**62 + 2**38 (a tie) to float32 is 2**62.
        self.assertEqual([e.value for e in acc.Scalars("tensor/big")], [float(2 ** 62)])
        nanloss = acc.Scalars("tensor/nanloss")
        self.assertTrue(np.isnan(nanloss[0].value) and nanloss[1].value == -np.inf)
        self.assertNotIn("tensor/z", acc.Tags()["scalars"])

        # Histograms at steps -2, 0, 2, 4, against NumPy on the records.
        self.assertEqual(sorted(e.step for e in acc.Histograms("grad/w")), [-2, 0, 2, 4])
        for e in acc.Histograms("grad/w"):
            a = run.load("w", e.step, kind="grad").astype(np.float64)
            a = a[np.isfinite(a)]
            h = e.histogram_value
            self.assertEqual((h.num, h.min, h.max), (a.size, a.min(), a.max()))
            self.assertAlmostEqual(h.sum, a.sum(), delta=1e-9)
            self.assertAlmostEqual(h.sum_squares, (a * a).sum(), delta=1e-9)
            self.assertEqual(sum(h.bucket), h.num)
            self.assertTrue(set(h.bucket_limit) <= tb_check.LIMIT_SET)
            self.assertIsNone(tb_check.histogram_problem(h))
        (c,) = acc.Histograms("activation/c")
        want = np.abs(run.load("c", 0, kind="activation").astype(np.complex128))
        self.assertEqual((c.histogram_value.min, c.histogram_value.max), (want.min(), want.max()))
        edges = acc.Histograms("activation/edges")
        self.assertEqual([e.histogram_value.num for e in edges], [16.0, 16.0])
        self.assertEqual(edges[0].histogram_value.max, DBL_MAX)
        tags = acc.Tags()["histograms"]
        for absent in ("activation/empty", "activation/allnan"):
            self.assertNotIn(absent, tags)  # no finite elements
        # A 0-d tensor is its one scalar: no histogram, not even at step 0.
        self.assertFalse([t for t in tags if t.startswith("tensor/")], tags)
        self.assertEqual([e.step for e in acc.Histograms("param/u8")], [4])

        # Dumps: text events, the dumps.jsonl line each.
        dumps = acc.Tensors("tensortap/dumps")
        self.assertEqual(sorted((e.step, e.tensor_proto.string_val[0].decode()) for e in dumps),
                         sorted((json.loads(d)["step"], d) for d in DUMP_LINES))
        self.assertEqual(acc.SummaryMetadata("tensortap/dumps").plugin_data.plugin_name, "text")

        counts = tb_check.check_events_against_run(folder, run, histograms_every=2, exported=True)
        self.assertEqual(counts["dumps"], 3)
        # Five a row, nonfinite in each row (12), and the 0-d tensors' 22.
        self.assertEqual(counts["scalars"], len(table) * 5 + 12 + 8 + 8 + 2 + 1 + 1 + 2)
        self.assertGreater(counts["histograms"], 10)
        # The layout: a chart per 0-d tensor, the loss first (the complex z
        # has no scalar, no chart); the gradients' norms, the activations' std.
        (layout,) = acc.Tensors("custom_scalars__config__")
        self.assertEqual(layout.step, 0)
        self.assertEqual(acc.SummaryMetadata("custom_scalars__config__").plugin_data.plugin_name, "custom_scalars")
        self.assertEqual(tb_check.layout_of(layout.tensor_proto), [
            (SCALARS, [(n, [f"^tensor/{n}$"]) for n in ("loss", "big", "count", "flag", "lr", "nanloss")]),
            (NORMS, [("w", ["^grad/w/norm$"])]),
            (STDS, [("h", ["^activation/h/std$"])])])

    def test_stats_all_ten_and_a_few(self):
        # Issue 47: TensorBoardOptions().stats({...}) and --stats: all ten
        # write the counts as they are, not nonfinite.
        self.make()
        rc, out, err = main_cli("tensorboard", self.run_dir, "--logdir", self.logdir, "--stats", "all")
        self.assertEqual(rc, 0, err)
        acc = accumulator(os.path.join(self.logdir, "exp"))
        with tensortap.open(self.run_dir) as run:
            table, series = run.stats_table()
            for row in table:
                kind, name = series[int(row["series"])]
                for f in tb_check.STATS_FIELDS:
                    got = [e.value for e in acc.Scalars(f"{kind}/{name}/{f}") if e.step == row["step"]]
                    want = tb_check.f32(row[f])
                    self.assertEqual(len(got), 1, (kind, name, f, int(row["step"])))
                    self.assertTrue(got[0] == want or (np.isnan(got[0]) and np.isnan(want)), (f, got, want))
            self.assertFalse([t for t in acc.Tags()["scalars"] if t.endswith("/nonfinite")])
            counts = tb_check.check_events_against_run(os.path.join(self.logdir, "exp"), run,
                                                       stats=tb_check.STATS_FIELDS, exported=True)
            self.assertEqual(counts["scalars"], len(table) * 10 + 22)
        few = os.path.join(self.tmp, "few")
        rc, out, err = main_cli("tensorboard", self.run_dir, "--logdir", few, "--stats", "norm,zeros")
        self.assertEqual(rc, 0, err)
        acc = accumulator(os.path.join(few, "exp"))
        self.assertEqual({t.rsplit("/", 1)[1] for t in acc.Tags()["scalars"] if not t.startswith("tensor/")},
                         {"norm", "zeros", "nonfinite"})
        (layout,) = acc.Tensors("custom_scalars__config__")
        self.assertEqual([c for c, _ in tb_check.layout_of(layout.tensor_proto)],
                         ["tensortap: 0-d tensors (loss, learning rate)", "tensortap: gradient norms"])
        tb_check.check_events_against_run(os.path.join(few, "exp"), self.run_dir, stats=("norm", "zeros"),
                                          exported=True)
        rc, out, err = main_cli("tensorboard", self.run_dir, "--logdir", os.path.join(self.tmp, "bad"),
                                "--stats", "mean,median")
        self.assertEqual(rc, 2)
        self.assertIn("'median' is not a statistic", err)
        with self.assertRaisesRegex(ValueError, "'median' is not a statistic"):
            export(self.run_dir, os.path.join(self.tmp, "bad"), stats=["median"])
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "bad")))

    def test_the_runs_own_setting_is_the_default(self):
        # A recorder that wrote all ten says so in run.json; its export too.
        self.make()
        with open(os.path.join(self.run_dir, "run.json")) as f:
            info = json.load(f)
        info["options"]["tensorboard"] = {"histograms_every": 100, "stats": ["std", "nan"]}
        with open(os.path.join(self.run_dir, "run.json"), "w") as f:
            json.dump(info, f)
        export(self.run_dir, self.logdir)
        acc = accumulator(os.path.join(self.logdir, "exp"))
        self.assertEqual({t.rsplit("/", 1)[1] for t in acc.Tags()["scalars"] if not t.startswith("tensor/")},
                         {"std", "nan"})
        tb_check.check_events_against_run(os.path.join(self.logdir, "exp"), self.run_dir, exported=True)

    def test_a_0d_tensor_with_only_statistics_rows_is_its_scalar(self):
        # A statistics-only run (or a held one) has rows and no records: a
        # series of one value is a 0-d tensor's, written as tensor/<name>
        # from its row, as the recorder writes a CUDA tensor's.
        one = lambda v, nan=0, posinf=0, neginf=0: (v, v, v, 0.0, abs(v), nan, posinf, neginf, 0, 1)  # noqa: E731
        rows = [(0, "tensor", "loss", one(2.5)), (1, "tensor", "loss", one(np.nan, nan=1)),
                (2, "tensor", "loss", one(np.nan, posinf=1)), (3, "tensor", "loss", one(1.25)),
                (0, "tensor", "w", one(4.0)), (0, "grad", "g", one(3.0)),
                (0, "tensor", "z", one(5.0)), (1, "tensor", "z", one(5.0))]
        # "w" is stored with shape [1]: not 0-d, its statistics as any tensor's.
        # "z" is a complex 0-d tensor: no scalar at all, as the recorder writes.
        make_run(self.run_dir, records=[("tensor", "w", 0, np.array([4.0], np.float32)),
                                        ("tensor", "loss", 3, np.float32(1.25)),
                                        ("tensor", "z", 0, np.complex64(3 + 4j))], stats=rows)
        export(self.run_dir, self.logdir)
        acc = accumulator(os.path.join(self.logdir, "exp"))
        loss = [(e.step, e.value) for e in acc.Scalars("tensor/loss")]
        self.assertEqual([s for s, _ in loss], [0, 1, 2, 3])  # step 3 once: from its record
        self.assertEqual(loss[0][1], 2.5)
        self.assertTrue(np.isnan(loss[1][1]))
        self.assertEqual(loss[2][1], np.inf)
        tags = acc.Tags()["scalars"]
        self.assertFalse([t for t in tags if t.startswith("tensor/loss/")], tags)
        self.assertIn("tensor/w/norm", tags)
        self.assertIn("grad/g/norm", tags)  # one value, but not a tensor record
        self.assertFalse([t for t in tags if t.startswith("tensor/z")], tags)
        tb_check.check_events_against_run(os.path.join(self.logdir, "exp"), self.run_dir, exported=True)

    def test_events_come_in_step_order(self):
        self.make()
        (path,) = export(self.run_dir, self.logdir, histograms_every=2)
        _, loader, _ = tb_check.tensorboard()
        steps = [e.step for e in loader.LegacyEventFileLoader(path).Load()]
        self.assertEqual(steps[:2], [0, 0])  # the file version, the layout
        self.assertEqual(steps[2:], sorted(steps[2:]))

    def test_histograms_every(self):
        self.make()
        for every, steps in ((0, []), (3, [0, 3]), (1, [-2, -1, 0, 1, 2, 3, 4, 5])):
            logdir = os.path.join(self.tmp, f"every{every}")
            (path,) = export(self.run_dir, logdir, histograms_every=every)
            acc = accumulator(path)
            if not steps:
                self.assertEqual(acc.Tags()["histograms"], [])
            else:
                self.assertEqual(sorted(e.step for e in acc.Histograms("grad/w")), steps)
            tb_check.check_events_against_run(os.path.join(logdir, "exp"), self.run_dir, histograms_every=every,
                                              exported=True)
        for bad in (-1, 1.5, "2"):
            with self.assertRaises(ValueError):
                export(self.run_dir, self.logdir, histograms_every=bad)

    def test_an_older_run_without_dumps_jsonl(self):
        # Dumps only in run.json: each written as the writer prints its line.
        self.make(lines=False)
        export(self.run_dir, self.logdir)
        acc = accumulator(os.path.join(self.logdir, "exp"))
        self.assertEqual(sorted(e.tensor_proto.string_val[0].decode() for e in acc.Tensors("tensortap/dumps")),
                         sorted(DUMP_LINES))
        tb_check.check_events_against_run(os.path.join(self.logdir, "exp"), self.run_dir, exported=True)

    def test_a_run_cut_short_exports_dumps_jsonl(self):
        self.make(closed=False)
        with open(os.path.join(self.run_dir, "run.json")) as f:
            info = json.load(f)
        info["dumps"] = []
        with open(os.path.join(self.run_dir, "run.json"), "w") as f:
            json.dump(info, f)
        export(self.run_dir, self.logdir)
        counts = tb_check.check_events_against_run(os.path.join(self.logdir, "exp"), self.run_dir, exported=True)
        self.assertEqual(counts["dumps"], 3)

    def test_a_name_that_is_not_utf8(self):
        # The writer escapes a byte that is not UTF-8 as \udcxx; the tag
        # must be UTF-8 for TensorBoard's parser: U+FFFD.
        make_run(self.run_dir, records=[("tensor", "loss\udcff", 0, np.float32(2.0)),
                                        ("grad", "w\udcfe", 0, np.ones(3, np.float32))],
                 stats=[(0, "grad", "w\udcfe", (1, 1, 1, 0, 1.7, 0, 0, 0, 0, 3))])
        export(self.run_dir, self.logdir)
        acc = accumulator(os.path.join(self.logdir, "exp"))
        self.assertEqual([e.value for e in acc.Scalars("tensor/loss\ufffd")], [2.0])
        self.assertEqual(len(acc.Histograms("grad/w\ufffd")), 1)
        self.assertEqual([e.value for e in acc.Scalars("grad/w\ufffd/norm")], [float(np.float32(1.7))])
        tb_check.check_events_against_run(os.path.join(self.logdir, "exp"), self.run_dir, exported=True)

    def test_a_run_without_statistics_or_records(self):
        make_run(self.run_dir)
        (path,) = export(self.run_dir, self.logdir)
        _, loader, _ = tb_check.tensorboard()
        events = list(loader.LegacyEventFileLoader(path).Load())
        self.assertEqual([e.file_version for e in events], ["brain.Event:2", ""])
        self.assertEqual(events[1].summary.value[0].tag, "custom_scalars__config__")
        tb_check.check_events_against_run(os.path.join(self.logdir, "exp"), self.run_dir, exported=True)

    def test_a_record_that_cannot_be_read_is_skipped_with_a_warning(self):
        self.make()
        os.unlink(os.path.join(self.run_dir, "npy", "grad", "r0", "-0000002.npy"))
        (path,), messages = export_warned(self.run_dir, self.logdir, histograms_every=2)
        self.assertEqual(len(messages), 1, messages)
        self.assertIn("'w' step -2 is not exported", messages[0])
        self.assertEqual(sorted(e.step for e in accumulator(path).Histograms("grad/w")), [0, 2, 4])

    def test_a_truncated_statistics_table_costs_only_the_statistics(self):
        # Round 4: a truncated stats.npy failed the whole export, records and
        # dumps included. Now its statistics are left out with a warning.
        self.make()
        table = os.path.join(self.run_dir, "stats.npy")
        os.truncate(table, os.path.getsize(table) - 10)
        (path,), messages = export_warned(self.run_dir, self.logdir, histograms_every=2)
        self.assertEqual(len(messages), 1, messages)
        self.assertIn("statistics are not exported", messages[0])
        self.assertIn("stats.npy", messages[0])
        acc = accumulator(path)
        tags = acc.Tags()
        self.assertFalse([t for t in tags["scalars"] if t.endswith("/norm")], tags["scalars"])
        self.assertEqual(sorted(e.step for e in acc.Histograms("grad/w")), [-2, 0, 2, 4])
        self.assertTrue(acc.Tensors(_tensorboard.DUMPS_TAG))

    def test_a_0d_tensor_named_like_a_statistics_tag_is_said_once(self):
        # Round 4, as the recorder says it (test_tensorboard.cpp): the tags
        # stay, the collision is named once.
        ten = (0.0, 1.0, 0.5, 0.5, 1.0, 0, 0, 0, 0, 4)
        make_run(self.run_dir, records=[("tensor", "x/norm", s, np.float32(s)) for s in range(3)]
                 + [("tensor", "y/size", 0, np.float32(1))],
                 stats=[(s, "tensor", "x", ten) for s in range(3)] + [(0, "tensor", "y", ten)])
        _, messages = export_warned(self.run_dir, self.logdir)
        self.assertEqual(len(messages), 1, messages)
        self.assertIn("the 0-d tensor 'x/norm' and the statistics of the tensor 'x' both write the TensorBoard tag "
                      "'tensor/x/norm'", messages[0])

    def test_the_checker_takes_events_in_any_order(self):
        # The recorder writes events as they come: checked all the same.
        self.make()
        (path,) = export(self.run_dir, self.logdir, histograms_every=2)
        _, _, masked = tb_check.tensorboard()
        events = tb_check.frames(path, masked)
        rng = np.random.default_rng(3)
        # The layout stays the second event, at step 0, as the export writes it.
        rest = [events[i] for i in rng.permutation(len(events) - 2) + 2]
        shuffled = os.path.join(self.tmp, "shuffled")
        os.makedirs(shuffled)
        with open(os.path.join(shuffled, os.path.basename(path)), "wb") as f:
            f.write(b"".join(_tensorboard.frame(e) for e in events[:2] + rest))
        tb_check.check_events_against_run(shuffled, self.run_dir, histograms_every=2, exported=True)
        # And it finds what is wrong: a histogram at a step it does not belong to.
        with self.assertRaises(AssertionError):
            tb_check.check_events_against_run(shuffled, self.run_dir, histograms_every=4, exported=True)
        # A torn or damaged record.
        with open(os.path.join(shuffled, os.path.basename(path)), "r+b") as f:
            f.seek(-3, os.SEEK_END)
            f.write(b"\0\0\0")
        with self.assertRaisesRegex(AssertionError, "CRC"):
            tb_check.check_events_against_run(shuffled, self.run_dir, histograms_every=2, exported=True)

    def test_the_run_method(self):
        self.make()
        with tensortap.open(self.run_dir) as run:
            paths = run.export_tensorboard(self.logdir, histograms_every=5)
        self.assertEqual(len(paths), 1)
        tb_check.check_events_against_run(os.path.join(self.logdir, "exp"), self.run_dir, histograms_every=5,
                                          exported=True)


class LayoutTest(TempCase):
    """The custom scalars layout at a real model's size (issue 58, EVENTS.md
    "The layout"). Each failed on the old export, which wrote three fixed
    regular expressions: one chart of every 0-d tensor, one of every
    gradient's norm, one of every activation's std."""

    def layout(self, records=(), stats=(), **kwargs):
        """The one layout the export of such a run writes, as (category,
        [(chart, [regex])]), once tb_check has checked the whole export."""
        make_run(self.run_dir, records=records, stats=stats)
        (path,) = export(self.run_dir, self.logdir, **kwargs)
        tb_check.check_events_against_run(os.path.dirname(path), self.run_dir, exported=True, **kwargs)
        (event,) = accumulator(path).Tensors("custom_scalars__config__")
        self.assertEqual(event.step, 0)
        return tb_check.layout_of(event.tensor_proto)

    def charts(self, layout, category):
        (charts,) = [c for t, c in layout if t == category]
        return charts

    def test_a_chart_per_0d_tensor_the_loss_first(self):
        records = [("tensor", n, s, np.float32(s + k)) for s in range(3)
                   for k, n in enumerate(("lr", "acc", "loss", "alpha"))]
        records += [("tensor", "z", 0, np.complex64(1j)), ("tensor", "w", 0, np.ones(4, np.float32))]
        # "beta": statistics rows alone (one value each); "w": a tensor's
        # statistics (tensor/w/norm...), not a 0-d tensor; "z": complex, no scalar.
        stats = [(s, "tensor", "beta", (1.0, 1.0, 1.0, 0.0, 1.0, 0, 0, 0, 0, 1)) for s in range(2)]
        stats += [(0, "tensor", "w", ten(1.0))]
        layout = self.layout(records, stats)
        self.assertEqual(layout, [(SCALARS, [(n, [f"^tensor/{n}$"]) for n in ("loss", "acc", "alpha", "beta", "lr")])])

    def test_36_gradients_in_charts_of_16_by_module(self):
        # A model of 36 gradients: enc 20 (two charts), dec 10, head 4, and
        # "late.bias", first seen at step 5 (the export knows every name: its
        # one layout, at step 0, charts it).
        grads = ([f"enc.layers.{i}.weight" for i in range(20)] + [f"dec.{i}.weight" for i in range(10)]
                 + [f"head.{i}" for i in range(5)] + ["late.bias"])
        acts = ["enc.0", "enc.1", "dec", "head.out"]
        stats = [(s, "grad", g, ten(s + 0.5)) for s in range(2) for g in grads[:-1]]
        stats += [(5, "grad", "late.bias", ten(1))]
        stats += [(s, "activation", a, ten(s)) for s in range(2) for a in acts]
        layout = self.layout(stats=stats)
        self.assertEqual([t for t, _ in layout], [NORMS, STDS])
        norms = self.charts(layout, NORMS)
        self.assertEqual(len(grads), 36)
        self.assertEqual([(t, len(r)) for t, r in norms],
                         [("dec", 10), ("enc (1/2)", 16), ("enc (2/2)", 4), ("head", 5), ("late", 1)])
        enc = sorted(g for g in grads if g.startswith("enc."))
        self.assertEqual(norms[1][1] + norms[2][1], ["^grad/" + g.replace(".", "\\.") + "/norm$" for g in enc])
        self.assertEqual(self.charts(layout, STDS), [("dec", ["^activation/dec/std$"]),
                                                     ("enc", ["^activation/enc\\.0/std$", "^activation/enc\\.1/std$"]),
                                                     ("head", ["^activation/head\\.out/std$"])])
        # Without norm among the statistics written: no gradients' charts.
        (path,) = export(self.run_dir, os.path.join(self.tmp, "std"), stats=("std", "max"))
        (event,) = accumulator(path).Tensors("custom_scalars__config__")
        self.assertEqual([t for t, _ in tb_check.layout_of(event.tensor_proto)], [STDS])

    def test_a_model_under_one_top_level_module_splits_at_its_second(self):
        cases = [
            # Every parameter under model.: grouped by model.<child>; a name
            # without a second separator is its own group.
            (("model.enc.0.weight", "model.enc.0.bias", "model.dec.weight", "model.bias"),
             [("model.bias", 1), ("model.dec", 1), ("model.enc", 2)]),
            # A watch prefix is the first component: G and D apart...
            (("G/0.weight", "G/1.weight", "D/0.weight"), [("D", 1), ("G", 2)]),
            # ...and, alone, split at the next '.' or '/'.
            (("G/0.weight", "G/0.bias", "G/1/w", "G"), [("G", 1), ("G/0", 2), ("G/1", 1)]),
            # Nothing deeper: one group.
            (("fc",), [("fc", 1)]),
            # A group is all of its module's names, though "enc-dec.w" sorts
            # between them ('-' before '.'), and groups go by the module's name.
            (("enc.w", "enc-dec.w", "enc"), [("enc", 2), ("enc-dec", 1)]),
        ]
        for k, (names, want) in enumerate(cases):
            with self.subTest(names=names):
                self.logdir = os.path.join(self.tmp, f"logs{k}")
                shutil.rmtree(self.run_dir, ignore_errors=True)
                layout = self.layout(stats=[(0, "grad", n, ten(1.0)) for n in names])
                self.assertEqual([(t, len(r)) for t, r in self.charts(layout, NORMS)], want)

    def test_names_with_regex_specials_and_slashes_are_escaped(self):
        # Each expression matches its own tag and no other: unescaped, "w.1"
        # would match "wx1" too, "a+" "aa", "(x)" "x".
        names = ["w.1", "wx1", "a+", "aa", "(x)", "x", "blk[0]/w|b", "s$t^", "q?*{2}", "sp ace\tand-dash~#&",
                 "back\\slash"]
        layout = self.layout(records=[("tensor", n, 0, np.float32(1)) for n in names],
                             stats=[(0, "grad", "enc/" + n, ten(1.0)) for n in names])
        scalars = self.charts(layout, SCALARS)
        self.assertEqual([t for t, _ in scalars], sorted(names))
        for title, regexes in scalars:
            self.assertEqual(regexes, ["^" + re.escape("tensor/" + title) + "$"])
        self.assertIn(("w.1", ["^tensor/w\\.1$"]), scalars)
        self.assertIn(("blk[0]/w|b", ["^tensor/blk\\[0\\]/w\\|b$"]), scalars)
        tags = ["tensor/" + n for n in names] + [f"grad/enc/{n}/norm" for n in names]
        for _, charts in layout:
            for _, regexes in charts:
                for r in regexes:
                    self.assertEqual(len([t for t in tags if re.match(r, t)]), 1, r)
        # All under enc/: split at the second component, at a '/' or a '.'.
        self.assertEqual([t for t, _ in self.charts(layout, NORMS)],
                         sorted({"enc/" + re.split("[./]", n)[0] for n in names}))

    def test_names_not_utf8_are_charted_as_their_tags_in_the_tags_order(self):
        # A byte that is not UTF-8 is U+FFFD in the tag, and the charts follow
        # the tags' order: "a\udcff" (a\ufffd) after "a\ue000", though its
        # surrogate sorts before. Two names that give one tag are one series.
        names = ["a\udcff.w", "a\ue000.w", "a\u00e9.w", "b\udcfe", "b\udcff"]
        layout = self.layout(records=[("tensor", "loss\udcff", 0, np.float32(1)), ("tensor", "loss", 0, np.float32(2))],
                             stats=[(0, "grad", n, ten(1.0)) for n in names])
        self.assertEqual(layout, [
            (SCALARS, [("loss", ["^tensor/loss$"]), ("loss\ufffd", ["^tensor/loss\ufffd$"])]),
            (NORMS, [("a\u00e9", ["^grad/a\u00e9\\.w/norm$"]), ("a\ue000", ["^grad/a\ue000\\.w/norm$"]),
                     ("a\ufffd", ["^grad/a\ufffd\\.w/norm$"]), ("b\ufffd", ["^grad/b\ufffd/norm$"])])])

    def test_the_checker_holds_the_recorder_to_its_rules(self):
        # The recorder writes the layout again as names come, at the highest
        # step written so far; the checker (tb_check, exported=False) takes
        # that, and finds a layout written at a lower step, a last layout
        # that lacks a name, a chart of 17 series, an expression not anchored.
        make_run(self.run_dir, records=[("tensor", "loss", s, np.float32(s)) for s in range(4)],
                 stats=[(s, "grad", "a.w", ten(s)) for s in range(4)] + [(s, "grad", "b.w", ten(s)) for s in (2, 3)])
        (path,) = export(self.run_dir, self.logdir)
        from tensorboard.compat.proto import event_pb2

        _, _, masked = tb_check.tensorboard()
        frames = tb_check.frames(path, masked)
        first, rest = frames[0], frames[2:]
        steps = [event_pb2.Event.FromString(f).step for f in rest]
        rest = [f for _, f in sorted(zip(steps, rest), key=lambda p: p[0])]
        steps.sort()

        def layout_event(step, names):
            charts = tb_check.expected_layout(["loss"], names)
            return _tb_events._event(step, _tb_events._summary(_tb_events._custom_scalars_value(charts)))

        def check(*layouts, exported=False):
            """The events with layouts[i] = (step, names) after the events of steps <= i's position."""
            out = [first]
            for k, (f, step) in enumerate(zip(rest, steps)):
                out.append(f)
                out += [layout_event(s, names) for after, s, names in layouts if after == k]
            folder = os.path.join(self.tmp, "recorder")
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            with open(os.path.join(folder, os.path.basename(path)), "wb") as f:
                f.write(b"".join(_tensorboard.frame(e) for e in out))
            return tb_check.check_events_against_run(folder, self.run_dir, exported=exported)

        at_2 = steps.index(2)  # after the first event of step 2 (b.w's first row comes at it or later)
        last = len(rest) - 1
        good = [(0, 0, ["a.w"]), (last, steps[-1], ["a.w", "b.w"])]
        check(*good)
        with self.assertRaisesRegex(AssertionError, "2 custom scalars layouts, not one"):
            check(*good, exported=True)
        with self.assertRaisesRegex(AssertionError, "a layout at step 1 .* after an event at step 3"):
            check(good[0], (last, 1, ["a.w", "b.w"]))
        with self.assertRaisesRegex(AssertionError, "the last layout"):
            check(good[0], (at_2, 2, ["a.w"]))
        self.assertIsNone(tb_check.layout_problem([("c", [("t", ["^x$"] * 1)])], ["x"]))
        self.assertRegex(tb_check.layout_problem([("c", [("t", [f"^x{i}$" for i in range(17)])])],
                                                 [f"x{i}" for i in range(17)]), "17 series")
        self.assertRegex(tb_check.layout_problem([("c", [("t", ["x"])])], ["x"]), "not anchored")
        self.assertRegex(tb_check.layout_problem([("c", [("t", ["^x.*$"])])], ["x", "xy"]), "matches 2 tags")


class WhereTest(TempCase):
    def test_into_the_run_then_refused_there(self):
        make_run(self.run_dir, records=rich_records(), stats=rich_stats(), dumps=DUMP_LINES)
        rc, out, err = main_cli("tensorboard", self.run_dir, "--histograms-every", "2")
        self.assertEqual(rc, 0, err)
        (name,) = [n for n in os.listdir(self.run_dir) if n.startswith("events.")]
        self.assertEqual(out, f"tensortap: wrote {os.path.join(self.run_dir, name)}\n")
        tb_check.check_events_against_run(self.run_dir, self.run_dir, histograms_every=2, exported=True)
        # Every name the run holds is one tensortap writes.
        self.assertTrue(all(_names.is_run_file_name(n) for n in os.listdir(self.run_dir)))
        # Again: refused, naming the file; nothing more written.
        before = listing(self.tmp)
        rc, out, err = main_cli("tensorboard", self.run_dir)
        self.assertEqual(rc, 2)
        self.assertEqual(out, "")
        self.assertIn(os.path.join(self.run_dir, name), err)
        self.assertIn("--logdir", err)
        self.assertEqual(listing(self.tmp), before)
        # With --logdir it goes elsewhere; there too, only once.
        rc, out, err = main_cli("tensorboard", self.run_dir, "--logdir", self.logdir)
        self.assertEqual(rc, 0, err)
        self.assertIn(os.path.join(self.logdir, "exp", "events.out.tfevents."), out)
        rc, out, err = main_cli("tensorboard", self.run_dir, "--logdir", self.logdir)
        self.assertEqual(rc, 2)
        self.assertIn(os.path.join(self.logdir, "exp", "events.out.tfevents."), err)

    def test_the_recorders_events_refuse_an_export_into_the_run(self):
        make_run(self.run_dir, records=rich_records())
        planted = os.path.join(self.run_dir, "events.out.tfevents.1700000000.host.1.tensortap")
        with open(planted, "wb"):
            pass
        with self.assertRaises(tensortap.RunError) as cm:
            export(self.run_dir)
        self.assertIn(planted, str(cm.exception))
        self.assertIn("--logdir", str(cm.exception))
        self.assertEqual([n for n in os.listdir(self.run_dir) if n.startswith("events.")], [os.path.basename(planted)])
        # Another tool's events there are not tensortap's: no refusal.
        os.unlink(planted)
        with open(os.path.join(self.run_dir, "events.out.tfevents.1700000000.host"), "wb"):
            pass
        self.assertEqual(len(export(self.run_dir)), 1)

    def test_cli_errors(self):
        rc, out, err = main_cli("tensorboard", os.path.join(self.tmp, "nothing"))
        self.assertEqual(rc, 2)
        self.assertIn("not a tensortap run", err)
        make_run(self.run_dir)
        rc, out, err = main_cli("tensorboard", self.run_dir, "--histograms-every", "-1")
        self.assertEqual(rc, 2)
        self.assertIn("--histograms-every", err)
        # A logdir that is a file.
        with open(os.path.join(self.tmp, "file"), "w"):
            pass
        rc, out, err = main_cli("tensorboard", self.run_dir, "--logdir", os.path.join(self.tmp, "file"))
        self.assertEqual(rc, 2)
        self.assertIn(os.path.join(self.tmp, "file"), err)

    def test_a_link_at_the_target_is_refused_and_nothing_written_outside(self):
        make_run(self.run_dir, records=rich_records())
        outside = os.path.join(self.tmp, "outside")
        os.makedirs(outside)
        os.makedirs(self.logdir)
        os.symlink(outside, os.path.join(self.logdir, "exp"))
        with self.assertRaises(tensortap.RunError) as cm:
            export(self.run_dir, self.logdir)
        self.assertIn(os.path.join(self.logdir, "exp"), str(cm.exception))
        self.assertIn("symbolic link", str(cm.exception))
        self.assertEqual(os.listdir(outside), [])
        # A dangling link too: nothing made where it points.
        os.unlink(os.path.join(self.logdir, "exp"))
        os.symlink(os.path.join(outside, "made"), os.path.join(self.logdir, "exp"))
        with self.assertRaisesRegex(tensortap.RunError, "symbolic link"):
            export(self.run_dir, self.logdir)
        self.assertEqual(os.listdir(outside), [])

    def test_a_link_at_the_file_is_never_followed(self):
        outside = os.path.join(self.tmp, "outside.txt")
        with open(outside, "w") as f:
            f.write("mine")
        folder = os.path.join(self.tmp, "folder")
        os.makedirs(folder)
        name = "events.out.tfevents.0000000001.h.1.tensortap"
        os.symlink(outside, os.path.join(folder, name))
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with self.assertRaisesRegex(tensortap.RunError, "already there"):
                _tensorboard._write_file(fd, name, os.path.join(folder, name), [b"x"])
        finally:
            os.close(fd)
        with open(outside) as f:
            self.assertEqual(f.read(), "mine")
        self.assertTrue(os.path.islink(os.path.join(folder, name)))
        # And an export into that folder is refused before it gets there.
        make_run(self.run_dir, records=rich_records())
        os.symlink(outside, os.path.join(self.run_dir, name))
        with self.assertRaisesRegex(tensortap.RunError, name):
            export(self.run_dir)
        with open(outside) as f:
            self.assertEqual(f.read(), "mine")

    def make_ranks(self, top=None):
        top = top or self.run_dir
        for r in range(2):
            records = [(k, n, s, a + r if np.asarray(a).dtype.kind in "fiu" else a)
                       for k, n, s, a in rich_records(seed=r)]
            make_run(os.path.join(top, f"rank{r}"), records=records, stats=rich_stats()[r:],
                     dumps=DUMP_LINES[r:], rank=r, world_size=2)
        return top

    def test_multi_rank_layout(self):
        self.make_ranks()
        paths = export(self.run_dir, self.logdir, histograms_every=2)
        self.assertEqual([os.path.relpath(os.path.dirname(p), self.logdir) for p in paths],
                         [os.path.join("exp", "rank0"), os.path.join("exp", "rank1")])
        self.assertEqual(sorted(os.listdir(os.path.join(self.logdir, "exp"))), ["rank0", "rank1"])
        counts = tb_check.check_events_against_run(os.path.join(self.logdir, "exp"), self.run_dir, histograms_every=2,
                                                   exported=True)
        self.assertEqual(counts["files"], 2)
        self.assertEqual(counts["dumps"], 3 + 2)
        # Each rank's own values.
        acc0 = accumulator(os.path.join(self.logdir, "exp", "rank0"))
        acc1 = accumulator(os.path.join(self.logdir, "exp", "rank1"))
        self.assertEqual([e.value for e in acc1.Scalars("tensor/loss") if e.step == 0],
                         [float(np.float32(1.0 / 3 + 1))])
        self.assertEqual(len(acc0.Tensors("tensortap/dumps")), 3)
        # Into the run: each rank's folder.
        paths = export(self.run_dir, histograms_every=2)
        self.assertEqual([os.path.dirname(p) for p in paths],
                         [os.path.join(self.run_dir, "rank0"), os.path.join(self.run_dir, "rank1")])
        tb_check.check_events_against_run(self.run_dir, self.run_dir, histograms_every=2, exported=True)
        # One rank of it.
        with tensortap.open(self.run_dir, rank=1) as run:
            (path,) = export(run, os.path.join(self.tmp, "one"))
        self.assertEqual(os.path.dirname(path), os.path.join(self.tmp, "one", "exp", "rank1"))

    def test_multi_rank_refusals_write_nothing(self):
        self.make_ranks()
        # A link at one rank's folder below the logdir: refused before any rank is written.
        outside = os.path.join(self.tmp, "outside")
        os.makedirs(outside)
        os.makedirs(os.path.join(self.logdir, "exp"))
        os.symlink(outside, os.path.join(self.logdir, "exp", "rank1"))
        with self.assertRaisesRegex(tensortap.RunError, "rank1: a symbolic link"):
            export(self.run_dir, self.logdir)
        self.assertEqual(listing(self.logdir), [])
        self.assertEqual(os.listdir(outside), [])
        # The recorder's events in one rank: the other is not written either.
        with open(os.path.join(self.run_dir, "rank1", "events.out.tfevents.1.h.2.tensortap"), "wb"):
            pass
        before = listing(self.run_dir)
        with self.assertRaisesRegex(tensortap.RunError, "rank1"):
            export(self.run_dir)
        self.assertEqual(listing(self.run_dir), before)
        # A failure while writing the second rank removes the first's file.
        os.unlink(os.path.join(self.run_dir, "rank1", "events.out.tfevents.1.h.2.tensortap"))
        before = listing(self.run_dir)
        real = _tensorboard.rank_events

        def failing(run, rank, every, stats):
            yield from real(run, rank, every, stats)
            if rank == 1:
                raise OSError(28, "No space left on device")

        with mock.patch.object(_tensorboard, "rank_events", failing):
            with self.assertRaisesRegex(OSError, "No space left on device"):
                export(self.run_dir)
        self.assertEqual(listing(self.run_dir), before)


class E2ETest(TempCase):
    def test_the_suites_runs(self):
        top = os.environ.get("TT_E2E_DIR")
        if not top:
            self.skipTest("TT_E2E_DIR is not set: no runs of the suite to export")
        runs = sorted(d for d in os.listdir(top) if os.path.isfile(os.path.join(top, d, "run.json"))
                      or os.path.isfile(os.path.join(top, d, "rank0", "run.json")))
        self.assertTrue(runs, top)
        for d in runs:
            with self.subTest(run=d):
                export(os.path.join(top, d), self.logdir, histograms_every=2)
                counts = tb_check.check_events_against_run(os.path.join(self.logdir, d), os.path.join(top, d),
                                                           histograms_every=2, exported=True)
                self.assertGreater(counts["events"], 1)


if __name__ == "__main__":
    unittest.main()
