"""`tensortap diff` at scale (issue 56): its time against reading the runs,
and its memory per record pair.

    /usr/bin/python3 bench/bench_diff_scale.py time [--mib 256] [--records 64] [--reps 3]
    /usr/bin/python3 bench/bench_diff_scale.py memory [--pairs 1000000]
    ... [--tensortap DIR]   # the package measured: DIR/tensortap (default: this checkout's python/)

"Before" figures: the same script against an older package, e.g.
`git archive <commit> python/tensortap | tar -x -C /tmp/before` then
`--tensortap /tmp/before/python` (features it lacks, such as --floor, are
skipped).

time: three runs of `mib` MiB each (under $TENSORTAP_BENCH_DIR, else
/dev/shm), `records` float32 records as the Python twin's writer writes
them (the C++ writers' .npy layout); A's step-0 records are `param`, the
others `activation`. B is A with every element moved one ulp up or down,
the port check's own case; A2 likewise with another seed (a floor). Warm
cache, alternating repetitions, medians:
- read: `np.array(run.load(...))` of every record of the runs the diff reads
  (A and B; A, B and A2 with --floor), the runs opened each time;
- the command in this process (output to /dev/null): `--rtol 1e-5` (every
  element within tolerance), exact (every element differs: ULPs of every
  element), `--rtol 1e-5 --floor A2`; and `tensortap.diff(a, b, rtol=1e-5)`,
  the DataFrame.
The target (issue 56): the command at most 2x read + 0.5 s.

memory: two packed runs of `pairs` records each (float32[4], 1,000 names
by pairs/1,000 steps), B equal to A but for one element of every 1,000th
record; written directly in the packed layout (segments of .npy images and
their index lines), in seconds. In a child process, the runs opened (the
reader's index loaded), the peak RSS reset (/proc/self/clear_refs), then
the command's work on the open runs; the growth of its peak RSS (VmHWM),
per record pair. The diff reads small packed records with pread, so no
page of a mapped file counts in it (the command before mapped the
segments: its figure includes their pages); also shown, the anonymous
memory's peak (RssAnon sampled every 2 ms, which may miss a short peak).
Also `tensortap.diff()` (a DataFrame) and the command with --html (its
page), O(records) by nature, per record.
"""

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def package_path(args):
    return os.path.abspath(args.tensortap or os.path.join(os.path.dirname(HERE), "python"))


def nudge(x, seed):
    """x with every element moved one ulp up or down (float32)."""
    up = np.random.default_rng(seed).integers(0, 2, x.size).astype(bool)
    return np.where(up, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf)))


def make_time_runs(root, mib, records):
    from tensortap._writer import RunWriter, default_options

    n = mib * (1 << 20) // 4 // records
    rng = np.random.default_rng(1)
    dirs = {k: os.path.join(root, k) for k in ("a", "b", "a2")}
    writers = {k: RunWriter(d, default_options(1, ["activation", "param"]), overwrite=True) for k, d in dirs.items()}
    for i in range(records):
        x = rng.standard_normal(n, dtype=np.float32)
        name, step = f"layer{i % 16}", i // 16
        kind = "param" if step == 0 else "activation"
        writers["a"].write(kind, name, step, x, "float32")
        writers["b"].write(kind, name, step, nudge(x, 2 + i), "float32")
        writers["a2"].write(kind, name, step, nudge(x, 100_000 + i), "float32")
    for w in writers.values():
        w.close()
    return dirs


def read_all(paths):
    import tensortap

    total = 0
    for path in paths:
        run = tensortap.open(path)
        for rec in run.records:
            total += np.array(run.load(rec["name"], rec["step"], kind=rec["kind"])).nbytes
    return total


def command(argv):
    from tensortap import __main__ as cli

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli.main(["diff", *argv])


def has_floor():
    import tensortap._diff.compare as d

    return hasattr(d, "run_command")


def time_mode(args, root):
    import tensortap

    dirs = make_time_runs(root, args.mib, args.records)
    a, b, a2 = dirs["a"], dirs["b"], dirs["a2"]
    cases = [("read A, B", lambda: read_all([a, b])),
             ("diff --rtol 1e-5", lambda: command([a, b, "--rtol", "1e-5"])),
             ("diff (exact)", lambda: command([a, b])),
             ("tensortap.diff(rtol=1e-5)", lambda: tensortap.diff(a, b, rtol=1e-5))]
    if has_floor():
        cases += [("read A, B, A2", lambda: read_all([a, b, a2])),
                  ("diff --rtol 1e-5 --floor A2", lambda: command([a, b, "--rtol", "1e-5", "--floor", a2]))]
    for _, f in cases:  # warm: the cache, and the first call's imports
        f()
    times = {name: [] for name, _ in cases}
    for _ in range(args.reps):
        for name, f in cases:
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"runs of {args.mib} MiB, {args.records} float32 records each; medians of {args.reps}")
    print("| measured | seconds | against reading | target: <= 2x read + 0.5 s |")
    print("| --- | --- | --- | --- |")
    for name, _ in cases:
        read = med["read A, B, A2"] if "floor" in name else med["read A, B"]
        if name.startswith("read"):
            print(f"| {name} | {med[name]:.3f} | 1 | |")
            continue
        target = 2 * read + 0.5
        verdict = "" if "exact" in name or "tensortap.diff" in name else (
            "met" if med[name] <= target else "MISSED")
        print(f"| {name} | {med[name]:.3f} | {med[name] / read:.2f}x | {verdict} |")
    growth = memory_child(["time", a, b], args)
    print(f"the command's peak memory growth beyond the open runs (--rtol 1e-5): anonymous "
          f"{growth['growth'] / 2**20:.1f} MiB, RSS {growth['hwm_growth'] / 2**20:.1f} MiB (with mapped files' pages)")
    return {"times": times, "medians": med, "growth": growth}


# -- memory -------------------------------------------------------------------

_HEADER_LEN = 128


def npy_image(values):
    """The .npy image of a float32[4] (format 1.0, header padded to 128 bytes)."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, values, allow_pickle=False)
    return buf.getvalue()


def make_packed_run(path, pairs, names, differ_every=0, shuffle=False):
    os.makedirs(os.path.join(path, "packed"))
    steps = (pairs + names - 1) // names
    rng = np.random.default_rng(3)
    values = rng.standard_normal((pairs, 4)).astype(np.float32)
    if differ_every:
        values[::differ_every, 0] += 1
    head = npy_image(np.zeros(4, np.float32))[:-16]
    image = len(head) + 16
    seg = np.zeros(pairs, dtype=[("h", f"S{len(head)}"), ("d", "<f4", (4,))])
    seg["h"] = head
    seg["d"] = values
    with open(os.path.join(path, "packed", "00000000.npys"), "wb") as f:
        f.write(seg.tobytes())
    order = np.arange(pairs)
    if shuffle:
        rng.shuffle(order)
    with open(os.path.join(path, "index.jsonl"), "w") as f:
        lines = []
        for i in order.tolist():
            lines.append(f'{{"step":{i // names},"kind":"activation","name":"layer{i % names}","dtype":"float32",'
                         f'"shape":[4],"file":"packed/00000000.npys","offset":{i * image},"nbytes":{image}}}\n')
            if len(lines) >= 100_000:
                f.writelines(lines)
                lines = []
        f.writelines(lines)
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump({"format_version": 1, "writer": "python", "options": {"format": "packed"}, "closed": True,
                   "records": pairs, "world_size": 1, "dumps": []}, f)
    return steps


CHILD = r"""
import gc, json, sys, threading, time
sys.path.insert(0, sys.argv[1])
mode, a, b = sys.argv[2], sys.argv[3], sys.argv[4]
import numpy as np, pandas
import tensortap
from tensortap._diff import compare as _diff

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

# The anonymous memory's peak, sampled: VmHWM counts the pages of mapped
# files too (page cache the kernel can drop), RssAnon what the process holds.
peak_anon = [0]
done = threading.Event()

def sample():
    while not done.is_set():
        peak_anon[0] = max(peak_anon[0], status("RssAnon"))
        time.sleep(0.002)

runs = [tensortap.open(a), tensortap.open(b)]
n = len(runs[0].records)
gc.collect()
reset_peak()
before = status("VmRSS")
anon_before = status("RssAnon")
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
t = time.perf_counter()
if mode in ("command", "time"):
    if hasattr(_diff, "run_command"):
        lines, rc, _ = _diff.run_command(runs + [None], _diff.Options(1e-5 if mode == "time" else 0.0))
    else:  # the command before issue 56: every row kept, then the summary
        rows, details = [], {}
        for i, (row, detail) in enumerate(_diff.iter_pairs(runs[0], runs[1], 1e-5 if mode == "time" else 0.0, 0.0)):
            rows.append(row)
            if detail:
                details[i] = detail
        lines, rc = _diff.summary_lines(rows, details)
    last = lines[-1]
elif mode == "html":
    from tensortap._pages import diff as diff_page
    rows = diff_page.Collector(floor=False)
    lines, rc, tally = _diff.run_command(runs + [None], _diff.Options(), on_row=rows)
    diff_page.write_diff_page(a + ".html", tally, rows, lines, (a, b, None), _diff.Options())
    last = lines[-1]
else:
    df = tensortap.diff(runs[0], runs[1])
    last = f"{len(df)} rows"
seconds = time.perf_counter() - t
done.set()
sampler.join()
peak_anon[0] = max(peak_anon[0], status("RssAnon"))
print(json.dumps({"growth": peak_anon[0] - anon_before, "hwm_growth": status("VmHWM") - before, "records": n,
                  "seconds": seconds, "last": last}))
"""


def memory_child(argv, args):
    out = subprocess.run([sys.executable, "-c", CHILD, package_path(args), *argv], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory_mode(args, root):
    a, b = os.path.join(root, "a"), os.path.join(root, "b")
    t = time.perf_counter()
    make_packed_run(a, args.pairs, 1000)
    make_packed_run(b, args.pairs, 1000, differ_every=1000, shuffle=args.shuffle)
    print(f"two packed runs of {args.pairs} records written in {time.perf_counter() - t:.1f} s"
          + (" (B's index shuffled)" if args.shuffle else ""))
    result = {}
    modes = ["command"] if args.command_only else ["command", "api"] + (["html"] if has_floor() else [])
    for mode in modes:
        r = memory_child([mode, a, b], args)
        result[mode] = r
        per = r["hwm_growth"] / args.pairs
        what = {"command": "the command", "api": "tensortap.diff()", "html": "the command with --html"}[mode]
        print(f"| {what} | {args.pairs} pairs | {r['seconds']:.1f} s | peak RSS +{r['hwm_growth'] / 2**20:.1f} MiB "
              f"(anonymous, sampled: +{r['growth'] / 2**20:.1f} MiB) | **{per:.1f} B a record pair** | "
              f"{per * 10_000_000 / 2**30:.2f} GiB at 10M (extrapolated) | {r['last']} |")
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("time", "memory"))
    p.add_argument("--mib", type=int, default=256, help="time: each run's size (default 256)")
    p.add_argument("--records", type=int, default=64, help="time: records per run (default 64)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pairs", type=int, default=1_000_000, help="memory: records per run (default 1,000,000)")
    p.add_argument("--shuffle", action="store_true", help="memory: B's index in another order than A's")
    p.add_argument("--command-only", action="store_true", help="memory: leave out tensortap.diff()")
    p.add_argument("--tensortap", metavar="DIR", help="the package measured: DIR/tensortap")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    sys.path.insert(0, package_path(args))
    base = os.environ.get("TENSORTAP_BENCH_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    root = tempfile.mkdtemp(prefix="tensortap-bench-diff-", dir=base)
    try:
        result = time_mode(args, root) if args.mode == "time" else memory_mode(args, root)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
