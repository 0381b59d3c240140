"""`tensortap diff` at the edges (issue 56), on runs written here by the
twin's writer (no build, no torch):

    PYTHONPATH=python python3 tests/python/test_diff_edges.py

Each case failed before the fix: statistics that overflowed or went
through float64, a diff that stopped at the first unreadable record,
NumPy's RuntimeWarnings, bidi controls passed to the terminal, no filters
on the command line, and a command whose memory grew with every record.
"""

import contextlib
import io
import json
import math
import os
import shutil
import tempfile
import tracemalloc
import unittest
import warnings

import numpy as np

import chromium
import tensortap
from tensortap import __main__ as cli
from tensortap._writer import RunWriter, default_options


def command(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["diff", *args])
    return rc, out.getvalue(), err.getvalue()


def write_run(path, records):
    """A run of `records` [(kind, name, step, array, dtype)] by the twin's writer."""
    w = RunWriter(path, default_options(1, ["tensor"]), overwrite=True, rank=0, world_size=1)
    for kind, name, step, a, dtype in records:
        w.write(kind, name, step, np.asarray(a), dtype)
    w.close()
    return path


class Case(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-diff-edges-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def runs(self, a_records, b_records):
        return (write_run(os.path.join(self.tmp, "a"), a_records), write_run(os.path.join(self.tmp, "b"), b_records))

    def pair(self, a, b, dtype, **tol):
        ra, rb = self.runs([("tensor", "x", 0, a, dtype)], [("tensor", "x", 0, b, dtype)])
        df = tensortap.diff(ra, rb, **tol)
        return df.iloc[0]


class StatisticsTest(Case):
    def test_cosine_and_norms_do_not_overflow_at_1e200(self):
        a = np.full(1000, 1e200)
        row = self.pair(a, -a, "float64")
        self.assertAlmostEqual(row.cosine, -1.0, places=12)  # was +1: the float64 sums of squares overflowed
        self.assertAlmostEqual(row.rel_norm, 2.0, places=12)
        tiny = np.full(1000, 1e-200)
        row = self.pair(tiny, tiny * 1.5, "float64")
        self.assertAlmostEqual(row.cosine, 1.0, places=12)   # the squares underflow to 0 unscaled
        self.assertAlmostEqual(row.rel_norm, 0.5, places=12)

    def test_integers_are_differenced_as_integers(self):
        big = 2 ** 53 + 1
        for dtype, a, b, want in (("int64", [big, -big], [big + 1, -big], 1.0),
                                  ("uint64", [2 ** 64 - 1], [2 ** 64 - 2], 1.0),
                                  ("int64", [-(2 ** 63)], [2 ** 63 - 1], float(2 ** 64 - 1))):
            with self.subTest(dtype=dtype, a=a):
                row = self.pair(np.array(a, dtype=dtype), np.array(b, dtype=dtype), dtype)
                self.assertEqual((row.status, row.n_bad), ("differ", 1))
                self.assertEqual(row.max_abs, want)  # was 0: differenced through float64

    def test_ulps_only_where_the_tolerance_fails(self):
        one = np.float32(1)
        a = np.array([one, one], dtype=np.float32)
        b = np.array([np.nextafter(one, np.float32(2)), one + np.float32(0.5)], dtype=np.float32)
        row = self.pair(a, b, "float32", rtol=1e-3)
        self.assertEqual((row.status, row.n_bad), ("differ", 1))
        self.assertEqual(row.max_ulp, float(np.float32(1.5).view(np.int32) - one.view(np.int32)))
        row = self.pair(a[:1], b[:1], "float32", rtol=1e-3)
        self.assertEqual((row.status, row.max_ulp), ("equal", 0.0))


class RobustnessTest(Case):
    def test_an_unreadable_record_is_a_difference_and_the_diff_goes_on(self):
        recs = [("grad", f"w{i}", 0, np.arange(64, dtype=np.float32) + i, "float32") for i in range(3)]
        a, b = self.runs(recs, recs)
        with open(os.path.join(b, "npy", "grad", "w1", "00000000.npy"), "r+b") as f:
            f.truncate(100)
        with open(os.path.join(b, "npy", "grad", "w2", "00000000.npy"), "wb") as f:
            f.write(b"not a .npy file at all")
        rc, out, err = command(a, b)
        self.assertEqual(rc, 1, out + err)  # was 2, at the first record
        self.assertIn("grad w1 step 0: unreadable: B: cannot be read from npy/grad/w1/00000000.npy", out)
        self.assertIn("grad w2 step 0: unreadable: B: cannot be read from npy/grad/w2/00000000.npy", out)
        self.assertEqual(out.splitlines()[-1], "compared 3, differ 2, only in A 0, only in B 0")
        df = tensortap.diff(a, b)
        self.assertEqual(list(df.status), ["equal", "unreadable", "unreadable"])
        self.assertIn("npy/grad/w2/00000000.npy", df.attrs["details"][2])
        # A file that holds another shape than its index line says.
        np.save(os.path.join(b, "npy", "grad", "w2", "00000000.npy"), np.zeros(3, np.float32))
        df = tensortap.diff(a, b)
        self.assertEqual(df.status.iloc[2], "unreadable")
        self.assertIn("holds shape [3], the index says [64]", df.attrs["details"][2])

    def test_no_runtime_warnings(self):
        inf, nan = np.inf, np.nan
        a = np.array([inf, -inf, nan, 1.0, 0.0, 1e308, -1e308, 0.0, inf], dtype=np.float64)
        b = np.array([-inf, 1.0, 2.0, nan, 0.0, -1e308, 1e308, 5e-324, inf], dtype=np.float64)
        with np.errstate(over="ignore"):  # 1e308 is inf in float32 and float16, 5e-324 is 0
            recs_a = [("tensor", "x", 0, a, "float64"), ("tensor", "y", 0, a.astype(np.float32), "float32"),
                      ("tensor", "z", 0, a.astype(np.float16), "float16")]
            recs_b = [("tensor", "x", 0, b, "float64"), ("tensor", "y", 0, b.astype(np.float32), "float32"),
                      ("tensor", "z", 0, b.astype(np.float16), "float16")]
        ra, rb = self.runs(recs_a, recs_b)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a RuntimeWarning fails the test (it printed several)
            df = tensortap.diff(ra, rb, rtol=1e-3)
            rc, out, err = command(ra, rb, "--rtol", "1e-3")
        self.assertEqual(rc, 1, err)
        self.assertNotIn("Warning", err)
        self.assertEqual(list(df.status), ["differ"] * 3)
        # All but the equal zeros and infinities (and 5e-324, a zero below float64).
        self.assertEqual(list(df.n_bad), [7, 6, 6])
        self.assertTrue(math.isinf(df.max_abs.iloc[0]) and math.isinf(df.max_ulp.iloc[0]))

    def test_control_and_bidi_characters_are_escaped_in_every_line(self):
        evil = "fc1\u202eexe.gpj\x1b[31m\u2066"
        ra, rb = self.runs([("activation", evil, 0, [1.0], "float32"), ("activation", evil + "2", 0, [1.0], "float32"),
                            ("grad", evil, 0, [1.0], "float32")],
                           [("activation", evil, 0, [2.0], "float32"), ("activation", evil + "2", 0, [3.0], "float32"),
                            ("param", evil, 0, [1.0], "float32")])
        rc, out, err = command(ra, rb)
        self.assertEqual(rc, 1)
        for line in (out + err).splitlines():
            self.assertFalse(any(c in line for c in "\u202e\u2066\x1b"), repr(line))
        self.assertIn("fc1\\u202eexe.gpj\\x1b[31m\\u2066", out)
        # The only-in lines, the first divergence and the listed ones: every one escaped.
        self.assertEqual(out.count("\\u202e"), len([x for x in out.splitlines() if evil[:3] in x]))


class RanksTest(Case):
    def test_a_single_rank_run_is_rank_0(self):
        single = write_run(os.path.join(self.tmp, "one"), [("grad", "w", s, np.full(3, s, np.float32), "float32")
                                                           for s in range(2)])
        two = os.path.join(self.tmp, "two")
        for rank in (0, 1):
            w = RunWriter(two, default_options(1, ["grad"]), overwrite=True, rank=rank, world_size=2)
            for s in range(2):
                w.write("grad", "w", s, np.full(3, s, np.float32), "float32")
            w.close()
        rc, out, _ = command(single, two)
        self.assertEqual(out.splitlines()[-1], "compared 2, differ 0, only in A 0, only in B 2")
        self.assertIn("  grad w step 0 rank 1", out)
        self.assertEqual(command(single, two, "--common-only")[0], 0)


class FilterTest(Case):
    def setUp(self):
        super().setUp()
        recs_a, recs_b = [], []
        for step in range(6):
            for kind, name in (("activation", "fc1"), ("activation", "fc2"), ("grad", "fc1.weight"),
                               ("grad", "skip.weight")):
                x = np.full(4, step, np.float32)
                recs_a.append((kind, name, step, x, "float32"))
                # B differs in fc2 from step 3, and in skip.weight everywhere.
                bad = (name == "fc2" and step >= 3) or name == "skip.weight"
                recs_b.append((kind, name, step, x + 1 if bad else x, "float32"))
        self.a, self.b = self.runs(recs_a, recs_b)

    def test_steps_kinds_and_exclude(self):
        rc, out, _ = command(self.a, self.b, "--steps", "0..2", "--exclude", "^skip")
        self.assertEqual((rc, out.splitlines()[-1]), (0, "compared 9, differ 0, only in A 0, only in B 0"))
        rc, out, _ = command(self.a, self.b, "--steps", "3..", "--kinds", "activation")
        self.assertEqual((rc, out.splitlines()[-1]), (1, "compared 6, differ 3, only in A 0, only in B 0"))
        self.assertTrue(out.startswith("first divergence: activation fc2 step 3: "), out)
        rc, out, _ = command(self.a, self.b, "--steps", "..4", "--kinds", "grad,activation", "--exclude", "skip|fc2")
        self.assertEqual((rc, out.splitlines()[-1]), (0, "compared 10, differ 0, only in A 0, only in B 0"))
        rc, out, _ = command(self.a, self.b, "--steps", "5")
        self.assertEqual(out.splitlines()[-1], "compared 4, differ 2, only in A 0, only in B 0")
        df = tensortap.diff(self.a, self.b, steps=(3, None), kinds=["activation"], exclude="fc1")
        self.assertEqual((len(df), set(df.name), set(df.status)), (3, {"fc2"}, {"differ"}))

    def test_bad_filters_exit_2_naming_them(self):
        for args, words in ((("--steps", "3..1"), "--steps"), (("--steps", "a..b"), "--steps"),
                            (("--steps", ".."), "--steps"), (("--kinds", "grad,weights"), "'weights' is not a kind"),
                            (("--exclude", "("), "--exclude"), (("--factor", "3"), "--floor")):
            with self.subTest(args=args):
                rc, out, err = command(self.a, self.b, *args)
                self.assertEqual(rc, 2, out + err)
                self.assertIn(words, err)
                self.assertEqual(out, "")


class StreamingTest(Case):
    def test_the_command_keeps_a_few_bytes_a_record(self):
        # Packed runs of many small records, written directly in the packed
        # layout (the writer would take a file per record): the command's
        # allocations beyond the open runs, traced, stay at a few bytes a
        # record pair (the status byte, the alignment's arrays), where the
        # command before kept a dict per record of both runs and a row per pair.
        n, names = 20_000, 100
        paths = []
        for side in ("a", "b"):
            path = os.path.join(self.tmp, side)
            os.makedirs(os.path.join(path, "packed"))
            head = io.BytesIO()
            np.lib.format.write_array(head, np.zeros(2, np.float32), allow_pickle=False)
            image = head.getvalue()
            with open(os.path.join(path, "packed", "00000000.npys"), "wb") as f:
                f.write(image * n)
            with open(os.path.join(path, "index.jsonl"), "w") as f:
                f.writelines(f'{{"step":{i // names},"kind":"grad","name":"w{i % names}","dtype":"float32",'
                             f'"shape":[2],"file":"packed/00000000.npys","offset":{i * len(image)},'
                             f'"nbytes":{len(image)}}}\n' for i in range(n))
            with open(os.path.join(path, "run.json"), "w") as f:
                json.dump({"format_version": 1, "closed": True, "options": {"format": "packed"}}, f)
            paths.append(path)
        from tensortap._diff import compare as _diff

        runs = [tensortap.open(p) for p in paths] + [None]
        _diff.run_command(runs, _diff.Options())  # imports, caches
        tracemalloc.start()
        try:
            lines, rc, _ = _diff.run_command(runs, _diff.Options())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        self.assertEqual((rc, lines[-1]), (0, f"compared {n}, differ 0, only in A 0, only in B 0"))
        # The bound: 32 bytes a pair, plus 2 MiB for what does not grow with
        # the records (buffers, a chunk of positions, the summary).
        self.assertLess(peak, 32 * n + (2 << 20), f"{peak / n:.0f} bytes a record pair")


class PageTest(Case):
    """The --html page (issue 56, item 5), and how Chromium renders it."""

    driver = None
    made = None  # (A, B, the page): written once for the class

    @classmethod
    def tearDownClass(cls):
        if cls.driver is not None:
            cls.driver.quit()
        if cls.made is not None:
            shutil.rmtree(os.path.dirname(cls.made[0]), ignore_errors=True)

    def setUp(self):
        super().setUp()
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("matplotlib is not installed")

    def page(self):
        """A, B and the page of `tensortap diff A B --rtol 1e-5 --html`."""
        if PageTest.made is None:
            root = tempfile.mkdtemp(prefix="tensortap-diff-page-")
            a, b = self.make_runs(root)
            page = os.path.join(root, "diff.html")
            rc, out, err = command(a, b, "--rtol", "1e-5", "--html", page)
            self.assertEqual(rc, 1, err)
            PageTest.made = (a, b, page)
        return PageTest.made

    def make_runs(self, root):
        """A model's worth of kinds: 80 activations (more than a heatmap's
        rows), 70 activation gradients that all differ (they were dropped by
        the cap of 60 names), a square weight B holds transposed, a record
        B scales, one it offsets, and one whose rows drift by rounding."""
        rng = np.random.default_rng(0)
        recs_a, recs_b = [], []
        w = rng.standard_normal((16, 16)).astype(np.float32)
        for step in range(4):
            for i in range(80):
                x = np.full(8, i + step + 1.0, np.float32)
                recs_a.append(("activation", f"enc.layer{i // 10}.block{i % 10}", step, x, "float32"))
                recs_b.append(("activation", f"enc.layer{i // 10}.block{i % 10}", step,
                               x * np.float32(1 + 1e-7 * step), "float32"))
            for i in range(70):
                x = np.full(8, i + 1.0, np.float32)
                recs_a.append(("activation_grad", f"g{i}", step, x, "float32"))
                recs_b.append(("activation_grad", f"g{i}", step, x * np.float32(1.01), "float32"))
            for kind, name, a, b in (("grad", "w", w, w.T.copy()), ("grad", "scaled", w, w * np.float32(0.5)),
                                     ("grad", "offset", w, w + np.float32(0.25)),
                                     ("grad", "drift\u202e", w, w * np.float32(1 + 2e-7 * step))):
                recs_a.append((kind, name, step, a, "float32"))
                recs_b.append((kind, name, step, b, "float32"))
        return write_run(os.path.join(root, "a"), recs_a), write_run(os.path.join(root, "b"), recs_b)

    def test_the_page_shows_how_much_for_every_kind(self):
        from tensortap._pages import diff as diff_page

        a, b, page = self.page()
        with open(page, encoding="utf-8") as f:
            text = f.read()
        # Every kind has its heatmap (the 70 activation gradients that all differ too).
        for kind in ("activation", "activation_grad", "grad"):
            self.assertTrue(f'alt="{kind}: error by name and step"' in text, kind)
        # The per-record views, with their hints and the first element beyond tolerance.
        for want in ("B looks like A transposed: cosine with A&#x27;s transpose 1",
                     "B looks like A scaled: B = 0.5 * A",
                     "B looks like A offset: B = A + 0.25", "first element beyond tolerance: [0, 1]: A ",
                     'alt="histogram of the differences, grad w step 0"'):
            self.assertTrue(want in text, want)
        self.assertFalse("\u202e" in text)  # escaped, never raw
        self.assertFalse("http://" in text.replace("http://www.w3.org", ""))
        # Coloured by rel_norm: the drifting record (2e-7) and the bug (0.5) are far apart on the scale,
        # where log10 of max_rel saturated both.
        df = tensortap.diff(a, b, rtol=1e-5)
        cells = diff_page.Collector(floor=False)
        for r in df.to_dict("records"):
            cells(dict(r, _floor=False, _u=float("nan")))

        def grid_of(kind):
            return diff_page.kind_grid([c for c in cells.cells if c[1] == kind], ranks=False)
        grid = grid_of("grad")
        label = {text: i for i, (text, _) in enumerate(grid.layout)}
        drift = grid.values[label["drift\\u202e"], 1]
        self.assertAlmostEqual(drift, math.log10(2e-7), delta=0.3)
        self.assertGreater(grid.values[label["scaled"], 1], -0.4)
        self.assertFalse(np.isfinite(grid.values[label["drift\\u202e"], 0]))  # step 0: equal bit for bit
        grid = grid_of("activation_grad")
        self.assertLessEqual(len(grid.layout), diff_page.ROWS)
        self.assertEqual(sum(len(m) for _, m in grid.layout), 70)  # every name, in some row
        self.assertTrue(grid.dots.all())
        # 80 activations: grouped by their common prefix, 10 a row.
        grid = grid_of("activation")
        self.assertEqual([t for t, _ in grid.layout][:2], ["enc.layer0.* (10)", "enc.layer1.* (10)"])
        self.assertEqual(len(grid.layout), 8)

    def test_rendered_in_chromium(self):
        _, _, page = self.page()
        driver = self.browser()
        from matplotlib import image as mpimg
        from selenium.webdriver.common.by import By

        driver.get("file://" + page)
        figures = driver.find_elements(By.CSS_SELECTOR, "img.figure")
        self.assertGreaterEqual(len(figures), 3 + 4)  # a heatmap per kind, a histogram per record viewed
        for img in figures:
            alt = img.get_attribute("alt")
            complete, natural = driver.execute_script("return [arguments[0].complete, arguments[0].naturalWidth];",
                                                      img)
            self.assertTrue(complete and natural >= 100, f"{alt}: not decoded")
            driver.execute_script("arguments[0].scrollIntoView();", img)
            self.assertTrue(img.is_displayed() and img.size["width"] >= 300, f"{alt}: {img.size}")
            pixels = mpimg.imread(io.BytesIO(img.screenshot_as_png))[..., :3]
            self.assertGreater((pixels < 0.9).any(axis=2).mean(), 0.02, f"{alt}: blank")
        # The summary fits: nothing runs off the side, its first line whole and shown.
        width = driver.execute_script("return document.documentElement.scrollWidth;")
        self.assertLessEqual(width, 1366)
        summary = driver.find_element(By.CSS_SELECTOR, "pre.summary")
        scroll, client = driver.execute_script("return [arguments[0].scrollWidth, arguments[0].clientWidth];",
                                               summary)
        self.assertLessEqual(scroll, client)
        first = driver.find_element(By.CSS_SELECTOR, "p.first")
        self.assertTrue(first.is_displayed())
        self.assertTrue(first.text.startswith("first divergence: activation_grad g0 step 0: arises "), first.text)
        self.assertTrue(summary.text.startswith("first divergence: activation_grad g0 step 0"))
        for heading in driver.find_elements(By.TAG_NAME, "h2"):
            self.assertTrue(heading.is_displayed(), heading.text)

    def browser(self):
        if PageTest.driver is not None:
            return PageTest.driver
        try:
            PageTest.driver = chromium.start(f"{self.tmp}/profile")
        except chromium.Missing as e:
            self.fail(f"the browser test {e}")
        return PageTest.driver
        try:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service
        except ImportError:
            self.fail("the browser test needs python3-selenium (apt install python3-selenium chromium-driver)")
        for tool, package in (("/usr/bin/chromium", "chromium"), ("/usr/bin/chromedriver", "chromium-driver")):
            self.assertTrue(os.path.exists(tool), f"the browser test needs {tool}: apt install {package}")
        opts = webdriver.ChromeOptions()
        opts.binary_location = "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1366,900", f"--user-data-dir={self.tmp}/profile"):
            opts.add_argument(arg)
        PageTest.driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
        return PageTest.driver


if __name__ == "__main__":
    unittest.main(verbosity=2)
