"""The soak check (issue 71): the docs' leave-it-on settings all at once, a
real job (tests/soak/soak_job.cpp) under a disk budget ten or more times too
small, with `tensortap ctl` traffic from a second process, a reader
re-opening the run throughout, a stall, and SIGKILLs; then every output and
every control answer held to what the run shows.

    soak.py SOAK_JOB [--long] [--minutes M] [--out DIR] [--keep]

Short mode (ctest, both trees): four runs of 2,000 steps, a 2 MiB budget:
`.npy` keep_latest, packed keep_latest, packed stop_capture, and `.npy`
keep_latest killed twice with SIGKILL and restarted into new run
directories; 200 ctl requests a run (status, every, pause/resume, capture,
dump). Long mode (by hand, docs/leaving-it-on.md): the CNN, runs of 5,000
steps until M minutes (20) have passed, a kill in each run, 10,000
requests and 20 kills at least; it prints the figures.

After each run: `du -sb` within the documented bound; `inspect --check`
clean; the newest steps written are there; statistics and TensorBoard's
loss reach the last step, or run.json's "monitoring" says when they
stopped; a killed run shows at least one step and none older than the
reader saw before the kill; and every ctl answer was true (see
check_answers). Everything runs in a temporary folder; the repository is
checked unchanged at the end.

A check that fails prints `FAIL <run>: <check>: <why>`. Checks known to
fail while an issue is open are listed in KNOWN_OPEN with the issue: they
print `known (<issue>)` and do not fail the run; any other failure does.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import tensortap
from tensortap import __main__ as cli
from tensortap._ctl import client as _ctl

# The MLP's full step is about 330 KB: the budget's half left beside the
# dumps' share (dumps_percent 50) holds two of them and the files beside
# them (statistics, events, the lines files), as docs/leaving-it-on.md says
# a budget must. At 1 MiB it held one and a half: the newest step's records
# were refused whenever the share was full (CI, 2.11, 1 run in 2).
BUDGET = 2 << 20
# The long mode's CNN captures about 1 MB a step in full: its budget holds
# eight, since a budget that holds fewer than two whole steps cannot keep
# one while the next is written (a live reader then finds the run empty).
LONG_BUDGET = 8 << 20
REQUESTS = 200
STEPS = 2000
EVERY = 20  # soak_job's cadence
# check name -> the open issue it waits on (empty: none).
# The job's warnings on stderr, by run label (said with a failed check).
JOB_WARNINGS = {}
# (The live reader's empty open, known open until 2ab8aa5: dumped steps a
# capture window had stored filled the budget outside the dumps' share, and
# the newest step went to make room; 0 of 16 runs since.)
# ('nothing refused under keep_latest', known open until the budget made room
# by every way in turn, measured again after each: a give-up's measure found
# the statistics and events grown past the estimate, or dumped steps that left
# the share above the marker freed nothing, and the newest record was refused;
# 0 of 23 runs since, on a loaded machine.)
KNOWN_OPEN = {}


def du_sb(path):
    total = os.lstat(path).st_size
    for d, dirs, files in os.walk(path):
        for n in dirs + files:
            total += os.lstat(os.path.join(d, n)).st_size
    return total


class Report:
    def __init__(self):
        self.failed = []
        self.known = []
        self.lines = []

    def check(self, run, name, ok, why):
        if ok:
            return
        line = f"{run}: {name}: {why}"
        # The first two of each check and run are printed, the rest counted.
        seen = sum(1 for r, n in self.known + self.failed if (r, n) == (run, name))
        if name in KNOWN_OPEN:
            self.known.append((run, name))
            if seen < 2:
                print(f"known ({KNOWN_OPEN[name]}) {line}", flush=True)
        else:
            self.failed.append((run, name))
            if seen < 2:
                print(f"FAIL {line}", flush=True)

    def counts(self, which):
        out = {}
        for r, n in which:
            out[f"{r}: {n}"] = out.get(f"{r}: {n}", 0) + 1
        return out


# ---- TensorBoard's events, read by hand (TFRecord framing, Event, Summary) ----

def _varint(b, i):
    shift = value = 0
    while True:
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def _fields(b):
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(b, i)
        elif wire == 1:
            v, i = b[i:i + 8], i + 8
        elif wire == 5:
            v, i = b[i:i + 4], i + 4
        elif wire == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        yield number, v


def event_steps(run_dir, tag):
    """The steps at which the events files of run_dir hold `tag`."""
    steps = []
    for name in sorted(os.listdir(run_dir)):
        if not name.startswith("events.out.tfevents."):
            continue
        with open(os.path.join(run_dir, name), "rb") as f:
            data = f.read()
        i = 0
        while i + 12 <= len(data):
            (n,) = struct.unpack_from("<Q", data, i)
            if i + 12 + n + 4 > len(data):
                break  # a torn last event of a killed job
            event = data[i + 12:i + 12 + n]
            i += 12 + n + 4
            step = 0
            for number, v in _fields(event):
                if number == 2:
                    step = v
                elif number == 5:
                    for vn, value in _fields(v):
                        if vn == 1 and any(fn == 1 and fv == tag.encode() for fn, fv in _fields(value)):
                            steps.append(step)
    return steps


# ---- the second process: ctl traffic ----

def ctl_client(run_dir, n, seed, stop_file, out_file):
    """Sends n requests (32 at a time) until stop_file exists; writes each
    request's command and the line ctl printed, one JSON line each."""
    rng = random.Random(seed)
    plan = []
    for _ in range(n):
        r = rng.random()
        if r < 0.35:
            plan.append(_ctl.Request("status"))
        elif r < 0.5:
            plan.append(_ctl.Request("every", every=rng.choice([0, 5, 10, 20, 50])))
        elif r < 0.6:
            plan.append(_ctl.Request("pause"))
        elif r < 0.7:
            plan.append(_ctl.Request("resume"))
        elif r < 0.85:
            plan.append(_ctl.Request("capture", steps=rng.randint(1, 3),
                                     kinds=rng.choice([None, ("grad",), ("param", "grad")])))
        else:
            plan.append(_ctl.Request("dump"))

    def send(req):
        if os.path.exists(stop_file):
            return None
        # Each a little apart, so that requests spread over the run.
        time.sleep(rng.random() * 0.2)
        try:
            lines, status = _ctl.run_command(run_dir, req, 5.0)
        except _ctl.BadInput as e:  # the run directory not made yet
            return {"command": req.command, "line": f"bad input: {e}", "status": 2}
        return {"command": req.command, "line": lines[0], "status": status}

    # The job makes its run directory after LibTorch loads: requests begin then.
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(run_dir, "run.json")) and time.monotonic() < deadline:
        if os.path.exists(stop_file):
            break
        time.sleep(0.02)
    with ThreadPoolExecutor(32) as pool, open(out_file, "w") as out:
        for res in pool.map(send, plan):
            if res is not None:
                out.write(json.dumps(res) + "\n")


# ---- what a run shows ----

def read_answers(run_dir):
    answers = []
    for name in ("control.1.jsonl", "control.jsonl"):
        p = os.path.join(run_dir, name)
        if os.path.exists(p):
            with open(p) as f:
                for line in f:
                    if line.endswith("\n"):
                        answers.append(json.loads(line))
    return answers


def run_json(run_dir):
    with open(os.path.join(run_dir, "run.json")) as f:
        return json.load(f)


def stats_steps_of(run):
    """The steps the statistics table has rows of, ascending."""
    try:
        table, _ = run.stats_table()
    except tensortap.RunError:
        return []
    return np.unique(table["step"]).tolist()


def inspect_check(run_dir):
    import contextlib
    import io
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["inspect", "--check", run_dir])
    return status, out.getvalue() + err.getvalue()


class LiveReader:
    """Opens and reads the run again and again while the job runs: each read
    returns the array or GivenUpError; once a record was seen, an open that
    shows none is counted."""

    def __init__(self, run_dir):
        self.run_dir = run_dir
        self.opens = self.read = self.given_up = self.empty_after_seen = 0
        self.newest = -1  # the newest step an open showed
        self.first_empty = None
        self.errors = []

    def once(self):
        if not os.path.exists(os.path.join(self.run_dir, "run.json")):
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn last line of a running job
            try:
                run = tensortap.open(self.run_dir)
            except tensortap.RunError as e:
                self.errors.append(f"open: {e}")
                return
            records = list(run.records)
            self.opens += 1
            if not records:
                if self.newest >= 0:
                    self.empty_after_seen += 1
                    if self.first_empty is None:  # what the open saw, for the failure's message
                        try:
                            names = sorted(n for n in os.listdir(self.run_dir) if n.startswith(("index", "dumps")))
                        except OSError:
                            names = []
                        self.first_empty = (f"marker {run.given_up_below}, hidden {run.given_up_records}, "
                                            f"files {names}, dumps {[d.get('steps') for d in run.dumps][-3:]}")
                return
            self.newest = max(self.newest, max(r["step"] for r in records))
            for rec in records[-40:]:
                try:
                    a = run._read(rec, mmap=False)
                except tensortap.GivenUpError:
                    self.given_up += 1
                    continue
                except Exception as e:  # noqa: BLE001 - anything else is the failure
                    self.errors.append(f"{rec['kind']} {rec['name']} step {rec['step']}: {type(e).__name__}: {e}")
                    continue
                if list(a.shape) != rec["shape"]:
                    self.errors.append(f"{rec['name']} step {rec['step']}: shape {a.shape} != {rec['shape']}")
                self.read += 1


# ---- the checks ----

STATUS = re.compile(r"records (\d+), bytes (\d+),")
RANGE = re.compile(r"steps (\d+)\.\.(\d+)")


def check_answers(rep, label, run_dir, run, info, killed, stats_last):
    """Every ctl answer true, against what the run shows."""
    answers = read_answers(run_dir)
    ids = [a["id"] for a in answers]
    rep.check(label, "one answer a request", len(ids) == len(set(ids)),
              f"{len(ids) - len(set(ids))} request ids answered twice")
    steps_with = {}
    for r in run.records:
        steps_with.setdefault(r["step"], set()).add(r["kind"])
    marker = run.given_up_below.get(None, -1)
    budget = info.get("budget") or {}
    reached = budget.get("reached_at_step")
    reached = reached if reached is not None else -1
    stop_capture = budget.get("policy") == "stop_capture"
    dumps = run.dumps
    last_records = last_bytes = -1
    timeline = []  # (step, order, what, value)
    for order, a in enumerate(answers):
        cmd, ok, step, msg = a.get("command"), a.get("status") == "ok", a.get("step"), a.get("message", "")
        if not ok or step is None:
            continue
        if cmd == "status":
            m = STATUS.search(msg)
            rep.check(label, "status answer parses", m is not None, msg)
            if m:
                recs, nbytes = int(m.group(1)), int(m.group(2))
                rep.check(label, "status counts never decrease", recs >= last_records and nbytes >= last_bytes,
                          f"'{msg}' after records {last_records}, bytes {last_bytes}")
                last_records, last_bytes = max(recs, last_records), max(nbytes, last_bytes)
                if not killed:
                    rep.check(label, "status counts within the run's", recs <= info["records"]
                              and nbytes <= info["bytes"], f"'{msg}' but run.json: {info['records']} records, "
                              f"{info['bytes']} bytes")
            if "statistics stopped" not in msg and not killed:
                rep.check(label, "status true of statistics", stats_last >= step - 1,
                          f"at step {step} '{msg}' says nothing of statistics stopping; they end at step {stats_last}")
        if "statistics" in msg and "go on" in msg and "statistics stopped" not in msg and not killed:
            rep.check(label, "statistics go on when said", stats_last >= step - 1,
                      f"{cmd} at step {step}: '{msg}', but statistics end at step {stats_last}")
        if cmd in ("every", "pause", "resume"):
            timeline.append((step, order, cmd, a))
        if cmd == "dump":
            mine = [d for d in dumps if d.get("reason") == "request" and d.get("step") == step]
            m = RANGE.search(msg)
            if m:
                lo, hi = int(m.group(1)), int(m.group(2))
                # Two requests at one step make two dumps: one of them is this answer's.
                rep.check(label, "dump answer listed", any(d.get("steps") and min(d["steps"]) == lo
                                                           and max(d["steps"]) == hi for d in mine),
                          f"'{msg}' at step {step}, dumps.jsonl: {mine}")
            for d in mine:
                for s in d.get("steps", []):
                    rep.check(label, "dumped steps on disk", s in steps_with or s < marker,
                              f"dump at step {step} lists step {s}: no record on disk, not given up "
                              f"(given_up_below {marker})")
        if cmd == "capture":
            m = RANGE.search(msg)
            if not m:
                continue
            lo, hi = int(m.group(1)), int(m.group(2))
            for s in range(lo, hi + 1):
                # StopCapture: once reached, every later record is refused. The
                # run says the job's step when the writer found it reached
                # (reached_at_step), which lags the records' steps on a loaded
                # machine: a step after the last one on disk is one of those.
                stopped = stop_capture and reached >= 0 and (reached <= s or s > max(steps_with, default=-1))
                # SIGKILL: the records of steps after the newest on disk were
                # in memory (staging, the writer's batch) when the job died.
                lost = killed and s > max(steps_with, default=-1)
                if s > info.get("last_step", -1) or s < marker or stopped or lost:
                    continue
                rep.check(label, "captured steps on disk", s in steps_with,
                          f"'{msg}' (answer at step {step}): step {s} has no record, none said refused")
    # Cadence: each step a dump lists (but the dump's own and a capture
    # window's) was sampled by the cadence in effect then.
    windows = set()
    for a in answers:
        m = RANGE.search(a.get("message", "")) if a.get("command") == "capture" and a.get("status") == "ok" else None
        if m:
            windows.update(range(int(m.group(1)), int(m.group(2)) + 1))
    timeline.sort(key=lambda t: (t[0], t[1]))
    for d in dumps:
        for s in d.get("steps", []):
            if s in (d.get("step"), d.get("last_step")) or s in windows:
                continue
            every, since, paused = EVERY, 0, False
            for step, _, cmd, a in timeline:
                if step > s:
                    break
                if cmd == "every":
                    m = re.match(r"every (\d+) steps", a["message"])
                    every, since = (int(m.group(1)) if m else 0), step
                elif cmd == "pause":
                    paused = True
                elif cmd == "resume":
                    paused = False
            rep.check(label, "every answers true", not paused and every > 0 and (s - since) % every == 0,
                      f"dump at step {d.get('step')} holds step {s}, but then every {every} from {since}"
                      f"{' (paused)' if paused else ''}")
    return answers


def check_run(rep, label, run_dir, *, fmt, policy, killed, last, seen_before_kill=-1, wanted_newest=-1):
    """The checks of one run directory, after its job ended (or was killed)."""
    size = du_sb(run_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = tensortap.open(run_dir)
    info = run_json(run_dir)
    steps = sorted({r["step"] for r in run.records})
    per_step = {}
    for r in run.records:
        per_step[r["step"]] = per_step.get(r["step"], 0) + int(np.prod(r["shape"], dtype=np.int64)) * 4 + 512
    largest = max(per_step.values(), default=0)
    bound = BUDGET + BUDGET // 20 + largest + (BUDGET // 8 if fmt == "packed" else 0)
    # The records and their index alone, within the bound the budget keeps
    # for them; the whole directory (control answers, TensorBoard's events
    # counted) within the documented bound.
    records = sum(du_sb(os.path.join(run_dir, n)) for n in os.listdir(run_dir)
                  if n in ("npy", "packed") or n.startswith("index."))
    rep.check(label, "records within the bound", records <= bound, f"{records} bytes of records and index, "
              f"bound {bound}")
    rep.check(label, "within the bound", size <= bound,
              f"{size} bytes on disk, bound {bound} (budget {BUDGET}, largest step {largest}); "
              f"the largest files: {largest_files(run_dir)}")
    status, text = inspect_check(run_dir)
    rep.check(label, "inspect --check clean", status == 0 and " 0 problems" in text, text[-600:])
    monitoring = info.get("monitoring") or {}
    stopped = monitoring.get("statistics_stopped_at")
    stats_steps = stats_steps_of(run)
    stats_last = stats_steps[-1] if stats_steps else -1
    if stopped is not None:
        said = f"statistics stopped at step {stopped}: "
        rep.check(label, "inspect says statistics stopped", said in text, text[:800])
        doctor = subprocess.run([sys.executable, "-m", "tensortap", "doctor", run_dir], capture_output=True,
                                text=True)
        rep.check(label, "doctor says statistics stopped first", doctor.stdout.startswith(said),
                  doctor.stdout[:400] + doctor.stderr[-400:])
    if not killed:
        # Under KeepLatest old steps make room for the statistics: they never stop.
        rep.check(label, "statistics reach the last step or say why not",
                  stats_last == last or (stopped is not None and monitoring.get("resumed_at") is None
                                         and policy != "keep_latest"),
                  f"statistics end at step {stats_last}, the job at {last}; run.json monitoring: {monitoring or None}")
        loss = event_steps(run_dir, "tensor/loss")
        rep.check(label, "TensorBoard reaches the last step or says why not",
                  (max(loss, default=-1) == last) or stopped is not None,
                  f"tensor/loss ends at step {max(loss, default=-1)}, the job at {last}")
        if policy == "keep_latest" and wanted_newest >= 0:
            # The newest step written keeps its records, unless the statistics
            # and events of later steps (full capture paused) needed the room:
            # one marker gives up every output's older steps, and the statistics
            # then hold every step from the marker on.
            marker = run.given_up_below.get(None, -1)
            stats_first = stats_steps[0] if stats_steps else None
            rep.check(label, "the newest steps kept", (bool(steps) and steps[-1] >= wanted_newest)
                      or (marker > wanted_newest and stats_first is not None and stats_first >= marker),
                      f"newest step on disk {steps[-1] if steps else None}, newest written {wanted_newest}, "
                      f"statistics from step {stats_first}; {info.get('budget')}")
            budget = info.get("budget") or {}
            # A dump larger than its share keeps its newest steps; the rest are
            # refused and counted apart (dump_records_refused), as are records of
            # a step older than one admitted that find no room (late_records_refused:
            # a capture window's step after a newer dump's): the newest stay.
            refused = (budget.get("refused_records", 0) - budget.get("dump_records_refused", 0)
                       - budget.get("late_records_refused", 0))
            rep.check(label, "nothing refused under keep_latest", refused == 0,
                      f"{refused} records refused besides dumps' beyond their share and late ones: {budget}; the job's warnings: "
                      f"{JOB_WARNINGS.get(label, [])[:4]}")
    else:
        rep.check(label, "a killed run shows a step", bool(steps),
                  f"no record shown; run.json given_up_below {run.given_up_below}, {len(os.listdir(run_dir))} files")
        rep.check(label, "a killed run keeps what the reader saw", not steps or steps[-1] >= seen_before_kill,
                  f"newest step shown {steps[-1] if steps else None}, the reader saw {seen_before_kill} before the kill")
    answers = check_answers(rep, label, run_dir, run, dict(info, last_step=last), killed, stats_last)
    return {"size": size, "bound": bound, "answers": len(answers), "steps": steps, "stats_last": stats_last}


def largest_files(run_dir):
    sizes = []
    for d, _, files in os.walk(run_dir):
        for n in files:
            p = os.path.join(d, n)
            sizes.append((os.lstat(p).st_size, os.path.relpath(p, run_dir)))
    return ", ".join(f"{n} {s}" for s, n in sorted(sizes, reverse=True)[:4])


def wanted_steps(run_dir):
    """The newest step the job was asked to write: a capture window's or a dump's
    (a window may reach past the job's last step: the caller bounds it)."""
    newest = -1
    for a in read_answers(run_dir):
        m = RANGE.search(a.get("message", ""))
        if a.get("status") == "ok" and a.get("command") in ("capture", "dump") and m:
            newest = max(newest, int(m.group(2)))
    return newest


# ---- one run ----

def run_job(args, rep, label, run_dir, *, fmt, policy, first, steps, kill_after=None, requests=REQUESTS, seed=0):
    """Runs soak_job into run_dir with ctl traffic and the live reader; with
    kill_after (seconds after the budget is first reached), SIGKILLs it.
    Returns (the step it reached, the run's figures)."""
    stop_file = run_dir + ".stop"
    answers_file = run_dir + ".ctl"
    cmd = [args.soak_job, run_dir, "--steps", str(steps), "--first", str(first), "--format", fmt,
           "--policy", policy, "--budget", str(BUDGET), "--step-us", str(args.step_us),
           "--stall-at", str(first + steps // 2), "--model", args.model]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = subprocess.Popen([sys.executable, __file__, "--ctl", run_dir, str(requests), str(seed), stop_file,
                               answers_file])
    reader = LiveReader(run_dir)
    reached_at = None
    killed = False
    seen_before_kill = -1
    while job.poll() is None:
        reader.once()
        if kill_after is not None and reached_at is None:
            try:
                if du_sb(run_dir) >= BUDGET * 9 // 10:  # the budget about reached
                    reached_at = time.monotonic()
            except OSError:
                pass
        if reached_at is not None and time.monotonic() - reached_at >= kill_after:
            reader.once()
            seen_before_kill = reader.newest
            job.send_signal(signal.SIGKILL)
            killed = True
            break
        time.sleep(0.01)
    out, err = job.communicate()
    JOB_WARNINGS[label] = [line for line in err.splitlines() if "warning" in line]
    open(stop_file, "w").close()
    client.wait(timeout=60)
    ctl_lines = [json.loads(line) for line in open(answers_file)]
    reached_step = first
    for line in out.splitlines():
        if line.startswith("step "):
            reached_step = int(line.split()[1])
    if not killed:
        rep.check(label, "the job ends well", job.returncode == 0 and " 0 errors" in out,
                  f"exit {job.returncode}: {out[-300:]} {err[-600:]}")
        m = re.search(r"done: (\d+) records", out)
        reached_step = first + steps - 1 if m else reached_step
    rep.check(label, "the live reader reads", not reader.errors, "; ".join(reader.errors[:3]))
    if policy == "keep_latest":
        rep.check(label, "a live reader never finds the run empty again", reader.empty_after_seen == 0,
                  f"{reader.empty_after_seen} of {reader.opens} opens showed no record after one had shown "
                  f"step {reader.newest}; the first such open saw {reader.first_empty}")
    no_answer = [c for c in ctl_lines if c["line"].endswith("no answer")]
    if not killed:
        rep.check(label, "every request answered", not no_answer, f"{len(no_answer)} of {len(ctl_lines)}: "
                  f"{no_answer[:2]}")
    figures = check_run(rep, label, run_dir, fmt=fmt, policy=policy, killed=killed, last=reached_step,
                        seen_before_kill=seen_before_kill, wanted_newest=min(wanted_steps(run_dir), reached_step))
    figures.update(requests=len(ctl_lines), killed=killed, opens=reader.opens, reached_step=reached_step)
    print(f"{label}: {fmt} {policy}, steps {first}..{reached_step}{' (SIGKILL)' if killed else ''}, "
          f"{len(ctl_lines)} requests ({sum(1 for c in ctl_lines if c['status'] == 0)} ok), {reader.opens} opens, "
          f"{figures['size']} bytes (bound {figures['bound']}), steps kept {figures['steps'][:1]}.."
          f"{figures['steps'][-1:]}, statistics to step {figures['stats_last']}", flush=True)
    return reached_step, figures


def repo_state(root):
    try:
        return subprocess.run(["git", "-C", root, "status", "--porcelain", "--ignored=no"], capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--ctl":
        run_dir, n, seed, stop_file, out_file = sys.argv[2:7]
        ctl_client(run_dir, int(n), int(seed), stop_file, out_file)
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("soak_job")
    p.add_argument("--long", action="store_true")
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--out")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    before = repo_state(root)
    out = args.out or tempfile.mkdtemp(prefix="tensortap-soak-")
    os.makedirs(out, exist_ok=True)
    rep = Report()
    start = time.monotonic()
    figures = []
    if not args.long:
        args.step_us, args.model = 500, "mlp"
        for label, fmt, policy in (("npy-keep", "npy", "keep_latest"), ("packed-keep", "packed", "keep_latest"),
                                   ("packed-stop", "packed", "stop_capture")):
            figures.append(run_job(args, rep, label, os.path.join(out, label), fmt=fmt, policy=policy, first=0,
                                   steps=STEPS, seed=len(figures))[1])
        first = 0
        for k in range(3):
            kill = None if k == 2 else 0.3 + 0.4 * k
            reached, f = run_job(args, rep, f"npy-killed.{k}", os.path.join(out, f"npy-killed.{k}"), fmt="npy",
                                 policy="keep_latest", first=first, steps=STEPS - first, kill_after=kill,
                                 requests=REQUESTS // 3, seed=10 + k)
            figures.append(f)
            rep.check(f"npy-killed.{k}", "killed as planned", f["killed"] == (kill is not None),
                      f"the job {'was not killed' if kill is not None else 'was killed'}")
            if not f["killed"]:
                break
            first = reached + 1
    else:
        global BUDGET
        args.step_us, args.model, BUDGET = 2000, "cnn", LONG_BUDGET
        n = 0
        while time.monotonic() - start < args.minutes * 60 or n < 20:
            fmt = ("npy", "packed")[n % 2]
            label = f"long.{n}"
            _, f = run_job(args, rep, label, os.path.join(out, label), fmt=fmt, policy="keep_latest", first=0,
                           steps=5000, kill_after=random.uniform(2.0, 20.0), requests=500, seed=n)
            figures.append(f)
            if not args.keep:
                shutil.rmtree(os.path.join(out, label), ignore_errors=True)
            n += 1
    worst = max(figures, key=lambda f: f["size"] / f["bound"])
    print(f"soak: {len(figures)} runs, {sum(f['reached_step'] for f in figures)} step numbers reached, "
          f"{sum(f['requests'] for f in figures)} requests, {sum(f['killed'] for f in figures)} kills, "
          f"largest du -sb {worst['size']} of bound {worst['bound']}, {time.monotonic() - start:.1f} s")
    if not args.keep and not args.out:
        shutil.rmtree(out, ignore_errors=True)
    after = repo_state(root)
    rep.check("repository", "unchanged", before == after, f"git status before:\n{before}\nafter:\n{after}")
    for what, n in rep.counts(rep.known).items():
        print(f"soak: known open ({KNOWN_OPEN[what.split(': ', 1)[1]]}): {what}: {n}")
    for what, n in rep.counts(rep.failed).items():
        print(f"soak: FAILED {what}: {n}")
    print(f"soak: {len(rep.failed)} failed checks, {len(rep.known)} known open")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
