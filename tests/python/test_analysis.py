"""The reader where analysis happens: pandas frames, dask arrays, xarray
Datasets, and the report page, checked in headless Chromium. On the runs
analysis_runs wrote (npy, HDF5, two ranks), every value is compared with the
eager NumPy reader.

    TT_ANALYSIS_DIR=build/tests/analysis PYTHONPATH=python /usr/bin/python3 tests/python/test_analysis.py
"""

import contextlib
import html
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from unittest import mock

import numpy as np

import chromium
import tensortap
from tensortap import __main__ as cli
from tensortap import _optional

RUNS = os.environ.get("TT_ANALYSIS_DIR", "build/tests/analysis")
ROOT = os.environ.get("TT_ROOT", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FORMATS = [f for f in ("npy", "hdf5", "ranks") if os.path.isdir(os.path.join(RUNS, f))]
ITEMSIZE = {"float32": 4, "float64": 8, "int64": 8, "bfloat16": 2}


def runs():
    for fmt in FORMATS:
        yield fmt, tensortap.open(os.path.join(RUNS, fmt))


@contextlib.contextmanager
def report_figures():
    """The report's figures as it puts them in the page: a list of
    (alt, figure) with, per legend, (alt, legend texts, legend box, the boxes
    of the axes it overlaps, whether it lies in the figure), taken after the
    figure was saved (its layout final) and before the report closes it."""
    from tensortap._pages import report

    original = report._Page.figure
    figures, legends = [], []

    def figure(fig, alt):
        out = original(fig, alt)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        axes = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
        for legend in [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends):
            box = legend.get_window_extent(renderer)
            inside = (box.x0 >= fig.bbox.x0 - 2 and box.y0 >= fig.bbox.y0 - 2 and box.x1 <= fig.bbox.x1 + 2
                      and box.y1 <= fig.bbox.y1 + 2)
            legends.append((alt, [t.get_text() for t in legend.get_texts()], box,
                            [a for a in axes if box.overlaps(a)], inside))
        figures.append((alt, fig))
        return out

    with mock.patch.object(report._Page, "figure", staticmethod(figure)):
        yield figures, legends


class FramesTest(unittest.TestCase):
    def test_the_runs_are_there(self):
        self.assertIn("npy", FORMATS)
        self.assertIn("ranks", FORMATS)

    def test_index_frame_is_the_index(self):
        for fmt, run in runs():
            with self.subTest(fmt=fmt), run:
                df = run.index_frame()
                self.assertEqual(len(df), len(run.records))
                self.assertEqual(list(df.columns)[:7], ["step", "kind", "name", "dtype", "shape", "bytes", "rank"])
                self.assertEqual(str(df["kind"].dtype), "category")
                for row, rec in zip(df.itertuples(index=False), run.records):
                    self.assertEqual((row.step, row.kind, row.name, row.dtype, row.shape, row.file),
                                     (rec["step"], rec["kind"], rec["name"], rec["dtype"], tuple(rec["shape"]),
                                      rec["file"]))
                    self.assertEqual(row.bytes, math.prod(rec["shape"]) * ITEMSIZE[rec["dtype"]])
                    self.assertEqual(row.rank, rec.get("rank", 0))
                    if fmt == "hdf5":
                        self.assertEqual((row.dataset, row.row), (rec["dataset"], rec["row"]))
                    else:
                        self.assertIsNone(row.dataset)
                if fmt == "ranks":
                    self.assertEqual(sorted(df["rank"].unique()), [0, 1])
                # What a user does with it: bytes per kind.
                per_kind = df.groupby("kind", observed=True)["bytes"].sum()
                self.assertEqual(int(per_kind.sum()), int(df["bytes"].sum()))

    def test_stats_frame_equals_the_statistics(self):
        for fmt, run in runs():
            with self.subTest(fmt=fmt), run:
                df = run.stats_frame()
                self.assertEqual(list(df.columns), ["step", "rank", "kind", "name", *tensortap.STATS_FIELDS])
                self.assertEqual(str(df["kind"].dtype), "category")
                self.assertEqual(str(df["name"].dtype), "category")
                ranks = run.ranks or [None]
                rows = 0
                for r in ranks:
                    table, series = run.stats_table(rank=r)
                    rows += len(table)
                    for kind, name in series.values():
                        want = run.stats(name, kind=kind, rank=r)
                        got = df[(df["kind"] == kind) & (df["name"] == name) & (df["rank"] == (r or 0))]
                        np.testing.assert_array_equal(got["step"].to_numpy(), want["step"])
                        for f in tensortap.STATS_FIELDS:
                            np.testing.assert_array_equal(got[f].to_numpy(), want[f], err_msg=f"{kind} {name} {f}")
                self.assertEqual(len(df), rows)
                # One kind, one rank: ready for pivot, a column per name.
                grads = df[(df["kind"] == "grad") & (df["rank"] == (ranks[0] or 0))]
                wide = grads.pivot(index="step", columns="name", values="norm")
                self.assertEqual(sorted(map(str, wide.columns)), run.names("grad"))
                self.assertEqual(list(wide.index), list(range(60)))
                np.testing.assert_array_equal(wide["fc1.weight"].to_numpy(),
                                              run.stats("fc1.weight", kind="grad", rank=ranks[0])["norm"])

    def test_lazy_series_equals_the_eager_one(self):
        import dask.array as da

        for fmt, run in runs():
            with self.subTest(fmt=fmt), run:
                for kind in run.kinds():
                    for name in run.names(kind):
                        lazy = run.series(name, kind=kind, lazy=True)
                        self.assertIsInstance(lazy, da.Array)
                        eager = run.series(name, kind=kind)
                        self.assertEqual(lazy.shape, eager.shape, f"{kind} {name}")
                        self.assertEqual(lazy.dtype, eager.dtype, f"{kind} {name}")
                        # One chunk per record.
                        steps_axis = 1 if run.ranks else 0
                        self.assertEqual(lazy.numblocks[steps_axis], len(run.steps(name, kind=kind)))
                        np.testing.assert_array_equal(lazy.compute(), eager, err_msg=f"{fmt} {kind} {name}")
                if run.ranks:
                    np.testing.assert_array_equal(run.series("fc2.weight", kind="grad", rank=1, lazy=True).compute(),
                                                  run.series("fc2.weight", kind="grad", rank=1))

    def test_lazy_series_reads_nothing_until_computed(self):
        src = os.path.join(RUNS, "npy")
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = os.path.join(tmp, "run")
            shutil.copytree(src, run_dir)
            run = tensortap.open(run_dir)
            s = run.series("hidden", kind="activation", lazy=True)
            # Remove the files: building the array must not have read them.
            shutil.rmtree(os.path.join(run_dir, "npy", "activation", "hidden"))
            self.assertEqual(s.shape[0], len(run.steps("hidden", kind="activation")))
            with self.assertRaises(FileNotFoundError):
                s.compute()

    def test_to_xarray(self):
        for fmt, run in runs():
            for lazy in (False, True):
                with self.subTest(fmt=fmt, lazy=lazy):
                    ds = run.to_xarray("grad", lazy=lazy)
                    self.assertEqual(sorted(ds.data_vars), run.names("grad"))
                    self.assertEqual(list(ds["step"].values), run.steps("fc1.weight", kind="grad"))
                    for name in run.names("grad"):
                        var = ds[name]
                        self.assertEqual(var.attrs["name"], name)
                        self.assertEqual(var.attrs["dtype"], "float32")
                        self.assertEqual(var.dims[0], "rank" if run.ranks else "step")
                        if lazy:
                            self.assertEqual(type(var.data).__module__.split(".")[0], "dask")
                        np.testing.assert_array_equal(var.values, run.series(name, kind="grad"))
                    if run.ranks:
                        self.assertEqual(list(ds["rank"].values), [0, 1])
            # Names captured at different steps share one step axis, NaN where absent.
            ds = run.to_xarray("tensor", names=["loss"])
            self.assertEqual(list(ds.data_vars), ["loss"])
            run.close()

    def test_missing_packages_name_the_debian_package(self):
        saved = {m: sys.modules.get(m) for m in ("pandas", "xarray", "dask", "dask.array")}
        try:
            for module, package, call in (
                    ("pandas", "python3-pandas", lambda r: r.index_frame()),
                    ("xarray", "python3-xarray", lambda r: r.to_xarray("grad")),
                    ("dask.array", "python3-dask", lambda r: r.series("hidden", kind="activation", lazy=True))):
                sys.modules[module] = None  # import fails as if not installed
                with self.subTest(module=module), tensortap.open(os.path.join(RUNS, "npy")) as run:
                    with self.assertRaisesRegex(ImportError, f"apt install {package}"):
                        call(run)
                sys.modules.pop(module)
                if saved[module] is not None:
                    sys.modules[module] = saved[module]
        finally:
            for m, mod in saved.items():
                if mod is not None:
                    sys.modules[m] = mod

    def test_the_core_reader_imports_none_of_them(self):
        code = ("import sys, tensortap; r = tensortap.open(sys.argv[1]); r.series('hidden', kind='activation'); "
                "r.stats('loss', kind='tensor'); "
                "print(sorted(m for m in ('pandas', 'xarray', 'dask', 'matplotlib', 'tqdm') if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code, os.path.join(RUNS, "npy")], capture_output=True, text=True,
                             check=True).stdout
        self.assertEqual(out.strip(), "[]")


class LargerThanMemoryTest(unittest.TestCase):
    """A reduction over a run larger than the memory the process may use."""

    def test_lazy_mean_under_a_memory_limit(self):
        steps, shape = 40, (1024, 2048)  # 8 MiB a step, 320 MiB in all
        limit = 200 << 20  # private memory the child may have beyond what it has at start
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = os.path.join(tmp, "big")
            os.makedirs(os.path.join(run_dir, "npy", "activation", "x"))
            lines = []
            for s in range(steps):
                rel = f"npy/activation/x/{s:08d}.npy"
                a = np.lib.format.open_memmap(os.path.join(run_dir, rel), mode="w+", dtype=np.float32, shape=shape)
                a[:] = s
                a.flush()
                del a
                lines.append(json.dumps({"step": s, "kind": "activation", "name": "x", "dtype": "float32",
                                         "shape": list(shape), "file": rel}))
            with open(os.path.join(run_dir, "index.jsonl"), "w") as f:
                f.write("\n".join(lines) + "\n")
            with open(os.path.join(run_dir, "run.json"), "w") as f:
                json.dump({"format_version": 1, "closed": True, "options": {"format": "npy"}}, f)
            child = textwrap.dedent(f"""
                import resource, sys
                import numpy as np, dask, dask.array, tensortap
                # RLIMIT_DATA counts private memory (heap and anonymous maps),
                # not read-only maps of files: what loading the run would take.
                used = int(open("/proc/self/status").read().split("VmData:")[1].split()[0]) * 1024
                resource.setrlimit(resource.RLIMIT_DATA, (used + {limit}, used + {limit}))
                run = tensortap.open(sys.argv[1])
                s = run.series("x", kind="activation", lazy=True)
                mean = s.mean(axis=(1, 2)).compute(scheduler="threads", num_workers=2)
                assert np.array_equal(mean, np.arange({steps}, dtype=np.float32)), mean
                print("lazy ok", float(s.mean().compute()))
                try:
                    run.series("x", kind="activation")
                    print("eager fit")
                except MemoryError:
                    print("eager MemoryError")
            """)
            out = subprocess.run([sys.executable, "-c", child, run_dir], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("lazy ok 19.5", out.stdout)
            # The run does not fit: the eager reader fails under the same limit.
            self.assertIn("eager MemoryError", out.stdout)


class ProgressTest(unittest.TestCase):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    def test_progress_only_on_a_terminal_and_long_work(self):
        items = list(range(500))
        self.assertIs(_optional.progress(items), items)  # stderr is not a terminal here
        err = self.Tty()
        with contextlib.redirect_stderr(err):
            short = items[:10]
            self.assertIs(_optional.progress(short), short)  # too little work for a bar
            self.assertEqual(list(_optional.progress(items, desc="checking")), items)
        self.assertIn("checking", err.getvalue())


class ReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tensortap-report-")
        cls._driver = None
        # Each run's page is drawn once, its legends measured as it is drawn
        # (a page takes seconds); the tests read these.
        cls.pages = {}
        for fmt in FORMATS:
            with report_figures() as (figures, legends):
                path, page = cls.report(fmt)
                figures.clear()  # the figures themselves are not needed
            cls.pages[fmt] = (path, page, legends)

    @classmethod
    def tearDownClass(cls):
        if cls._driver is not None:
            cls._driver.quit()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def report(cls, fmt, *extra):
        out = os.path.join(cls.tmp, f"{fmt}{''.join(extra)}.html")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = cli.main(["report", os.path.join(RUNS, fmt), "-o", out, *extra])
        if rc != 0:
            raise AssertionError(f"tensortap report {fmt} {extra}: exit {rc}")
        with open(out, encoding="utf-8") as f:
            return out, f.read()

    def test_page_is_self_contained_and_complete(self):
        for fmt in FORMATS:
            with self.subTest(fmt=fmt):
                page = self.pages[fmt][1]
                for section in ("Findings", "Summary", "Scalars", "Gradient norms per parameter",
                                "Activation histograms", "Statistics heatmaps", "Tensors with findings",
                                "Flight recorder dumps"):
                    self.assertIn(f"<h2>{section}</h2>", page)
                # The loss is a curve, near the top: right after the summary.
                self.assertLess(page.index("<h2>Summary</h2>"), page.index("<h2>Scalars</h2>"))
                self.assertLess(page.index("<h2>Scalars</h2>"), page.index("<h2>Gradient norms per parameter</h2>"))
                scalars = re.search(r'<section id="scalars">(.*?)</section>', page, re.S).group(1)
                self.assertIn('alt="scalars over steps"', scalars)
                # Nothing fetched: every src and href is inline, or a place on the page.
                self.assertEqual([u for u in re.findall(r'(?:src|href)="([^"]*)"', page)
                                  if not u.startswith("data:") and not u.startswith("#")], [])
                for target in re.findall(r'href="#([^"]*)"', page):
                    self.assertEqual(page.count(f'id="{target}"'), 1, target)
                self.assertNotRegex(page, r"https?://")
                images = re.findall(r'<img class="figure"', page)
                # norms, histograms, a heatmap per kind with statistics, the dump's steps
                self.assertGreaterEqual(len(images), 3 + 5)
                data = json.loads(re.search(r'<script type="application/json" id="tensortap-data">(.*?)</script>',
                                            page, re.S).group(1))
                self.assertEqual(len(data["dumps"]), 1 if fmt != "ranks" else 2)
                self.assertEqual(data["dumps"][0]["step"], 40)
                self.assertIn("spike", page)
                if fmt == "ranks":
                    self.assertIn("rank 1", page)
                    self.assertIn("one line per rank", scalars)
                loss = [s for s in data["scalars"] if s["name"] == "loss"]
                self.assertEqual([s["rank"] for s in loss], [0, 1] if fmt == "ranks" else [None])
                with tensortap.open(os.path.join(RUNS, fmt)) as run:
                    self.assertEqual(loss[0]["points"], len(run.steps("loss", kind="tensor", rank=0 if run.ranks else None)))

    def test_every_legend_is_outside_the_axes(self):
        for fmt in FORMATS:
            with self.subTest(fmt=fmt):
                legends = self.pages[fmt][2]
                alts = {alt for alt, *_ in legends}
                for want in ("gradient norms per parameter over steps", "activation histograms at chosen steps",
                             "the steps before the dump at step 40"):
                    self.assertIn(want, alts)
                if fmt == "ranks":
                    self.assertIn("scalars over steps", alts)  # a line per rank, and their key
                for alt, texts, box, overlapping, inside in legends:
                    self.assertEqual(overlapping, [], f"{alt}: the legend {texts} covers axes")
                    self.assertTrue(inside, f"{alt}: the legend {texts} is cut off")

    def test_chosen_steps_and_bad_ones(self):
        _, page = self.report("npy", "--steps", "0,57")
        self.assertIn("Steps 0, 57", page)
        _, page = self.report("npy", "--steps", "1")
        self.assertIn("None of the steps asked for", page)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(cli.main(["report", os.path.join(RUNS, "npy"), "--steps", "x"]), 2)
            self.assertEqual(cli.main(["report", os.path.join(self.tmp, "nope"), "-o", os.path.join(self.tmp, "o")]), 2)
        self.assertIn("--steps wants integers", err.getvalue())

    def test_findings_come_first_and_link_to_their_charts(self):
        """The doctor's findings (issue 62, item 4): the page's first section,
        the same findings as tensortap.doctor(run), each tensor's linked to
        its chart; the rules not evaluated, with why."""
        for fmt in FORMATS:
            with self.subTest(fmt=fmt):
                page = self.pages[fmt][1]
                self.assertEqual(re.findall(r'<section id="([^"]*)"', page)[0], "findings")
                section = findings_section(page)
                frame = tensortap.doctor(os.path.join(RUNS, fmt))
                # The programs' runs: a learning rate that jumps at step 40 (the spike).
                self.assertIn(("weight_update_ratio", "fc2.weight"), set(zip(frame.rule, frame.name)))
                n = len(frame)
                self.assertIn(f"<strong>{n} finding{'s' if n != 1 else ''}</strong>", section)
                rows = re.findall(r"<tr><td><code>([a-z_]+)</code></td><td>(.*?)</td>", section)
                self.assertEqual([r for r, _ in rows], list(frame.rule))
                data = page_data(page)["findings"]
                self.assertEqual([(f["rule"], f["name"], f["first_step"], f["last_step"]) for f in data["findings"]],
                                 list(zip(frame.rule, frame.name, frame.first_step, frame.last_step)))
                self.assertEqual(data["not_evaluated"], frame.attrs["not_evaluated"])
                for rule, why in frame.attrs["not_evaluated"].items():
                    self.assertIn(f"<li><code>{rule}</code>: {html.escape(why)}</li>", section)
                for (rule, cell), name in zip(rows, frame.name):
                    link = re.fullmatch(r'<a href="#(finding-chart-\d+)">(.*)</a>', cell)
                    self.assertIsNotNone(link, cell)
                    self.assertEqual(html.unescape(link.group(2)).split(" ", 1)[1], name)
                    # The target: one chart, in its section, of this tensor, with its figure.
                    chart = re.search(f'<div class="finding-chart" id="{link.group(1)}"><h3>(.*?)</h3>(.*?)</div>',
                                      page, re.S)
                    self.assertIsNotNone(chart)
                    self.assertEqual(html.unescape(chart.group(1)).split(" ", 1)[1], name)
                    self.assertIn('<img class="figure"', chart.group(2))
                    self.assertGreater(page.index(chart.group(0)), page.index('<section id="tensors-with-findings">'))

    def browser(self):
        # One browser for the class: starting Chromium takes seconds.
        if ReportTest._driver is not None:
            return ReportTest._driver
        try:
            ReportTest._driver = chromium.start(f"{self.tmp}/profile")
        except chromium.Missing as e:
            self.fail(f"the browser test {e}")
        return ReportTest._driver
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
        ReportTest._driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
        return ReportTest._driver

    def problems(self, driver, path):
        """What is wrong with the page at `path` as Chromium renders it."""
        from matplotlib import image as mpimg
        from selenium.webdriver.common.by import By

        found = []
        driver.get("file://" + path)
        figures = driver.find_elements(By.CSS_SELECTOR, "img.figure")
        if len(figures) < 8:
            found.append(f"{len(figures)} figures")
        for i, img in enumerate(figures):
            alt = img.get_attribute("alt")
            # Decoded: a broken data: URL has no natural size.
            complete, natural = driver.execute_script(
                "return [arguments[0].complete, arguments[0].naturalWidth];", img)
            if not complete or natural < 100:
                found.append(f"figure {i} ({alt}) not decoded")
                continue
            if not img.is_displayed() or img.size["width"] < 300 or img.size["height"] < 100:
                found.append(f"figure {i} ({alt}) not visible: {img.size}")
                continue
            # As the browser painted it: ink, and colour (lines, heatmaps).
            driver.execute_script("arguments[0].scrollIntoView();", img)
            pixels = mpimg.imread(io.BytesIO(img.screenshot_as_png))[..., :3]
            if (pixels < 0.9).any(axis=2).mean() < 0.02:
                found.append(f"figure {i} ({alt}) is blank")
            if (pixels.max(axis=2) - pixels.min(axis=2) > 0.2).mean() < 0.001:
                found.append(f"figure {i} ({alt}) has no colour")
        # Readable on a laptop: nothing wider than the window.
        width = driver.execute_script("return document.documentElement.scrollWidth;")
        if width > 1366:
            found.append(f"the page is {width} px wide")
        for heading in driver.find_elements(By.TAG_NAME, "h2"):
            if not heading.is_displayed():
                found.append(f"heading {heading.text!r} hidden")
        driver.execute_script("window.scrollTo(0, 0);")
        shot = os.path.join(self.tmp, os.path.basename(path) + ".png")
        driver.save_screenshot(shot)
        ink = (mpimg.imread(shot)[..., :3] < 0.9).any(axis=2).mean()
        if ink < 0.03:
            found.append(f"the first screen is nearly blank ({ink:.1%} inked)")
        return found, len(figures), ink

    def test_rendered_in_a_real_browser(self):
        driver = self.browser()
        for fmt in ("npy", "ranks"):
            path = self.pages[fmt][0]
            found, figures, ink = self.problems(driver, path)
            self.assertEqual(found, [], fmt)
            print(f"\nbrowser: {fmt} report: {figures} figures decoded, visible and painted; "
                  f"{ink:.0%} of the first screen inked")

    def test_a_finding_link_scrolls_to_its_chart_in_a_real_browser(self):
        try:
            import selenium  # noqa: F401
        except ImportError:
            self.skipTest("needs python3-selenium (apt install python3-selenium chromium-driver)")
        for tool in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
            if not os.path.exists(tool):
                self.skipTest(f"needs {tool} (apt install chromium chromium-driver)")
        from selenium.webdriver.common.by import By

        driver = self.browser()
        driver.get("file://" + self.pages["npy"][0])
        # Findings first: its heading is the first on the first screen.
        headings = driver.find_elements(By.TAG_NAME, "h2")
        self.assertEqual(headings[0].text, "Findings")
        self.assertLess(headings[0].location["y"], 200)
        link = next(a for a in driver.find_elements(By.CSS_SELECTOR, "#findings td a")
                    if a.text == "param fc2.weight")
        target = link.get_attribute("href").split("#", 1)[1]
        link.click()
        hash_, top, scrolled, room, height, image = driver.execute_script(
            "const t = document.getElementById(arguments[0]); const img = t.querySelector('img.figure');"
            "return [location.hash, t.getBoundingClientRect().top, window.scrollY, "
            "document.documentElement.scrollHeight - window.innerHeight, window.innerHeight, "
            "[img.complete, img.naturalWidth, img.getBoundingClientRect().top]];", target)
        self.assertEqual(hash_, "#" + target)
        # At the window's top, or as near as the page's end lets it come.
        self.assertGreater(scrolled, 0)
        self.assertTrue(-1 <= top < 2 or (scrolled >= room - 1 and 0 <= top < height / 2),
                        f"the chart is {top} px from the window's top, scrolled {scrolled} of {room}")
        complete, natural, img_top = image
        self.assertTrue(complete and natural > 300, "the chart's figure is decoded")
        self.assertLess(img_top, height, "the figure is on the screen the link shows")
        self.assertIn("fc2.weight", driver.find_element(By.ID, target).find_element(By.TAG_NAME, "h3").text)
        # And back.
        driver.find_element(By.ID, target).find_element(By.LINK_TEXT, "back to the findings").click()
        self.assertLess(abs(driver.execute_script(
            "return document.getElementById('findings').getBoundingClientRect().top;")), 5)
        print(f"\nbrowser: the finding's link scrolled to #{target}, its figure {natural} px wide")

    def test_the_browser_check_sees_a_broken_page(self):
        driver = self.browser()
        page = self.pages["npy"][1]
        # One figure's data damaged, another hidden by a style: both are found.
        first = page.index("base64,") + len("base64,")
        page = page[:first] + "!!!!" + page[first + 4:]
        page = page.replace('<img class="figure"', '<img style="display:none" class="figure"', 2)
        page = page.replace('<img style="display:none" class="figure"', '<img class="figure"', 1)
        broken = os.path.join(self.tmp, "broken.html")
        with open(broken, "w", encoding="utf-8") as f:
            f.write(page)
        found, _, _ = self.problems(driver, broken)
        self.assertTrue(any("figure 0" in p and "not decoded" in p for p in found), found)
        self.assertTrue(any("figure 1" in p and "not visible" in p for p in found), found)


class HandMadeRuns:
    """Runs written by hand (npy), and their report page."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-hostile-analysis-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def make(self, records, ranks=None, **run_json):
        """A run of `records` (kind, name, step, array[, rank]); with `ranks`,
        a rank<r>/ per rank."""
        path = os.path.join(self.tmp, f"run{len(os.listdir(self.tmp))}")
        for r in (ranks or [None]):
            d = path if r is None else os.path.join(path, f"rank{r}")
            os.makedirs(d)
            info = {"format_version": 1, "closed": True, "options": {"format": "npy"},
                    "rank": r or 0, "world_size": len(ranks) if ranks else 1}
            info.update(run_json)
            lines = []
            for i, (kind, name, step, a, *rank) in enumerate(records):
                if (rank[0] if rank else None) != r and ranks:
                    continue
                f = f"npy/{i}.npy"
                os.makedirs(os.path.join(d, "npy"), exist_ok=True)
                np.save(os.path.join(d, f), a)
                lines.append(json.dumps({"step": step, "kind": kind, "name": name, "dtype": str(a.dtype),
                                         "shape": list(a.shape), "file": f}))
            with open(os.path.join(d, "run.json"), "w") as fh:
                json.dump(info, fh)
            with open(os.path.join(d, "index.jsonl"), "w") as fh:
                fh.write("".join(line + "\n" for line in lines))
        return path

    def report(self, path):
        out = os.path.join(self.tmp, "page.html")
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = cli.main(["report", path, "-o", out])
        self.assertEqual(rc, 0, err.getvalue())
        with open(out, encoding="utf-8") as f:
            page = f.read()
        raw = re.search(r'<script type="application/json" id="tensortap-data">(.*?)</script>', page, re.S).group(1)

        def no_constant(c):
            raise ValueError(f"{c} in the page's JSON")

        return page, json.loads(raw, parse_constant=no_constant)


def findings_section(page):
    return re.search(r'<section id="findings"><h2>Findings</h2>(.*?)</section>', page, re.S).group(1)


def page_data(page):
    return json.loads(re.search(r'<script type="application/json" id="tensortap-data">(.*?)</script>', page,
                                re.S).group(1))


class FindingsTest(HandMadeRuns, unittest.TestCase):
    """The Findings section (issue 62, item 4) on runs made by hand: a
    planted dead ReLU under a hostile name, a stall, no finding at all, and
    a run the doctor cannot judge."""

    HOSTILE = "relu</script><img src=x onerror=alert(1)>\x1b[31m"

    def test_a_planted_problem_links_to_its_chart(self):
        rng = np.random.default_rng(0)
        records = []
        for step in range(5):
            dead = np.zeros(100, np.float32)
            dead[0] = 1.0
            records.append(("activation", "relu1", step, dead))                          # 99% zero: dead
            records.append(("activation", self.HOSTILE, step, np.zeros(100, np.float32)))  # dead, and all zero
            records.append(("activation", "relu2", step, np.abs(rng.normal(size=100)).astype(np.float32)))
        run = self.make(records, options={"format": "npy", "stall_after_ms": 1000},
                        dumps=[{"step": 3, "reason": "stall", "steps": [], "last_step": 3, "stalled_seconds": 2.5}])
        page, data = self.report(run)
        self.assertEqual(re.findall(r'<section id="([^"]*)"', page)[0], "findings")
        section = findings_section(page)
        self.assertIn("<strong>4 findings</strong>", section)
        self.assertIn("statistics computed from its full records", section)
        rows = {(rule, html.unescape(re.sub(r"<[^>]+>", "", tensor))): tensor for rule, tensor in
                re.findall(r"<tr><td><code>([a-z_]+)</code></td><td>(.*?)</td>", section)}
        escaped = self.HOSTILE.replace("\x1b", "\\x1b")  # a control character, as the reader shows it
        self.assertEqual(set(rows), {("dead_relu", "activation relu1"), ("dead_relu", f"activation {escaped}"),
                                     ("all_zero", f"activation {escaped}"), ("stalled_training", "the model")})
        # The hostile name is text everywhere: no element, no control character.
        self.assertNotIn("<img src=x", page)
        self.assertNotIn("\x1b", page)
        self.assertEqual(page.count("</script>"), page.count("<script"))
        self.assertIn("relu&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;\\x1b[31m", section)
        ids = re.findall(r'id="([^"]*)"', page)
        self.assertEqual(len(ids), len(set(ids)))
        self.assertTrue(all(re.fullmatch(r"[a-z0-9-]+", i) for i in ids), ids)  # no name in an id
        for key in (("dead_relu", "activation relu1"), ("dead_relu", f"activation {escaped}")):
            target = re.fullmatch(r'<a href="#(finding-chart-\d+)">.*</a>', rows[key]).group(1)
            chart = re.search(f'<div class="finding-chart" id="{target}"><h3>(.*?)</h3>(.*?)</div>', page, re.S)
            self.assertEqual("activation " + html.unescape(chart.group(1)).split(" ", 1)[1], key[1])
            self.assertIn('<img class="figure"', chart.group(2))
        # Both of the hostile tensor's findings link to its one chart.
        self.assertEqual(rows[("dead_relu", f"activation {escaped}")], rows[("all_zero", f"activation {escaped}")])
        # A finding about the whole model links to the section that shows it: the stall's dump.
        self.assertEqual(rows[("stalled_training", "the model")], '<a href="#flight-recorder-dumps">the model</a>')
        self.assertIn('<section id="flight-recorder-dumps">', page)
        self.assertEqual(sorted((f["rule"], f["name"]) for f in data["findings"]["findings"]),
                         [("all_zero", escaped), ("dead_relu", "relu1"), ("dead_relu", escaped),
                          ("stalled_training", None)])

    def test_no_finding_is_said_plainly(self):
        rng = np.random.default_rng(1)
        records = [("activation", "relu1", step, np.abs(rng.normal(size=64)).astype(np.float32)) for step in range(4)]
        page, data = self.report(self.make(records))
        section = findings_section(page)
        self.assertEqual(re.findall(r'<section id="([^"]*)"', page)[0], "findings")
        self.assertIn("<strong>0 findings</strong>", section)
        self.assertIn("none found a problem", section)
        self.assertNotIn("<table>", section)
        self.assertNotIn("tensors-with-findings", page)
        self.assertIn("<li><code>stalled_training</code>: the run was recorded without stall_after", section)
        self.assertEqual(data["findings"]["findings"], [])

    def test_a_run_the_doctor_cannot_judge_still_gets_its_page(self):
        records = [("activation", "relu1", step, np.zeros(8, np.float32)) for step in range(3)]
        records += [("tensor", "loss", step, np.array(1.0 / (step + 1), np.float32)) for step in range(3)]
        run = self.make(records)
        with open(os.path.join(run, "stats.npy"), "wb") as f:
            f.write(b"not a table" * 20)  # damaged: the doctor refuses the run
        page, data = self.report(run)
        section = findings_section(page)
        self.assertEqual(section.count("<p>"), 1, section)
        self.assertRegex(section, r"^<p>The doctor could not judge this run: RunError: .*stats\.npy.*</p>$")
        self.assertIn("RunError", data["findings"]["error"])
        for heading in ("Summary", "Scalars", "Activation histograms", "Flight recorder dumps"):
            self.assertIn(f"<h2>{heading}</h2>", page)
        self.assertIn('alt="scalars over steps"', page)


class ManyDumpsTest(HandMadeRuns, unittest.TestCase):
    """Round 4: 1,100 dumps made a 142 s, 21 MB page (a figure each), and
    inspect printed a line per dump. 301 here: past DUMPS_LISTED, what
    grew with each dump would show."""

    def test_thousands_of_dumps_are_summarized(self):
        from tensortap._views import summary

        loss = [("tensor", "loss", s, np.array(float(s), dtype=np.float32)) for s in range(0, 600, 10)]
        dumps = ([{"step": s, "reason": "nan", "steps": [s], "kind": "tensor", "name": "loss",
                   "trigger": {"kind": "non_finite"}} for s in range(0, 300)]
                 + [{"step": 500, "reason": "user", "steps": [500]}])
        run = self.make(loss, dumps=dumps)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(cli.main(["inspect", run]), 0)
        text = out.getvalue()
        self.assertLess(len(text.splitlines()), 40, text)
        self.assertIn("301 flight recorder dumps:", text)
        self.assertRegex(text, r"300  non_finite \(nan\)")
        self.assertRegex(text, r"1  user \(user\)")
        self.assertIn("flight recorder dump at step 0 ", text)
        self.assertIn("flight recorder dump at step 500 ", text)
        self.assertIn(f"... {301 - summary.DUMPS_SHOWN} more dumps ...", text)
        t = time.perf_counter()
        page, data = self.report(run)
        took = time.perf_counter() - t
        self.assertEqual(len(data["dumps"]), 301)  # the data keeps every dump
        section = re.search(r'<section id="flight-recorder-dumps">(.*?)</section>', page, re.S).group(1)
        self.assertIn('alt="timeline of the dumps"', section)
        self.assertLessEqual(section.count('<img class="figure"'), 1 + summary.DUMPS_SHOWN)
        self.assertLess(len(page), 3_000_000)
        print(f"\n301 dumps: inspect {len(text.splitlines())} lines; report {len(page) / 1e6:.1f} MB in {took:.1f} s")


class HostileRunTest(HandMadeRuns, unittest.TestCase):
    """Runs made by hand to break the analysis code: names that are not text,
    values at the ends of float64, dtypes that change, ranks that disagree,
    a damaged run.json."""

    def test_report_of_names_that_are_not_text_and_values_at_the_ends(self):
        names = ["\udcff\udcfe bytes", "</script><script>alert(1)</script>", "x" * 5000, "tab\tand\x1bescape"]
        extreme = np.array([1e308, -1e308, np.inf, -np.inf, np.nan, 5e-324], np.float64)
        records = []
        for step in (0, 1):
            for name in names:
                with np.errstate(over="ignore"):
                    records.append(("activation", name, step, extreme * (step + 1)))
            records.append(("grad", "c", step, np.array([1 + 2j, 3 - 4j], np.complex64)))
        page, data = self.report(self.make(records, dumps=[{"step": 1, "reason": "</script>", "steps": [0, 1]},
                                                           {"step": "x", "steps": "y"}, 7]))
        self.assertNotIn("<script>alert", page)
        self.assertEqual(page.count("</script>"), page.count("<script"))
        self.assertNotIn("\x1b", page)
        self.assertIn("Activation histograms", page)
        self.assertEqual([d.get("reason") for d in data["dumps"]], ["</script>", None])
        self.assertNotIn("x" * 200, page.split('id="tensortap-data"')[0].split("<pre>")[0])

    def test_lazy_equals_eager_when_the_dtype_changes(self):
        path = self.make([("tensor", "t", 0, np.arange(3, dtype=np.int32)),
                          ("tensor", "t", 1, np.array([0.5, 1.5, 2.5], np.float64)),
                          ("tensor", "t", 2, np.arange(3, dtype=np.uint8))])
        run = tensortap.open(path)
        eager, lazy = run.series("t", kind="tensor"), run.series("t", kind="tensor", lazy=True)
        self.assertEqual(lazy.dtype, eager.dtype)
        np.testing.assert_array_equal(lazy.compute(), eager)

    def test_lazy_blocks_travel_to_other_processes(self):
        for fmt, run in runs():
            if fmt == "ranks":
                continue
            with self.subTest(fmt=fmt), run:
                name = run.names("grad")[0]
                lazy = run.series(name, kind="grad", lazy=True)
                np.testing.assert_array_equal(lazy.compute(scheduler="processes", num_workers=2),
                                              run.series(name, kind="grad"))

    def test_ranks_that_disagree(self):
        path = self.make([("grad", "w", 0, np.zeros((2, 3), np.float32), 0),
                          ("grad", "w", 0, np.zeros((3, 2), np.float32), 1),
                          ("grad", "only0", 0, np.ones(2, np.float32), 0),
                          ("grad", "only0", 1, np.ones(2, np.float32), 0)], ranks=[0, 1])
        run = tensortap.open(path)
        with self.assertRaisesRegex(tensortap.RunError, "'w' .*different shapes on different ranks"):
            run.series("w", kind="grad")
        with self.assertRaisesRegex(tensortap.RunError, "'w' .*different shapes"):
            run.series("w", kind="grad", lazy=True).compute()
        with self.assertRaisesRegex(tensortap.RunError, "'w' .*changes shape between steps or ranks"):
            run.to_xarray("grad")
        ds = run.to_xarray("grad", names="only0")  # a name, not a list of its letters
        self.assertEqual(list(ds.data_vars), ["only0"])
        values = ds["only0"].values
        self.assertEqual(values.shape, (2, 2, 2))
        np.testing.assert_array_equal(values[0], np.ones((2, 2)))
        self.assertTrue(np.isnan(values[1]).all(), "a rank without the name is NaN")

    def test_names_that_clash_with_dimensions(self):
        path = self.make([("tensor", "step", 0, np.zeros(2, np.float32)),
                          ("tensor", "ok", 0, np.zeros(2, np.float32))])
        run = tensortap.open(path)
        with self.assertRaisesRegex(tensortap.RunError, "'step'.*dimensions"):
            run.to_xarray("tensor")
        self.assertEqual(list(run.to_xarray("tensor", names=["ok"]).data_vars), ["ok"])


class ReportScalarsTest(HandMadeRuns, unittest.TestCase):
    """The report's scalars (issue 31, item 6): every 0-d tensor series is a
    curve over steps, a line per rank; non-finite values are gaps; no
    scalars, no figure. Every legend is outside its axes."""

    @staticmethod
    def scalars(page):
        found = re.search(r'<section id="scalars"><h2>Scalars</h2>(.*?)</section>', page, re.S)
        return found.group(1) if found else None

    def test_a_loss_and_a_learning_rate_are_curves(self):
        records = []
        for step in range(10):
            records.append(("tensor", "loss", step, np.array(2.0 / (step + 1), np.float32)))
            records.append(("tensor", "lr", step, np.array(0.1, np.float64)))
            records.append(("tensor", "logits", step, np.zeros(3, np.float32)))  # not 0-d: not a curve
            records.append(("tensor", "one", step, np.zeros(1, np.float32)))      # 1 element, 1-d: not either
            records.append(("grad", "w", step, np.full((2, 2), step, np.float32)))
        with report_figures() as (figures, _):
            page, data = self.report(self.make(records))
        body = self.scalars(page)
        self.assertIsNotNone(body)
        self.assertEqual(body.count('<img class="figure" alt="scalars over steps"'), 1)
        self.assertNotIn("non-finite", body)
        self.assertLess(page.index("<h2>Scalars</h2>"), page.index("<h2>Gradient norms per parameter</h2>"))
        self.assertEqual([(s["name"], s["rank"], s["points"], s["first_step"], s["last_step"])
                          for s in data["scalars"]], [("loss", None, 10, 0, 9), ("lr", None, 10, 0, 9)])
        self.assertAlmostEqual(data["scalars"][0]["last"], 0.2, places=6)
        fig = dict(figures)["scalars over steps"]
        charts = [ax for ax in fig.axes if ax.get_visible()]
        self.assertEqual([ax.get_title() for ax in charts], ["loss", "lr"])
        line = charts[0].lines[0]
        np.testing.assert_array_equal(line.get_xdata(), np.arange(10))
        np.testing.assert_allclose(line.get_ydata(), 2.0 / np.arange(1, 11), rtol=1e-6)
        self.assertIsNone(charts[0].get_legend(), "one line needs no key")

    def test_a_line_per_rank(self):
        records = [("tensor", "loss", step, np.array(step + 10 * r, np.float32), r)
                   for r in (0, 1) for step in range(6)]
        with report_figures() as (figures, legends):
            page, data = self.report(self.make(records, ranks=[0, 1]))
        self.assertIn("one line per rank", self.scalars(page))
        self.assertEqual([(s["name"], s["rank"]) for s in data["scalars"]], [("loss", 0), ("loss", 1)])
        ax = [ax for ax in dict(figures)["scalars over steps"].axes if ax.get_visible()][0]
        self.assertEqual([list(line.get_ydata()) for line in ax.lines], [list(range(6)), list(range(10, 16))])
        keys = [(texts, overlapping) for alt, texts, _, overlapping, _ in legends if alt == "scalars over steps"]
        self.assertEqual(keys, [(["rank 0", "rank 1"], [])])

    def test_non_finite_values_are_gaps(self):
        hostile = "</script><script>alert(1)</script>"
        values = [3.0, 2.5, np.nan, 2.0, np.inf, 1.5, -np.inf, 1.0]
        records = [("tensor", hostile, step, np.array(v, np.float32)) for step, v in enumerate(values)]
        records += [("tensor", "dead", step, np.array(np.nan, np.float64)) for step in range(3)]
        records += [("tensor", "one point", 0, np.array(1.0, np.float64))]
        with report_figures() as (figures, legends):
            page, data = self.report(self.make(records))  # raises nothing; strict JSON
        self.assertNotIn("<script>alert", page)
        self.assertEqual(page.count("</script>"), page.count("<script"))
        body = self.scalars(page)
        self.assertIn('alt="scalars over steps"', body)
        self.assertIn("gaps", body)
        self.assertIn("3 of 8 (NaN 1, +inf 1, -inf 1), the first at step 2", body)
        self.assertIn("3 of 3 (NaN 3), the first at step 0", body)
        by_name = {s["name"]: s for s in data["scalars"]}
        self.assertEqual((by_name[hostile]["nan"], by_name[hostile]["posinf"], by_name[hostile]["neginf"],
                          by_name[hostile]["first_nonfinite_step"]), (1, 1, 1, 2))
        self.assertIsNone(by_name["dead"]["last"])  # NaN is null in the page's JSON
        charts = {ax.get_title(): ax for ax in dict(figures)["scalars over steps"].axes if ax.get_visible()}
        self.assertIn("dead  (3 non-finite: gaps)", charts)
        y = charts["</script><script>alert(1)</script>  (3 non-finite: gaps)"].lines[0].get_ydata()
        self.assertTrue(np.isnan(y[[2, 4, 6]]).all(), "a non-finite value is a gap")
        np.testing.assert_array_equal(y[[0, 1, 3, 5, 7]], [3.0, 2.5, 2.0, 1.5, 1.0])
        keys = [(texts, overlapping) for alt, texts, _, overlapping, _ in legends if alt == "scalars over steps"]
        self.assertEqual(keys, [(["non-finite (gap)"], [])])

    def test_no_scalar_records(self):
        records = [("tensor", "logits", step, np.zeros(3, np.float32)) for step in range(3)]
        records += [("grad", "w", step, np.ones(2, np.float32)) for step in range(3)]
        page, data = self.report(self.make(records))
        body = self.scalars(page)
        self.assertIn("No scalar records", body)
        self.assertNotIn("<img", body)
        self.assertEqual(data["scalars"], [])

    def test_many_names_keep_their_legend_outside(self):
        """A transformer's gradient norms: dozens of long names; the key of
        the largest is beside the axes (under them with ranks side by side),
        over no panel."""
        names = [f"transformer.encoder.layers.{i}.self_attn.in_proj_weight" for i in range(24)]
        for ranks in (None, [0, 1]):
            records = []
            for r in (ranks or [None]):
                for step in range(5):
                    for i, name in enumerate(names):
                        records.append(("grad", name, step, np.full(4, (i + 1) * (step + 1), np.float32), r))
                    records.append(("activation", "encoder.out", step, np.linspace(-1, 1, 50, dtype=np.float32), r))
                    records.append(("tensor", "loss", step, np.array(1.0 / (step + 1), np.float32), r))
            records = [rec if ranks else rec[:4] for rec in records]
            with self.subTest(ranks=ranks), report_figures() as (_, legends):
                self.report(self.make(records, ranks=ranks))
                grads = [(texts, box, overlapping, inside) for alt, texts, box, overlapping, inside in legends
                         if alt == "gradient norms per parameter over steps"]
                self.assertEqual(len(grads), len(ranks or [None]))
                for texts, box, overlapping, inside in grads:
                    self.assertEqual(len(texts), 8)
                    self.assertEqual(overlapping, [], "the legend covers a panel")
                    self.assertTrue(inside, "the legend is cut off")
                for alt, texts, _, overlapping, inside in legends:
                    self.assertEqual(overlapping, [], f"{alt}: {texts}")
                    self.assertTrue(inside, f"{alt}: {texts}")


class ExampleTest(unittest.TestCase):
    def test_analyse_with_pandas(self):
        run_dir = os.path.join(RUNS, "npy")
        out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "analyse_with_pandas.py"), run_dir,
                              "3.5"], capture_output=True, text=True, env=dict(os.environ))
        self.assertEqual(out.returncode, 0, out.stderr)
        # The same answers from NumPy alone.
        run = tensortap.open(run_dir)
        growth = {}
        for name in run.names("grad"):
            norm = run.stats(name, kind="grad")["norm"]
            growth[name] = norm[-1] / norm[0]
        fastest = max(growth, key=growth.get)
        self.assertIn(f"fastest-growing gradient norm: {fastest}", out.stdout)
        maxima = {n: run.stats(n, kind="activation") for n in run.names("activation")}
        crossings = [(int(st["step"][st["max"] > 3.5][0]), n) for n, st in maxima.items() if (st["max"] > 3.5).any()]
        self.assertTrue(crossings, "the run's activations should pass 3.5")
        first = min(crossings)
        self.assertIn(f"first activation max above 3.5: step {first[0]} ({first[1]})", out.stdout)

# ctest runs the file in two halves side by side (tests/CMakeLists.txt):
# `test_analysis.py frames` and `test_analysis.py report`. Every test class
# is in exactly one of them; with no half named, all run.
HALVES = {"frames": ["FramesTest", "LargerThanMemoryTest", "ProgressTest", "HostileRunTest", "ExampleTest"],
          "report": ["ReportTest", "ReportScalarsTest", "ManyDumpsTest", "FindingsTest"]}


if __name__ == "__main__":
    classes = sorted(n for n, v in list(globals().items()) if isinstance(v, type) and issubclass(v, unittest.TestCase))
    halves = sorted(c for half in HALVES.values() for c in half)
    assert classes == halves, f"test classes {classes} are not split exactly into HALVES {halves}"
    if len(sys.argv) > 1 and sys.argv[1] in HALVES:
        sys.argv[1:2] = HALVES[sys.argv[1]]
    unittest.main(verbosity=2)
