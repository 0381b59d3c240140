"""The instrument from Python (issue 78 (2)): what tensortap.torch.watch(...,
engine="native") adds to a PyTorch loop, each through the C++ recorder
(tensortap._engine) on the CPU: `tensortap ctl` steering a Python job that
trains now (status, capture, every, pause, resume, dump), the stall
watchdog, the flight recorder's default live rule (non_finite) on a NaN,
TensorBoard's events read by TensorBoard's own reader, and a disk budget
under keep_latest killed with SIGKILL. ctest python.engine.instrument.

    PYTHONPATH=python:BUILD/python python-with-torch tests/python/test_engine_instrument.py

The two jobs that must be other processes (the one ctl steers, the one
SIGKILL ends) are this file run as `--job ctl|budget DIR` and start when
the module loads, so that their start-up (importing torch) overlaps the
in-process tests. No timing is asserted (tests/README.md): every wait is
for an event, bounded by HANG, which only a hang reaches.

Skipped, saying why, where torch or the extension does not import (the
1.13 tree builds no extension); the TensorBoard case where TensorBoard's
reader is not installed (scripts/common.sh install_tensorboard, found as
TENSORTAP_TENSORBOARD_DIR or tensorboard_dir there says); the [gpu] case
without a CUDA device.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
IS_JOB = sys.argv[1:2] == ["--job"]
TMP = None if IS_JOB else tempfile.mkdtemp(prefix="tensortap-instrument-")
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def spawn(what):
    """This file as `--job WHAT TMP/WHAT`: (process, its stderr file)."""
    log = open(os.path.join(TMP, what + ".stderr"), "wb")
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--job", what, os.path.join(TMP, what)],
                            stdout=subprocess.PIPE, stderr=log, text=True, env=ENV), log


# Run as a program, the jobs start before this process imports torch, so
# that the three imports overlap (a second or two each).
EARLY = {w: spawn(w) for w in ("ctl", "budget")} if __name__ == "__main__" and not IS_JOB else {}

try:
    import torch
except ImportError:
    torch = None

import tensortap  # noqa: E402

ENGINE = None
if torch is not None:
    import tensortap.torch as ttt

    try:
        import tensortap._engine as ENGINE  # noqa: N812
    except ImportError:
        ENGINE = None

WHY = ("no torch here" if torch is None else
       "tensortap._engine is not built here (the LibTorch 2.x tree builds it; put BUILD/python on PYTHONPATH)")
HANG = 15  # seconds: only a hang waits this long
STEP_S = 0.02  # the ctl job's step
JOBS = {}

# What the ctl job records by default (watch()'s default kinds: all but
# param; the model has no buffers) and each kind's names.
NAMES = {"activation": ("fc1", "act", "fc2"), "activation_grad": ("fc1", "act", "fc2"),
         "grad": ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"),
         "param": ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"), "tensor": ("loss",)}
DEFAULT_KINDS = ("activation", "activation_grad", "grad", "tensor")
STATUS = re.compile(r"rank 0: status ok at step (\d+): records (\d+), bytes (\d+), dropped 0, budget off, "
                    r"last step (\d+\.\d) s ago")


class Net(torch.nn.Module if torch is not None else object):
    def __init__(self, width=16):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, width)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(width, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def sgd(net, lr=0.01):
    """A plain SGD step, zeroing the gradients (torch.optim's first use
    imports torch._dynamo: 1-2 s of this test's budget)."""
    with torch.no_grad():
        for p in net.parameters():
            if p.grad is not None:
                p -= lr * p.grad
                p.grad = None


def full(kinds):
    return {(k, n) for k in kinds for n in NAMES[k]}


# -- the jobs: this file run as another process -------------------------------------------


def job(what, run):
    """A Python training loop under the native engine that prints "step N"
    after each step; `ctl`: 20 ms a step, full tensors only at step 0 (and
    as ctl asks), statistics every step, until DIR.stop exists; `budget`:
    every record every step on a 256 KiB keep_latest budget, from when
    DIR.go exists (it waits, not to take a core from the other tests) until
    killed."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if what == "ctl":
        net = Net()
        rec = ttt.watch(net, run, engine="native", every=1 << 40, stats_every=1)
    else:
        net = Net(width=64)
        rec = ttt.watch(net, run, engine="native", kinds=["param", "grad", "activation", "tensor"],
                        max_bytes="256K", on_budget="keep_latest")
    x = torch.randn(16, 8)
    while what == "budget" and not os.path.exists(run + ".go"):
        time.sleep(0.01)
    for s in range(1 << 30):
        if what == "ctl" and os.path.exists(run + ".stop"):
            break
        rec.step(s)
        loss = net(x).pow(2).mean()
        rec.capture("loss", loss)
        loss.backward()
        sgd(net)
        print("step", s, flush=True)
        time.sleep(STEP_S if what == "ctl" else 0.01)
    rec.close()


class Job:
    """This file as `--job WHAT DIR`; `step` is the last step it printed."""

    def __init__(self, what):
        self.dir = os.path.join(TMP, what)
        self.proc, self.log = EARLY.pop(what, None) or spawn(what)
        self.step, self.ended = -1, False
        self.cond = threading.Condition()
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self):
        for line in self.proc.stdout:
            m = re.fullmatch(r"step (\d+)\n", line)
            with self.cond:
                if m:
                    self.step = int(m.group(1))
                self.cond.notify_all()
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def wait_step(self, n):
        with self.cond:
            self.cond.wait_for(lambda: self.step >= n or self.ended, HANG + 10)
        if self.step < n:
            raise AssertionError(f"{self.dir}: at step {self.step} (ended: {self.ended}), waited for {n}: "
                                 f"{self.stderr()}")

    def stderr(self):
        with open(self.dir + ".stderr", "rb") as f:
            return f.read().decode(errors="replace")[-2000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


def setUpModule():
    if ENGINE is not None:
        JOBS["ctl"] = Job("ctl")
        JOBS["budget"] = Job("budget")


def tearDownModule():
    for j in JOBS.values():
        j.stop()
    for proc, log in EARLY.values():  # started, but not needed here
        proc.kill()
        proc.wait()
        proc.stdout.close()
        log.close()
    shutil.rmtree(TMP, ignore_errors=True)


def cli(*args):
    """`python -m tensortap ARGS`: (exit status, stdout, stderr)."""
    out = subprocess.run([sys.executable, "-m", "tensortap", *map(str, args)], capture_output=True, text=True,
                         env=ENV, timeout=HANG + 30)
    return out.returncode, out.stdout, out.stderr


def wait_for(what):
    end = time.monotonic() + HANG
    while True:
        got = what()
        if got or time.monotonic() > end:
            return got
        time.sleep(0.02)


def lines(path):
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return [json.loads(raw) for raw in f.read().split(b"\n") if raw.strip()]


def index(run):
    """{step: {(kind, name)}} of the run's index."""
    out = {}
    for r in lines(os.path.join(run, "index.jsonl")):
        out.setdefault(r["step"], set()).add((r["kind"], r["name"]))
    return out


@unittest.skipIf(ENGINE is None, WHY)
class Case(unittest.TestCase):
    def path(self, name):
        return os.path.join(TMP, name)


class Ctl(Case):
    """One Python job steered by every command in turn; its index is then
    checked step by step against what the answers said."""

    def ok(self, *args):
        rc, out, err = cli("ctl", self.job.dir, *args)
        self.assertEqual((rc, err), (0, ""), out)
        m = re.fullmatch(rf"rank 0: {args[0]} ok at step (\d+)(?:: (.*))?\n", out)
        self.assertTrue(m, out)
        return int(m.group(1)), m.group(2)

    def test_ctl_steers_a_python_job(self):
        self.job = job = JOBS["ctl"]
        job.wait_step(1)
        rc, out, err = cli("ctl", job.dir, "status")
        self.assertEqual((rc, err), (0, ""))
        self.assertTrue(STATUS.fullmatch(out.strip()), out)

        c, message = self.ok("capture", "--steps", 3, "--kinds", "grad,param")
        self.assertEqual(message, f"steps {c}..{c + 2} in full (param+grad)")
        e, message = self.ok("every", 5)
        self.assertEqual(message, f"every 5 steps from step {e}")
        job.wait_step(e + 6)
        p, message = self.ok("pause")
        self.assertTrue(message.startswith("full tensors paused"), message)
        job.wait_step(p + 6)
        r, message = self.ok("resume")
        self.assertEqual(message, "resumed")
        d, message = self.ok("dump")
        self.assertEqual(message, "the run is marked (dumps.jsonl); it has no flight recorder")
        job.wait_step(d + 1)
        with open(job.dir + ".stop", "w"):
            pass
        job.proc.wait(HANG)
        self.assertEqual(job.proc.returncode, 0, job.stderr())

        def expected(t):
            if c <= t <= c + 2:
                return full(("param", "grad"))
            if p <= t < r:
                return set()
            if t >= e and (t - e) % 5 == 0 or t == 0:
                return full(DEFAULT_KINDS)
            return set()

        got, last = index(job.dir), job.step
        self.assertGreater(r, p)
        for t in range(last + 1):
            self.assertEqual(got.get(t, set()), expected(t), f"step {t} (capture {c}, every {e}, pause {p}, "
                                                               f"resume {r})")
        self.assertIn({"step": d, "reason": "request", "steps": []}, lines(os.path.join(job.dir, "dumps.jsonl")))
        with tensortap.open(job.dir) as run:
            # Statistics every step, through the pause.
            self.assertEqual(sorted(set(run.stats_table()[0]["step"].tolist())), list(range(last + 1)))
        # The job has ended: ctl says so.
        rc, out, err = cli("ctl", job.dir, "status")
        self.assertEqual(rc, 1, out + err)
        self.assertIn("no live recorder", out + err)


class Watchdog(Case):
    def test_a_step_that_hangs_is_dumped_with_reason_stall(self):
        run = self.path("stall")
        torch.manual_seed(0)
        net = Net()
        rec = ttt.watch(net, run, engine="native", stall_after="300ms", kinds=["tensor"])
        x = torch.randn(4, 8)
        for s in range(3):
            rec.step(s)
            rec.capture("loss", net(x).pow(2).mean())
            if s == 1:
                # The step hangs until the watchdog has seen it.
                self.assertTrue(wait_for(lambda: lines(os.path.join(run, "dumps.jsonl"))), "no stall dump")
        rec.close()
        (dump,) = lines(os.path.join(run, "dumps.jsonl"))
        self.assertEqual((dump["reason"], dump["step"], dump["last_step"], dump["steps"]), ("stall", 1, 1, []))
        self.assertGreaterEqual(dump["stalled_seconds"], 0.3)
        rc, out, err = cli("doctor", run)
        self.assertIn("stalled_training", out, out + err)
        self.assertIn("no step() for", out)


class HealthRule(Case):
    def test_a_nan_fires_the_flight_recorders_rule(self):
        run = self.path("nan")
        torch.manual_seed(0)
        net = Net()
        rec = ttt.watch(net, run, engine="native", flight_recorder=2, stats_every=1, after_dump="continue")
        data = torch.randn(6, 4, 8)
        data[3, 1, 2] = float("nan")  # step 3's batch: its loss, activations and gradients are NaN
        for s in range(6):
            rec.step(s)
            loss = net(data[s]).pow(2).mean()
            rec.capture("loss", loss)
            loss.backward()
            sgd(net)
            if s == 2:
                rec.flush()
                self.assertEqual(lines(os.path.join(run, "dumps.jsonl")), [], "a dump before the NaN")
        rec.close()
        with tensortap.open(run) as r:
            self.assertTrue(r.dumps, "no dump")
            first = r.dumps[0]
            self.assertEqual((first["reason"], first["step"]), ("nan", 3), first)
            # The two steps held before it and its own, written.
            self.assertEqual(first["steps"], [1, 2, 3])
            self.assertTrue(np.isnan(r.load("loss", 3, kind="tensor")).all())
            self.assertFalse(np.isnan(r.load("fc1", 2, kind="activation")).any())
            steps = {rec["step"] for rec in r.records}
            self.assertTrue({1, 2, 3} <= steps, steps)
            self.assertNotIn(0, steps)  # held, never dumped


def tensorboard_reader():
    """tests/python/tb_check with TensorBoard's reader on sys.path, or why not."""
    folder = os.environ.get("TENSORTAP_TENSORBOARD_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tensortap",
        f"tensorboard-2.21.0-cp{sys.version_info[0]}{sys.version_info[1]}")
    if not os.path.isdir(folder):
        return None, f"no TensorBoard reader in {folder} (scripts/common.sh install_tensorboard)"
    for p in (folder, HERE):
        if p not in sys.path:
            sys.path.append(p)
    try:
        import tb_check

        tb_check.tensorboard()
    except (ImportError, AssertionError) as e:
        return None, f"TensorBoard's reader does not import from {folder}: {e}"
    return tb_check, ""


class TensorBoard(Case):
    def test_the_events_read_by_tensorboards_reader_are_the_runs(self):
        tb_check, why = tensorboard_reader()
        if tb_check is None:
            self.skipTest(why)
        run = self.path("tb")
        torch.manual_seed(0)
        net = Net()
        rec = ttt.watch(net, run, engine="native", every=2, stats_every=1, tensorboard=True,
                        **{"tensorboard.histograms_every": 2})
        x = torch.randn(4, 8)
        for s in range(6):
            rec.step(s)
            loss = net(x).pow(2).mean()
            rec.capture("loss", loss)
            loss.backward()
            sgd(net)
        rec.close()
        counts = tb_check.check_events_against_run(run, run, histograms_every=2, exact=False, exported=False)
        # Every step's loss, as a 0-d tensor; a statistics row's scalars for the rest.
        self.assertEqual(counts["tensors"], 6, counts)
        self.assertGreater(counts["scalars"], 0, counts)
        self.assertGreater(counts["histograms"], 0, counts)
        events = tb_check.Events(run)
        self.assertEqual(sorted(s for s, _ in events.scalars["grad/fc1.weight/norm"]), list(range(6)))


class KilledUnderBudget(Case):
    def test_sigkill_after_the_budget_leaves_a_run_that_checks_clean(self):
        job = JOBS["budget"]
        with open(job.dir + ".go", "w"):
            pass

        def given_up():
            try:
                with open(os.path.join(job.dir, "run.json")) as f:
                    return (json.load(f).get("budget") or {}).get("given_up_below", 0)
            except (OSError, ValueError):  # not yet written, or being replaced
                return 0

        first = wait_for(given_up)
        self.assertTrue(first, f"the budget was never reached: {job.stderr()}")
        # A few give-ups later, at whatever moment this is.
        self.assertTrue(wait_for(lambda: given_up() > first + 5), "the job stopped giving steps up")
        job.proc.send_signal(signal.SIGKILL)
        job.proc.wait(HANG)
        self.assertEqual(job.proc.returncode, -signal.SIGKILL)
        with tensortap.open(job.dir) as r:
            steps = {rec["step"] for rec in r.records}
            self.assertTrue(steps, "an empty run after the kill")
            self.assertGreaterEqual(min(steps), first)
            newest = max(steps)
            self.assertEqual(r.load("fc1.weight", newest, kind="param").shape, (64, 8))
        rc, out, err = cli("inspect", "--check", job.dir)
        self.assertEqual(rc, 0, out + err)
        self.assertRegex(out, r"check: \d+ records, 0 problems")
        self.assertIn("keep_latest", out)


@unittest.skipIf(ENGINE is None, WHY)
@unittest.skipIf(torch is None or not torch.cuda.is_available(), "[gpu]: no CUDA device here")
class Cuda(unittest.TestCase):
    """[gpu] (issue 78 (1)): a CUDA tensor recorded from a Python hook goes
    through the C++ copier, not a .cpu() on the training thread, and reads
    back equal, bit for bit, to a .cpu() copy taken at capture."""

    def test_cuda_records_are_copied_off_the_training_thread(self):
        run = os.path.join(TMP, "cuda")
        torch.manual_seed(0)
        net = Net().cuda()
        rec = ttt.watch(net, run, engine="native", kinds=["activation", "grad", "param", "tensor"])
        data = torch.randn(3, 4, 8, device="cuda")
        copies = {}
        act = {}
        net.fc1.register_forward_hook(lambda m, i, o: act.__setitem__("fc1", o))
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for s in range(3):
                rec.step(s)
                params = {n: p.detach().clone() for n, p in net.named_parameters()}
                loss = net(data[s]).pow(2).mean()
                rec.capture("loss", loss)
                loss.backward()
                copies[s] = (params, act["fc1"].detach().clone(), loss.detach().clone())
                sgd(net)
        rec.close()
        # The training thread is the one that ran the forward's matrix
        # products; no device-to-host copy ran on it.
        events = prof.events()
        training = {e.thread for e in events if e.name in ("aten::addmm", "aten::linear")}
        self.assertTrue(training)
        copies_here = [e.name for e in events if e.thread in training
                       and e.name in ("aten::cpu", "aten::_to_copy", "aten::to", "aten::item", "aten::_local_scalar_dense")]
        self.assertEqual(copies_here, [])
        with tensortap.open(run) as r:
            for s, (params, fc1, loss) in copies.items():
                for n, p in params.items():
                    self.assertTrue(same_bits(r.load(n, s, kind="param"), p), (n, s))
                self.assertTrue(same_bits(r.load("fc1", s, kind="activation"), fc1), s)
                self.assertTrue(same_bits(r.load("loss", s, kind="tensor"), loss), s)


def same_bits(array, tensor):
    """A record equal, bit for bit, to a .cpu() copy of `tensor`."""
    want = tensor.cpu().numpy()
    return array.dtype == want.dtype and array.shape == want.shape and array.tobytes() == want.tobytes()


def load_tests(loader, tests, pattern):
    # The in-process cases first, while the jobs start (importing torch);
    # then the budget's job, killed, which frees a core for ctl's.
    order = (Watchdog, HealthRule, TensorBoard, KilledUnderBudget, Ctl, Cuda)
    return unittest.TestSuite(loader.loadTestsFromTestCase(c) for c in order)


if __name__ == "__main__":
    if IS_JOB:
        job(sys.argv[2], sys.argv[3])
        sys.exit(0)
    if torch is None or ENGINE is None:
        print(f"skipped: {WHY}")
    unittest.main()
