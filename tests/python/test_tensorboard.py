"""The recorder's own TensorBoard events (Options::tensorboard), read with
TensorBoard's own reader (tb_check: EventAccumulator and TensorBoard's
protobuf) and compared with the run they belong to: after the run closes,
while it is open (before and after flush()), after SIGKILL; the reader's
export of the same run; and TensorBoard's scalars page in headless Chromium.

    TT_TENSORBOARD_PROC=build/tests/tensorboard_proc TT_TB_WORK=/tmp/tb \\
    PYTHONPATH=python:$(bash -c 'source scripts/common.sh; tensorboard_dir') \\
        /usr/bin/python3 tests/python/test_tensorboard.py
"""

import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tb_check  # noqa: E402
import tensortap  # noqa: E402

PROC = os.environ.get("TT_TENSORBOARD_PROC", "")
WORK = os.environ.get("TT_TB_WORK", "/tmp/tensortap-tensorboard-test")
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 40
EVERY = 5  # tensorboard_proc's histograms_every
# The claim of Options::tensorboard (README, "Live in TensorBoard"): a
# step's events are readable within about a second of its records' capture,
# even when training pauses after it (the writer takes what was committed
# after 0.5 s without a wake). The test waits for the event, up to that
# bound plus a margin that only a hang exceeds; the time taken is printed.
LIVE_BOUND_S = 1.0
LIVE_DEADLINE_S = LIVE_BOUND_S + 60.0


def setUpModule():
    tb_check.tensorboard()  # fails, with how to install it, when TensorBoard is missing
    if not PROC or not os.access(PROC, os.X_OK):
        raise AssertionError("TT_TENSORBOARD_PROC must name the tensorboard_proc program (tests/CMakeLists.txt)")
    os.makedirs(WORK, exist_ok=True)


def fresh(name):
    path = os.path.join(WORK, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


def norm_steps(events_dir, tag):
    try:
        return sorted(s for s, _ in tb_check.Events(events_dir).scalars.get(tag, []))
    except (AssertionError, OSError, IndexError):
        return []  # no file yet, or not its first event yet


class Live:
    """tensorboard_proc live: waits at "half" (no flush) and at "flushed"."""

    def __init__(self, run):
        self.p = subprocess.Popen([PROC, "live", run, str(STEPS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)

    def close(self):
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            f.close()

    def expect(self, word):
        line = self.p.stdout.readline().strip()
        if line != word:
            self.p.kill()
            raise AssertionError(f"tensorboard_proc said {line!r}, not {word!r}: {self.p.stderr.read()}")

    def go_on(self):
        self.p.stdin.write("\n")
        self.p.stdin.flush()

    def finish(self):
        out, err = self.p.communicate(timeout=120)
        if self.p.returncode != 0:
            raise AssertionError(f"tensorboard_proc exited {self.p.returncode}: {err}")
        return out


class RecorderEvents(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.run_dir = fresh("closed")
        out = subprocess.run([PROC, "run", cls.run_dir, str(STEPS)], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise AssertionError(f"tensorboard_proc failed: {out.stderr}")
        assert out.stdout.strip().endswith("errors 0"), out.stdout

    def test_after_close_every_event_matches_the_run(self):
        counts = tb_check.check_events_against_run(self.run_dir, self.run_dir, histograms_every=EVERY, exported=False)
        print("after close:", counts)
        with tensortap.open(self.run_dir) as run:
            self.assertEqual(len(run.dumps), 1)
            rows = len(run.stats_table()[0])
        self.assertEqual(counts["files"], 1)
        # Five scalars a statistics row of the model's tensors (no NaN: no
        # nonfinite), and the loss and the learning rate each step, one
        # scalar each (their rows give no statistics tags).
        self.assertEqual(counts["scalars"], 5 * (rows - 2 * STEPS) + 2 * STEPS)
        self.assertEqual(counts["tensors"], 2 * STEPS)
        self.assertGreater(counts["histograms"], 0)
        self.assertEqual(counts["dumps"], 1)
        # The custom scalars layout (issue 58; tb_check compared it with the
        # names): the last one written charts the loss first, then each
        # 0-d tensor, and the norms and std by top-level module.
        events = tb_check.Events(self.run_dir)
        (name,) = events.files
        layouts = [(step, layout) for step, layout in events.order[name] if layout is not None]
        self.assertTrue(layouts)
        self.assertEqual([(category, [title for title, _ in charts]) for category, charts in layouts[-1][1]],
                         [(tb_check.SCALARS_TITLE, ["loss", "lr"]), (tb_check.NORMS_TITLE, ["fc1", "fc2", "fc3"]),
                          (tb_check.STDS_TITLE, ["hidden1", "hidden2"])])
        self.assertEqual(layouts[-1][1][1][1][0], ("fc1", ["^grad/fc1\\.bias/norm$", "^grad/fc1\\.weight/norm$"]))
        print("layouts written:", [step for step, _ in layouts])

    def test_the_export_of_the_run_writes_the_same_events(self):
        logdir = fresh("export")
        out = subprocess.run([sys.executable, "-m", "tensortap", "tensorboard", self.run_dir, "--logdir", logdir,
                              "--histograms-every", str(EVERY)], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        exported = os.path.join(logdir, os.path.basename(self.run_dir))
        a = tb_check.check_events_against_run(exported, self.run_dir, histograms_every=EVERY, exported=True)
        b = tb_check.check_events_against_run(self.run_dir, self.run_dir, histograms_every=EVERY, exported=False)
        self.assertEqual({k: v for k, v in a.items() if k != "events"}, {k: v for k, v in b.items() if k != "events"})
        # Into the run itself: refused, it has the recorder's events already.
        out = subprocess.run([sys.executable, "-m", "tensortap", "tensorboard", self.run_dir], capture_output=True,
                             text=True, timeout=300)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("events.out.tfevents.", out.stderr)

    def test_tensorboards_scalars_page_in_a_browser(self):
        shot = os.path.join(WORK, "tensorboard.png")
        custom = os.path.join(WORK, "custom_scalars.png")
        out = subprocess.run([sys.executable, os.path.join(HERE, "check_tensorboard_browser.py"), self.run_dir,
                              "--tags", "grad/fc1.weight/norm", "tensor/loss", "--screenshot", shot,
                              "--custom-scalars", custom, "--custom-tags", "tensor/loss", "tensor/lr",
                              "grad/fc1.weight/norm", "activation/hidden1/std", "--timeout", "150"],
                             capture_output=True, text=True, timeout=240)
        print(out.stdout[-2000:])
        self.assertEqual(out.returncode, 0, out.stdout[-4000:] + out.stderr[-4000:])
        self.assertGreater(os.path.getsize(shot), 10000)
        self.assertGreater(os.path.getsize(custom), 10000)
        # A chart per 0-d tensor, the loss first; a chart per top-level module.
        self.assertIn("custom scalars: tensortap: 0-d tensors (loss, learning rate) / loss: 1 tags (tensor/loss), "
                      "1 series drawn", out.stdout)
        self.assertIn("custom scalars: tensortap: gradient norms / fc1: 2 tags (grad/fc1.bias/norm, "
                      "grad/fc1.weight/norm), 2 series drawn", out.stdout)
        self.assertIn("custom scalars: tensortap: activations' std / hidden2: 1 tags (activation/hidden2/std), "
                      "1 series drawn", out.stdout)


class TwoRanks(unittest.TestCase):
    def test_each_rank_writes_its_own_events_in_its_folder(self):
        run = fresh("ranks")
        procs = [subprocess.Popen([PROC, "run", run, "12"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, RANK=str(r), WORLD_SIZE="2")) for r in (0, 1)]
        for p in procs:
            out, err = p.communicate(timeout=300)
            self.assertEqual(p.returncode, 0, err)
        for r in (0, 1):
            names = [n for n in os.listdir(os.path.join(run, f"rank{r}")) if n.startswith("events.out.tfevents.")]
            self.assertEqual(len(names), 1, names)
        self.assertFalse([n for n in os.listdir(run) if n.startswith("events.out.tfevents.")])
        counts = tb_check.check_events_against_run(run, run, histograms_every=EVERY, exported=False)
        print("two ranks:", counts)
        self.assertEqual(counts["files"], 2)


class KeepLatestEvents(unittest.TestCase):
    """Issue 70: under Budget::KeepLatest the events roll to new files and go
    with their steps (one marker for every output), so a 1 MiB budget with
    histograms every step keeps its newest step, refuses nothing, and
    TensorBoard's own reader (EventAccumulator, over the folder) reads the
    files as one run with the newest steps' scalars and histograms."""

    STEPS = 150

    def check(self, fmt):
        run_dir = fresh(f"keep_{fmt}")
        out = subprocess.run([PROC, f"keep_{fmt}", run_dir, str(self.STEPS)], capture_output=True, text=True,
                             timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(out.stdout.strip().endswith("errors 0 refused 0"), out.stdout + out.stderr)
        last = self.STEPS - 1
        files = [n for n in os.listdir(run_dir) if n.startswith("events.out.tfevents.")]
        self.assertGreaterEqual(len(files), 2, files)
        with tensortap.open(run_dir) as run:
            self.assertEqual(max(r["step"] for r in run.records), last)
            self.assertEqual(len([r for r in run.records if r["step"] == last]), 5)
            k = run.given_up_below[None]
            budget = run.infos[None]["budget"]
            self.assertGreater(budget.get("stats_rows_given_up", 0), 0, budget)
            self.assertGreater(budget.get("event_files_given_up", 0), 0, budget)
            frame = run.stats_frame()
            self.assertEqual(int(frame["step"].max()), last)
            self.assertGreaterEqual(int(frame["step"].min()), k)  # rows below the marker hidden
        event_accumulator = tb_check.tensorboard()[0]
        acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0,
                                                                         event_accumulator.HISTOGRAMS: 0})
        acc.Reload()
        loss = [e.step for e in acc.Scalars("tensor/loss")]
        self.assertEqual(max(loss), last)
        self.assertEqual(sorted(loss)[-10:], list(range(last - 9, last + 1)))
        hist = [e.step for e in acc.Histograms("tensor/t0")]
        self.assertEqual(max(hist), last)
        norms = [e.step for e in acc.Scalars("tensor/t3/norm")]
        self.assertEqual(max(norms), last)
        print(f"keep_latest {fmt}: {len(files)} event files kept, marker {k}, tensor/loss steps "
              f"{min(loss)}..{max(loss)} ({len(loss)})")

    def test_npy(self):
        self.check("npy")

    def test_packed(self):
        self.check("packed")


class LiveEvents(unittest.TestCase):
    def wait_for_step(self, run, step):
        start = time.monotonic()
        while time.monotonic() - start < LIVE_DEADLINE_S:
            if step in norm_steps(run, "tensor/loss"):
                return time.monotonic() - start
            time.sleep(0.05)
        self.fail(f"{run}: no tensor/loss event for step {step} within {LIVE_DEADLINE_S} s "
                  f"(have steps {norm_steps(run, 'tensor/loss')})")

    def test_while_open_then_after_close(self):
        run = fresh("live")
        p = Live(run)
        p.expect("half")
        # No flush(): the writer's batch alone makes them readable.
        took = self.wait_for_step(run, STEPS // 2 - 1)
        print(f"step {STEPS // 2 - 1}'s events readable {took:.2f} s after the step, without flush()")
        p.go_on()
        p.expect("flushed")
        # flush() has returned: everything is readable now, while the run is open.
        counts = tb_check.check_events_against_run(run, run, histograms_every=EVERY, exported=False)
        print("open, after flush():", counts)
        p.finish()
        # close() adds the last step's parameter gradients (taken at the
        # step boundary) and their statistics.
        closed = tb_check.check_events_against_run(run, run, histograms_every=EVERY, exported=False)
        print("after close:", closed)
        self.assertGreater(closed["scalars"], counts["scalars"])

    def test_after_sigkill_nothing_before_is_lost(self):
        for moment in ("half", "flushed"):
            with self.subTest(killed_at=moment):
                run = fresh("killed-" + moment)
                p = Live(run)
                p.expect("half")
                if moment == "flushed":
                    p.go_on()
                    p.expect("flushed")
                else:
                    self.wait_for_step(run, STEPS // 2 - 1)
                # Before flush() the index may not list every record yet
                # (it lists only durable ones): events of records it does
                # not list are checked for form only.
                exact = moment == "flushed"
                before = tb_check.check_events_against_run(run, run, histograms_every=EVERY, exact=exact,
                                                           exported=False)
                p.p.send_signal(signal.SIGKILL)
                p.p.wait(timeout=60)
                p.close()
                after = tb_check.check_events_against_run(run, run, histograms_every=EVERY, exact=exact, exported=False)
                print(f"killed at {moment}:", after)
                self.assertEqual(after, before)
                self.assertGreaterEqual(after["scalars"], 10 * (STEPS // 2))


if __name__ == "__main__":
    unittest.main(verbosity=2)
