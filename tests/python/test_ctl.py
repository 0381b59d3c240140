"""`tensortap ctl` against real jobs (tests/programs/ctl_target.cpp, issue
60 section 2; the command is tensortap/_ctl.py, the protocol
docs/leaving-it-on.md), and against fake runs whose heartbeat and answers
this file writes itself: the liveness rules, timeouts, withdrawal, hostile
files on ctl's side, bad input. ctest ctl.session (one tree).

    TT_CTL_TARGET=build/tests/ctl_target PYTHONPATH=python python3 tests/python/test_ctl.py

The jobs start together when the module loads, so that their start-up
overlaps (about a second of LibTorch each); one long job takes most
commands in turn, and its index is checked at the end, step by step,
against what the answers said. Without TT_CTL_TARGET the jobs' tests are
skipped; the fake runs' still run.
"""

import argparse
import collections
import concurrent.futures
import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from tensortap import __main__ as cli
from tensortap._ctl import client as _ctl

TARGET = os.environ.get("TT_CTL_TARGET")
TMP = tempfile.mkdtemp(prefix="tt-ctl-")
# Only a wait that never ends fails here: no timing is asserted (tests/README.md),
# and every bounded wait of ctl (its --timeout, the 2.5 s of a heartbeat) is shorter.
HANG = 15
JOBS = {}
POOL = None
FUTURES = {}

# What ctl_target records (its Options::kinds) and the names of each kind.
DEFAULT_KINDS = ("activation", "grad", "tensor")
NAMES = {"activation": ("relu1",), "grad": ("fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"),
         "param": ("fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"), "tensor": ("loss",)}
STATUS = re.compile(r"rank (\d+): status ok at step (\d+): records \d+, bytes \d+, dropped \d+, "
                    r"(budget off|budget \d+/\d+ \(stop_capture\)), last step (\d+\.\d) s ago")


class Job:
    """A ctl_target process; `step` is the last step it printed."""

    def __init__(self, name, *args):
        self.dir = os.path.join(TMP, name)
        self.log = open(os.path.join(TMP, name + ".stderr"), "wb")
        self.proc = subprocess.Popen([TARGET, self.dir, *map(str, args)], stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
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

    def wait_step(self, n, timeout=30):
        with self.cond:
            self.cond.wait_for(lambda: self.step >= n or self.ended, timeout)
        if self.step < n:
            raise AssertionError(f"{self.dir}: at step {self.step} (ended: {self.ended}), waited for {n}")

    def wait_end(self, timeout=30):
        self.proc.wait(timeout)
        with self.cond:
            self.cond.wait_for(lambda: self.ended, timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def setUpModule():
    if TARGET:
        start_jobs()
    start_scenarios()


def start_jobs():
    # The long job first: most tests are its.
    JOBS["main"] = Job("main", "--steps", 100000, "--step-ms", 30)
    JOBS["held"] = Job("held", "--steps", 9, "--step-ms", 30, "--hold-at", 5, "--release", os.path.join(TMP, "go"))
    JOBS["flight"] = Job("flight", "--steps", 100000, "--step-ms", 30, "--flight", 3)
    JOBS["ranks"] = Job("ranks", "--steps", 100000, "--step-ms", 30, "--ranks", 2)
    JOBS["fork"] = Job("fork", "--steps", 100000, "--step-ms", 30, "--fork", "--max-bytes", 50000000)
    JOBS["flood"] = Job("flood", "--steps", 100000, "--step-ms", 30)
    JOBS["closing"] = Job("closing", "--steps", 4, "--step-ms", 20, "--hold-at", 2, "--release",
                          os.path.join(TMP, "go-closing"))


def start_scenarios():
    global POOL
    POOL = concurrent.futures.ThreadPoolExecutor(max_workers=len(SCENARIOS))
    for name, scenario in SCENARIOS.items():
        if TARGET or name == "stale_heartbeat_of_another_host":
            FUTURES[name] = POOL.submit(scenario, unittest.TestCase())


def tearDownModule():
    if POOL is not None:
        POOL.shutdown(wait=True, cancel_futures=True)
    for job in JOBS.values():
        job.stop()
    shutil.rmtree(TMP, ignore_errors=True)


def ctl(*args):
    """`tensortap ctl ARGS` in this process: (exit status, stdout lines,
    stderr, seconds)."""
    out, err = io.StringIO(), io.StringIO()
    pipe = signal.getsignal(signal.SIGPIPE)
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(["ctl", *map(str, args)])
            except SystemExit as e:  # argparse's refusals
                rc = e.code
    finally:
        signal.signal(signal.SIGPIPE, pipe)  # main() restores the default for `| head`
    return rc, out.getvalue().splitlines(), err.getvalue(), time.monotonic() - start


def answers(run):
    """The answers in order: control.1.jsonl (once control.jsonl rolled), then control.jsonl."""
    out = []
    for name in ("control.1.jsonl", "control.jsonl"):
        if not os.path.exists(os.path.join(run, name)):
            continue
        with open(os.path.join(run, name), "rb") as f:
            for raw in f.read().split(b"\n"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(raw))
    return out


def records(run):
    """{step: {(kind, name)}} of the index so far."""
    out = collections.defaultdict(set)
    with open(os.path.join(run, "index.jsonl"), "rb") as f:
        for raw in f.read().split(b"\n"):
            with contextlib.suppress(ValueError):
                r = json.loads(raw)
                out[r["step"]].add((r["kind"], r["name"]))
    return out


def dumps(run):
    path = os.path.join(run, "dumps.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return [json.loads(raw) for raw in f.read().split(b"\n") if raw.strip()]


def run_id(run):
    with open(os.path.join(run, "run.json"), "rb") as f:
        return json.load(f)["run_id"]


def plant(run, name, text):
    """A request file written by hand: under a '.' name, then renamed in."""
    control = os.path.join(run, "control")
    with open(os.path.join(control, "." + name), "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())
    os.rename(os.path.join(control, "." + name), os.path.join(control, name + ".json"))


def wait_for(what, timeout=5.0):
    end = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > end:
            return got
        time.sleep(0.05)


def answer_to(run, ident, timeout=5.0):
    return wait_for(lambda: next((a for a in answers(run) if a.get("id") == ident), None), timeout)


def full(kinds, include=None):
    return {(k, n) for k in kinds for n in NAMES[k] if include is None or re.search(include, n)}


def requests_left(run):
    """What control/ holds, but for the flood's planted requests."""
    return [n for n in os.listdir(os.path.join(run, "control")) if not re.fullmatch(r"\.?x\d{5}(\.json)?", n)]


class Steering:
    """What the records of each step must be, from the answers ctl printed
    (FrontEnd::steer's rules): a capture window [lo, hi] with its kinds and
    include, extended by a capture inside it; every N from a step; a pause.
    Nothing else is captured: ctl_target records with every(0)."""

    def __init__(self):
        self.events = []  # (step, command, argument), in the order applied

    def expected(self, t):
        window, every, paused = None, None, None
        for s, command, arg in self.events:
            if s > t:
                break
            if command == "capture":
                n, kinds, include = arg
                if window and window[0] <= s <= window[1]:
                    window = (window[0], max(window[1], s + n - 1), window[2] | set(kinds), include)
                else:
                    window = (s, s + n - 1, set(kinds), include)
            elif command == "every":
                every = (arg, s)
            elif command == "pause":
                paused = s if paused is None else paused
            elif command == "resume":
                paused = None
        if window and window[0] <= t <= window[1]:
            return full(window[2], window[3])
        if paused is not None:
            return set()
        if every is not None and every[0] > 0 and (t - every[1]) % every[0] == 0:
            return full(DEFAULT_KINDS)
        return set()


class MainJob(unittest.TestCase):
    """One long job, steered in turn by every command (the tests run in
    their names' order); test_99 checks its whole index against them."""

    steering = Steering()
    first = None

    @classmethod
    def setUpClass(cls):
        if not TARGET:
            raise unittest.SkipTest("TT_CTL_TARGET is not set (ctest ctl.session sets it to build/tests/ctl_target)")
        cls.job = JOBS["main"]
        cls.job.wait_step(1)
        cls.run_dir = cls.job.dir

    def ok(self, *args, command=None):
        """ctl RUN ARGS, answered ok; returns the step and the message."""
        rc, lines, err, _ = ctl(self.run_dir, *args)
        self.assertEqual((rc, err), (0, ""), lines)
        command = command or args[0]
        m = re.fullmatch(rf"rank 0: {command} ok at step (\d+)(?:: (.*))?", lines[0])
        self.assertTrue(m and len(lines) == 1, lines)
        step = int(m.group(1))
        if MainJob.first is None:
            MainJob.first = step
        return step, m.group(2)

    def capture(self, steps, kinds=None, include=None):
        args = ["capture", "--steps", steps] + (["--kinds", ",".join(kinds)] if kinds else []) \
            + (["--include", include] if include else [])
        s, message = self.ok(*args)
        self.steering.events.append((s, "capture", (steps, kinds or DEFAULT_KINDS, include)))
        return s, message

    def test_01_status_line(self):
        rc, lines, _, _ = ctl(self.run_dir, "status")
        self.assertEqual(rc, 0)
        self.assertEqual(len(lines), 1)
        m = STATUS.fullmatch(lines[0])
        self.assertTrue(m, lines)
        self.assertEqual((m.group(1), m.group(3)), ("0", "budget off"))

    def test_02_capture_steps(self):
        s, message = self.capture(4)
        self.assertEqual(message, f"steps {s}..{s + 3} in full (activation+grad+tensor)")
        self.job.wait_step(s + 5)

    def test_03_capture_kinds_replace(self):
        s, message = self.capture(3, kinds=("param", "grad"))
        self.assertEqual(message, f"steps {s}..{s + 2} in full (param+grad)")
        self.job.wait_step(s + 4)

    def test_04_capture_include(self):
        s, message = self.capture(3, include=r"^fc2\.")
        self.assertEqual(message, f"steps {s}..{s + 2} in full (activation+grad+tensor, include ^fc2\\.)")
        self.job.wait_step(s + 4)

    def test_05_every(self):
        s, message = self.ok("every", 3)
        self.assertEqual(message, f"every 3 steps from step {s}")
        self.steering.events.append((s, "every", 3))
        self.job.wait_step(s + 10)

    def test_06_pause_and_capture_while_paused(self):
        p, message = self.ok("pause")
        self.assertTrue(message.startswith("full tensors paused"), message)
        self.steering.events.append((p, "pause", None))
        again, message = self.ok("pause")
        self.assertEqual((again, message), (p, f"already paused since step {p}"))
        s, _ = self.capture(2)
        self.assertGreater(s, p)
        self.job.wait_step(s + 3)

    def test_07_resume(self):
        s, message = self.ok("resume")
        self.assertEqual(message, "resumed")
        self.steering.events.append((s, "resume", None))
        self.job.wait_step(s + 7)
        s, message = self.ok("resume")
        self.assertEqual(message, "not paused")
        self.steering.events.append((s, "resume", None))

    def test_08_every_0_statistics_go_on(self):
        s, _ = self.ok("every", 1)
        self.steering.events.append((s, "every", 1))
        self.job.wait_step(s + 3)
        s, message = self.ok("every", 0)
        self.assertEqual(message, "no full tensors from now (every 0); statistics go on")
        self.steering.events.append((s, "every", 0))
        self.job.wait_step(s + 6)
        # The step before was sampled (every 1) and keeps its gradients,
        # which the recorder commits at the next step(), under every 0.
        wait_for(lambda: records(self.run_dir).get(s - 1) == full(DEFAULT_KINDS), 2.0)
        self.assertEqual(records(self.run_dir).get(s - 1), full(DEFAULT_KINDS),
                         f"step {s - 1}, the last under every 1 (its gradients are committed in step({s}))")
        import tensortap

        table, _ = tensortap.open(self.run_dir).stats_table()
        steps = set(table["step"].tolist())
        self.assertTrue(set(range(s, s + 5)) <= steps, sorted(steps)[-10:])

    def test_09_second_capture_extends(self):
        s1, _ = self.capture(40, kinds=("tensor",))
        s2, message = self.capture(60, kinds=("activation",))
        self.assertLessEqual(s2, s1 + 39, "the second capture came after the first window: too slow a machine")
        self.assertEqual(message, f"steps {s1}..{s2 + 59} in full (activation+tensor)")
        MainJob.window_end = s2 + 59

    def test_10_dump_marks_the_run(self):
        s, message = self.ok("dump")
        self.assertEqual(message, "the run is marked (dumps.jsonl); it has no flight recorder")
        d = wait_for(lambda: [d for d in dumps(self.run_dir) if d.get("reason") == "request"])
        self.assertEqual(d, [{"step": s, "reason": "request", "steps": []}])

    def test_11_malformed_requests_refused_training_goes_on(self):
        rid, later = run_id(self.run_dir), time.time() + 60
        good = {"run": rid, "command": "status", "expires": later}
        cases = {
            "bad_key": (json.dumps({"id": "bad_key", **good, "oops": 1}), "unknown key 'oops' for status"),
            "bad_tail": (json.dumps({"id": "bad_tail", **good}) + " x", "bytes after the JSON object"),
            "bad_run": (json.dumps({"id": "bad_run", **good, "run": "0" * 32}), "it names another run"),
            "bad_expired": (json.dumps({"id": "bad_expired", **good, "expires": 1}), "it has expired"),
            "bad_twice": ('{"id": "bad_twice", "id": "bad_twice", ' + json.dumps(good)[1:], "key 'id' appears twice"),
            "bad_type": (json.dumps({"id": "bad_type", **good, "command": "every", "every": "3"}),
                         "'every' must be an integer"),
            "bad_name": (json.dumps({"id": "other", **good}), "its id is not its file's name"),
            "bad_command": (json.dumps({"id": "bad_command", **good, "command": "reboot"}), "unknown command"),
            "bad_kind": (json.dumps({"id": "bad_kind", **good, "command": "capture", "steps": 1, "kinds": ["x"]}),
                         "'kinds' names no kind 'x'"),
        }
        before = self.job.step
        for name, (text, _) in cases.items():
            plant(self.run_dir, name, text)
        for name, (_, why) in cases.items():
            a = answer_to(self.run_dir, name)
            self.assertTrue(a, f"no answer to {name}")
            self.assertEqual(a["status"], "refused", a)
            self.assertIn(why, a["message"], a)
        self.job.wait_step(before + 5)
        self.assertEqual(requests_left(self.run_dir), [])

    def test_12_printf_request(self):
        # The docs' request, written by a shell (docs/leaving-it-on.md).
        script = ('RUN="$1"; RID=$(sed -n \'s/.*"run_id": *"\\([0-9a-f]*\\)".*/\\1/p\' "$RUN/run.json"); '
                  'printf \'{"id": "%s", "run": "%s", "command": "status", "expires": %s}\\n\' '
                  'req1 "$RID" $(( $(date +%s) + 60 )) > "$RUN/control/.req1" && '
                  'mv "$RUN/control/.req1" "$RUN/control/req1.json"')
        subprocess.run(["sh", "-c", script, "sh", self.run_dir], check=True)
        a = answer_to(self.run_dir, "req1")
        self.assertEqual((a["status"], a["command"]), ("ok", "status"), a)

    def test_13_sparse_gigabyte_refused_unread(self):
        control = os.path.join(self.run_dir, "control")
        with open(os.path.join(control, ".big"), "wb") as f:
            f.truncate(1 << 30)
        start = time.monotonic()
        os.rename(os.path.join(control, ".big"), os.path.join(control, "big.json"))
        a = answer_to(self.run_dir, "big")
        took = time.monotonic() - start
        self.assertEqual(a["status"], "refused", a)
        self.assertEqual(a["message"], "1073741824 bytes, more than 4096 a request may hold: refused unread")
        self.assertLess(took, HANG)
        self.assertFalse(os.path.exists(os.path.join(control, "big.json")))

    def test_14_two_ctl_processes_at_once(self):
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(_ctl.__file__))))
        procs = [subprocess.Popen([sys.executable, "-m", "tensortap", "ctl", self.run_dir, "status"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for p in procs:
            out, err = p.communicate(timeout=30)
            self.assertEqual((p.returncode, err), (0, ""), out)
            self.assertTrue(STATUS.fullmatch(out.strip()), out)

    def test_15_withdrawn_at_a_short_timeout(self):
        before = len(answers(self.run_dir))
        rc, lines, _, took = ctl(self.run_dir, "status", "--timeout", "0.05")
        self.assertLess(took, HANG)
        if rc == 0:  # the recorder's poll came within 50 ms: answered
            self.assertTrue(STATUS.fullmatch(lines[0]), lines)
            return
        self.assertEqual((rc, lines), (1, ["rank 0: status no answer (withdrawn)"]))
        self.assertEqual(requests_left(self.run_dir), [])
        time.sleep(1.2)  # two polls of the recorder: a withdrawn request is never answered
        self.assertEqual(len(answers(self.run_dir)), before)

    def test_99_records_match_the_answers(self):
        last = max(s for s, _, _ in self.steering.events)
        end = max(last, getattr(MainJob, "window_end", last)) + 4
        self.job.wait_step(end + 2)
        first = max(0, MainJob.first - 3)

        def mismatches():
            got = records(self.run_dir)
            return [(t, sorted(got.get(t, ())), sorted(self.steering.expected(t))) for t in range(first, end + 1)
                    if got.get(t, set()) != self.steering.expected(t)]

        # The index lags its records by a batch of the writer.
        wait_for(lambda: not mismatches(), 3.0)
        self.assertEqual(mismatches(), [])
        self.assertEqual([s for s in records(self.run_dir) if s < first], [])


def ctl_quiet(run, action, value=None, steps=None, kinds=None, include=None, rank=None, timeout=30):
    """`tensortap ctl` from a thread: ctl's own entry with the namespace
    argparse makes (strings), its lines collected, nothing printed."""
    text = (lambda v: None if v is None else str(v))
    args = argparse.Namespace(run=run, action=action, value=text(value), steps=text(steps), kinds=kinds,
                              include=include, rank=text(rank), timeout=str(timeout))
    out, err = [], []
    start = time.monotonic()
    rc = _ctl.main(args, out.append, err.append)
    return rc, out, "".join(err), time.monotonic() - start


def scenario_held_between_steps(t):
    job = JOBS["held"]
    job.wait_step(5)
    rc, lines, _, took = ctl_quiet(job.dir, "status")
    t.assertEqual(rc, 0, lines)
    m = STATUS.fullmatch(lines[0])
    t.assertEqual(m.group(2), "5", lines)
    t.assertLess(took, HANG)
    rc, lines, _, took = ctl_quiet(job.dir, "dump")
    t.assertEqual((rc, lines), (0, ["rank 0: dump ok at step 5: the run is marked (dumps.jsonl); "
                                    "it has no flight recorder"]))
    t.assertLess(took, HANG)
    t.assertEqual(dumps(job.dir), [{"step": 5, "reason": "request", "steps": []}])
    # capture waits for a step() that does not come: taken, not in effect.
    rc, lines, _, took = ctl_quiet(job.dir, "capture", steps=2, timeout=1.2)
    t.assertEqual((rc, lines), (1, ["rank 0: capture taken at step 5, not yet in effect"]))
    t.assertLess(took, HANG)
    t.assertEqual(requests_left(job.dir), [])
    open(os.path.join(TMP, "go"), "w").close()
    job.wait_end()
    applied = [a for a in answers(job.dir) if a["command"] == "capture"]
    t.assertEqual([(a["status"], a["step"], a["message"]) for a in applied],
                  [("ok", 6, "steps 6..7 in full (activation+grad+tensor)")])
    t.assertEqual(dict(records(job.dir)), {6: full(DEFAULT_KINDS), 7: full(DEFAULT_KINDS)})
    # A finished run: no live recorder, at once.
    rc, lines, _, took = ctl_quiet(job.dir, "status")
    t.assertEqual((rc, lines), (1, ["rank 0: no live recorder (the run was closed)"]))
    t.assertLess(took, HANG)


def scenario_flight_recorder_dump_and_capture(t):
    job = JOBS["flight"]
    job.wait_step(1)
    rc, lines, _, _ = ctl_quiet(job.dir, "every", 1)
    t.assertEqual(rc, 0, lines)
    s = int(re.fullmatch(r"rank 0: every ok at step (\d+): .*", lines[0]).group(1))
    job.wait_step(s + 5)
    rc, lines, _, _ = ctl_quiet(job.dir, "dump")
    m = re.fullmatch(r"rank 0: dump ok at step (\d+): the flight recorder dumped steps (\d+)\.\.(\d+) \((\d+) steps\)",
                     lines[0])
    t.assertTrue(rc == 0 and m, lines)
    at, lo, hi, n = map(int, m.groups())
    # The answer lists the steps written: those held (the request's own step
    # comes later, through the dump's window, and is not listed).
    t.assertLessEqual(hi, at)
    t.assertEqual(n, hi - lo + 1)
    t.assertGreaterEqual(hi - lo, 2)  # the three held steps at least
    line = wait_for(lambda: [d for d in dumps(job.dir) if d.get("reason") == "request"])
    t.assertEqual(len(line), 1)
    t.assertEqual((line[0]["step"], line[0]["steps"][0], line[0]["steps"][-1]), (at, lo, hi))
    # A capture goes to disk although the flight recorder holds steps.
    rc, lines, _, _ = ctl_quiet(job.dir, "capture", steps=2, kinds="tensor")
    c = int(re.fullmatch(r"rank 0: capture ok at step (\d+): .*", lines[0]).group(1))
    job.wait_step(c + 4)
    # The dump's window writes the steps after those held up to its own.
    want = {step: full(DEFAULT_KINDS) for step in range(lo, at + 1)}
    want.update({c: full(("tensor",)), c + 1: full(("tensor",))})
    t.assertTrue(wait_for(lambda: dict(records(job.dir)) == want, 3.0), sorted(records(job.dir)))


def scenario_two_ranks(t):
    job = JOBS["ranks"]
    job.wait_step(1)
    rc, lines, _, _ = ctl_quiet(job.dir, "status")
    t.assertEqual(rc, 0, lines)
    t.assertEqual([STATUS.fullmatch(x).group(1) for x in lines], ["0", "1"])
    rc, lines, _, _ = ctl_quiet(job.dir, "status", rank=1)
    t.assertEqual((rc, len(lines)), (0, 1), lines)
    t.assertEqual(STATUS.fullmatch(lines[0]).group(1), "1")
    rc, lines, _, _ = ctl_quiet(job.dir, "capture", steps=2, kinds="tensor")
    t.assertEqual(rc, 0, lines)
    at = {}
    for line in lines:
        m = re.fullmatch(r"rank (\d): capture ok at step (\d+): steps \2\.\.\d+ in full \(tensor\)", line)
        t.assertTrue(m, lines)
        at[int(m.group(1))] = int(m.group(2))
    t.assertEqual(sorted(at), [0, 1])
    job.wait_step(max(at.values()) + 4)
    for r, s in at.items():
        rank_dir = os.path.join(job.dir, f"rank{r}")
        want = {s: full(("tensor",)), s + 1: full(("tensor",))}
        t.assertTrue(wait_for(lambda: dict(records(rank_dir)) == want, 3.0), (r, sorted(records(rank_dir))))
    rc, lines, err, _ = ctl_quiet(job.dir, "status", rank=2)
    t.assertEqual((rc, lines), (2, []))
    t.assertIn("no rank 2; ranks: [0, 1]", err)


def scenario_fork_child_never_answers(t):
    job = JOBS["fork"]
    job.wait_step(1)
    for command, steps in (("status", None), ("status", None), ("capture", 1), ("status", None)):
        rc, lines, _, _ = ctl_quiet(job.dir, command, steps=steps)
        t.assertEqual(rc, 0, lines)
    t.assertRegex(lines[0], r"budget \d+/50000000 \(stop_capture\)")
    time.sleep(0.6)  # a child that answered would have by now: a poll is every 0.5 s
    ids = collections.Counter(a["id"] for a in answers(job.dir))
    t.assertEqual(sorted(ids.values()), [1, 1, 1, 1], ids)
    with open(os.path.join(job.dir, "control.heartbeat"), "rb") as f:
        t.assertEqual(json.loads(f.read())["pid"], job.proc.pid)


def scenario_flood_then_sigkill(t):
    job = JOBS["flood"]
    job.wait_step(1)
    rid, later = run_id(job.dir), time.time() + 60
    control = os.path.join(job.dir, "control")
    for i in range(10000):
        with open(os.path.join(control, f".x{i:05d}"), "w") as f:
            json.dump({"id": f"x{i:05d}", "run": rid, "command": "status", "expires": later}, f)
    step = job.step
    for i in range(10000):
        os.rename(os.path.join(control, f".x{i:05d}"), os.path.join(control, f"x{i:05d}.json"))
    rc, lines, _, took = ctl_quiet(job.dir, "status", timeout=10)
    t.assertEqual(rc, 0, lines)
    t.assertTrue(STATUS.fullmatch(lines[0]), lines)
    job.wait_step(step + 10, timeout=10)  # training goes on
    # At most 1,024 wait and 64 a poll are taken: the rest (more than
    # 8,500 over the few polls the renames span) are refused unread.
    refused = wait_for(lambda: [a for a in answers(job.dir) if a["status"] == "refused"][8500:] and
                       [a for a in answers(job.dir) if a["status"] == "refused"], 5.0)
    t.assertTrue(refused, len([a for a in answers(job.dir) if a["status"] == "refused"]))
    t.assertTrue(all(a["message"] == "too many pending requests (more than 1024)" for a in refused))
    # SIGKILL: the heartbeat's process is gone, and ctl says so at once.
    job.proc.kill()
    job.proc.wait()
    rc, lines, _, took = ctl_quiet(job.dir, "status")
    t.assertEqual((rc, lines), (1, [f"rank 0: no live recorder (process {job.proc.pid} on this host has ended)"]))
    t.assertLess(took, HANG)
    t.assertEqual(requests_left(job.dir), [])  # the planted ones aside, nothing of ctl's is left


def scenario_requests_while_close_runs(t):
    job = JOBS["closing"]
    job.wait_step(2)
    results = []

    def ask(delay, request):
        time.sleep(delay)
        start = time.monotonic()
        lines, rc = _ctl.run_command(job.dir, request, 4.0)
        results.append((lines, rc, time.monotonic() - start))

    # Spread over the job's last step, its close() (some 50 ms after the
    # release) and after: answered, refused by close(), or no live
    # recorder; never a hang.
    threads = [threading.Thread(target=ask, args=(0.05 * i, _ctl.Request("capture", steps=1) if i % 2 else
                                                  _ctl.Request("status"))) for i in range(16)]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    open(os.path.join(TMP, "go-closing"), "w").close()
    for thread in threads:
        thread.join()
    job.wait_end()
    allowed = re.compile(r"rank 0: ((status|capture) ok at step \d+: .*|"
                         r"(status|capture) refused: the run was closed( before its next step\(\))?|"
                         r"no live recorder \(.*\))")
    for lines, rc, took in results:
        t.assertLess(took, HANG)
        t.assertEqual(len(lines), 1)
        t.assertRegex(lines[0], allowed)
    t.assertEqual(requests_left(job.dir), [])


def scenario_stale_heartbeat_of_another_host(t):
    # A job on another node that stopped beating: judged by its beat alone.
    run = FakeRun("stale", host="another-node.invalid", beating=False)
    try:
        rc, lines, _, took = ctl_quiet(run.dir, "status")
    finally:
        run.close()
    t.assertEqual((rc, lines), (1, ["rank 0: no live recorder (its heartbeat has not changed for 2.5 s)"]))
    t.assertTrue(2.4 < took < HANG, took)  # it waited for the beat to change
    t.assertEqual(run.requests(), [])


# The jobs' scenarios, each in a thread from the module's start: they wait
# for their jobs, and run beside MainJob's commands and the fakes' tests.
SCENARIOS = {name[len("scenario_"):]: f for name, f in list(globals().items()) if name.startswith("scenario_")}


class OtherJobs(unittest.TestCase):
    """A job held between steps, a flight recorder, two ranks, a fork(), a
    flood of requests then SIGKILL, requests while close() runs, a stale
    heartbeat: each ran in a thread of its own (SCENARIOS); a test here
    waits for it and fails with its failure."""

    def outcome(self, name):
        if name not in FUTURES:
            self.skipTest("TT_CTL_TARGET is not set (ctest ctl.session sets it to build/tests/ctl_target)")
        FUTURES[name].result(timeout=120)

    def test_held_between_steps(self):
        self.outcome("held_between_steps")

    def test_flight_recorder_dump_and_capture(self):
        self.outcome("flight_recorder_dump_and_capture")

    def test_two_ranks(self):
        self.outcome("two_ranks")

    def test_fork_child_never_answers(self):
        self.outcome("fork_child_never_answers")

    def test_flood_then_sigkill(self):
        self.outcome("flood_then_sigkill")

    def test_requests_while_close_runs(self):
        self.outcome("requests_while_close_runs")


class FakeRun:
    """A run directory as a recorder leaves it, with a heartbeat this test
    beats itself (or not): the liveness rules without a job."""

    def __init__(self, name, channel="on", host=None, pid=None, beating=True, step=7, closed=False):
        self.dir = os.path.join(TMP, name)
        os.makedirs(os.path.join(self.dir, "control"), mode=0o700)
        with open(os.path.join(self.dir, "run.json"), "w") as f:
            json.dump({"run_id": "ab" * 16, "rank": 0, "world_size": 1, "closed": closed}, f)
        open(os.path.join(self.dir, "control.jsonl"), "wb").close()
        self.fields = {"pid": os.getpid() if pid is None else pid, "beat": 0, "step": step, "time": 0,
                       "channel": channel, "host": socket.gethostname() if host is None else host}
        self.beat()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, args=(beating,), daemon=True)
        self.thread.start()

    def beat(self):
        self.fields["beat"] += 1
        line = json.dumps(self.fields).ljust(255) + "\n"
        with open(os.path.join(self.dir, "control.heartbeat"), "r+b" if self.fields["beat"] > 1 else "wb") as f:
            f.write(line.encode())

    def _beat(self, beating):
        while not self.stop.wait(0.2):
            if beating:
                self.beat()

    def requests(self):
        return os.listdir(os.path.join(self.dir, "control"))

    def close(self):
        self.stop.set()
        self.thread.join()


class Fakes(unittest.TestCase):
    def fake(self, name, **kw):
        run = FakeRun(name, **kw)
        self.addCleanup(run.close)
        return run

    def test_withdrawn_when_never_taken(self):
        run = self.fake("never-taken")
        rc, lines, _, took = ctl(run.dir, "status", "--timeout", 0.4)
        self.assertEqual((rc, lines), (1, ["rank 0: status no answer (withdrawn)"]))
        self.assertLess(took, HANG)
        self.assertEqual(run.requests(), [])

    def test_taken_not_in_effect(self):
        run = self.fake("taken")
        control = os.path.join(run.dir, "control")
        taker = threading.Thread(target=lambda: wait_for(
            lambda: [os.unlink(os.path.join(control, n)) for n in os.listdir(control) if n.endswith(".json")], 2))
        taker.start()
        rc, lines, _, _ = ctl(run.dir, "capture", "--steps", 1, "--timeout", 0.6)
        taker.join()
        self.assertEqual((rc, lines), (1, ["rank 0: capture taken at step 7, not yet in effect"]))

    def test_hostile_answers_and_a_huge_control_jsonl(self):
        run = self.fake("hostile-answers")
        answers_path = os.path.join(run.dir, "control.jsonl")
        with open(answers_path, "r+b") as f:
            f.truncate(1 << 30)  # sparse: ctl reads only what follows its request
        control = os.path.join(run.dir, "control")

        def answer():
            names = wait_for(lambda: [n for n in os.listdir(control) if n.endswith(".json")], 2)
            ident = names[0][:-5]
            with open(os.path.join(control, names[0]), "rb") as f:
                request = json.loads(f.read())
            self.assertEqual(sorted(request), ["command", "expires", "id", "run", "steps"])
            self.assertEqual((request["run"], request["steps"]), ("ab" * 16, 3))
            os.unlink(os.path.join(control, names[0]))
            with open(answers_path, "ab") as f:
                f.write(b"garbage\n" + b"x" * 200000 + b"\n\xff\xfe\n[1,2]\n")
                f.write(json.dumps({"id": ident, "status": "maybe"}).encode() + b"\n")
                f.write(json.dumps({"id": ident, "command": "capture", "status": "ok", "step": 9,
                                    "message": "steps 9..11 \x1b[31m\u202e"}).encode() + b"\n")

        t = threading.Thread(target=answer)
        t.start()
        rc, lines, _, took = ctl(run.dir, "capture", "--steps", 3, "--timeout", 5)
        t.join()
        self.assertEqual((rc, lines), (0, ["rank 0: capture ok at step 9: steps 9..11 \\x1b[31m\\u202e"]))
        self.assertLess(took, HANG)

    def test_no_control_channel(self):
        run = self.fake("channel-off", channel="off: '/x/control' is not a directory (a symbolic link?)")
        rc, lines, _, took = ctl(run.dir, "status")
        self.assertEqual((rc, lines), (1, ["rank 0: no control channel ('/x/control' is not a directory "
                                           "(a symbolic link?))"]))
        self.assertLess(took, HANG)
        self.assertEqual(run.requests(), [])

    def test_control_links_are_not_followed(self):
        for name, what in (("control", "control/: a symbolic link"), ("control.jsonl", "a symbolic link")):
            run = self.fake("link-" + name.replace(".", "-"))
            elsewhere = os.path.join(TMP, "elsewhere-" + name)
            os.makedirs(elsewhere)
            target = os.path.join(run.dir, name)
            shutil.rmtree(target) if os.path.isdir(target) else os.unlink(target)
            os.symlink(elsewhere if name == "control" else os.path.join(elsewhere, "x"), target)
            rc, lines, _, _ = ctl(run.dir, "status", "--timeout", 1)
            self.assertEqual(rc, 1)
            self.assertTrue(lines[0].startswith("rank 0: no control channel (") and what in lines[0], lines)
            self.assertEqual(os.listdir(elsewhere), [])

    def test_stale_heartbeat_of_another_host(self):
        FUTURES["stale_heartbeat_of_another_host"].result(timeout=60)

    def test_process_gone_closed_or_no_heartbeat(self):
        gone = subprocess.Popen(["true"])
        gone.wait()
        cases = [(self.fake("gone", pid=gone.pid), f"process {gone.pid} on this host has ended"),
                 (self.fake("closed", closed=True), "the run was closed")]
        run = self.fake("no-heartbeat")
        run.close()
        os.unlink(os.path.join(run.dir, "control.heartbeat"))
        cases.append((run, "no control.heartbeat"))
        for run, why in cases:
            rc, lines, _, took = ctl(run.dir, "status")
            self.assertEqual((rc, lines), (1, [f"rank 0: no live recorder ({why})"]))
            self.assertLess(took, HANG)
            self.assertEqual(run.requests(), [])

    def test_pid_0_is_never_signalled(self):
        # kill(0) or kill(-1) would ask a process group: such a pid is not judged.
        for pid in (0, -1):
            run = self.fake(f"pid{pid}", pid=pid)
            rc, lines, _, _ = ctl(run.dir, "status", "--timeout", 0.2)
            self.assertEqual((rc, lines), (1, ["rank 0: status no answer (withdrawn)"]))

    def test_bad_input(self):
        run = self.fake("bad-input")
        cases = [(["every"], "every wants N"), (["every", "-1"], "every '-1'"), (["every", "x"], "every 'x'"),
                 (["every", "1.5"], "every '1.5'"), (["every", str(1 << 41)], str(1 << 41)),
                 (["capture"], "capture wants --steps N"), (["capture", "--steps", "0"], "--steps '0'"),
                 (["capture", "--steps", "2", "--kinds", "grad,bogus"], "'bogus' is not a kind"),
                 (["capture", "--steps", "2", "--kinds", ""], "'' is not a kind"),
                 (["capture", "--steps", "2", "--include", ""], "--include ''"),
                 (["capture", "--steps", "2", "--include", "a" * 5000], "--include is 5000 characters"),
                 (["status", "5"], "status takes no N (got '5')"), (["pause", "--steps", "3"], "--steps goes with capture"),
                 (["status", "--timeout", "0"], "--timeout '0'"), (["status", "--timeout", "nan"], "--timeout 'nan'"),
                 (["status", "--rank", "x"], "--rank 'x'"), (["status", "--rank", "3"], "no rank 3"),
                 (["reboot"], "invalid choice: 'reboot'")]
        for args, named in cases:
            rc, lines, err, _ = ctl(run.dir, *args)
            self.assertEqual((rc, lines), (2, []), args)
            self.assertIn(named, err, args)
        rc, lines, err, _ = ctl(TMP, "status")
        self.assertEqual((rc, lines), (2, []))
        self.assertIn("not a tensortap run", err)
        self.assertEqual(run.requests(), [])


if __name__ == "__main__":
    unittest.main()
