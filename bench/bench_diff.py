"""`tensortap diff` against reading both runs (issue 45, "Scale").

    /usr/bin/python3 bench/bench_diff.py [--mib 1024] [--records 256] [--reps 3] [--json OUT]

Writes two runs of `mib` MiB each (under $TENSORTAP_BENCH_DIR, else
/dev/shm): `records` float32 records of equal size, as the Python twin's
writer writes them (the C++ writers' .npy layout), B equal to A but for one
element in each of a tenth of its records (one ULP). Then, warm cache (each
measured once before its timed repetitions), in alternating repetitions:

- read: every record of both runs read into NumPy with Run.load (a copy,
  `np.array(run.load(...))`: the bytes are touched, not just mapped);
- diff: `tensortap.diff(a, b)` (exact), which compares every pair.

The target: diff at most 2x read (the ratio of the medians). Also printed:
the diff's peak memory growth (ru_maxrss) against one record's size, which
bounded memory keeps near a few records.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import tensortap  # noqa: E402
from tensortap._writer import RunWriter, default_options  # noqa: E402


def make_runs(root, mib, records):
    n = mib * (1 << 20) // 4 // records
    rng = np.random.default_rng(1)
    a_dir, b_dir = os.path.join(root, "a"), os.path.join(root, "b")
    wa = RunWriter(a_dir, default_options(1, ["activation"]), overwrite=True)
    wb = RunWriter(b_dir, default_options(1, ["activation"]), overwrite=True)
    for i in range(records):
        x = rng.standard_normal(n, dtype=np.float32)
        name, step = f"layer{i % 16}", i // 16
        wa.write("activation", name, step, x, "float32")
        if i % 10 == 0:
            x[i % n] = np.nextafter(x[i % n], np.float32(np.inf))
        wb.write("activation", name, step, x, "float32")
    wa.close()
    wb.close()
    return a_dir, b_dir, n * 4


def read_both(a_dir, b_dir):
    total = 0
    for path in (a_dir, b_dir):
        run = tensortap.open(path)
        for rec in run.records:
            total += np.array(run.load(rec["name"], rec["step"], kind=rec["kind"])).nbytes
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1024, help="each run's size (default 1024)")
    p.add_argument("--records", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    base = os.environ.get("TENSORTAP_BENCH_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    root = tempfile.mkdtemp(prefix="tensortap-bench-diff-", dir=base)
    try:
        a_dir, b_dir, record_bytes = make_runs(root, args.mib, args.records)
        read_both(a_dir, b_dir)  # warm
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        df = tensortap.diff(a_dir, b_dir)
        growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        differ = int((df.status == "differ").sum())
        assert differ == (args.records + 9) // 10 and (df[df.status == "differ"].n_bad == 1).all(), differ
        reads, diffs = [], []
        for _ in range(args.reps):
            t = time.perf_counter()
            read_both(a_dir, b_dir)
            reads.append(time.perf_counter() - t)
            t = time.perf_counter()
            tensortap.diff(a_dir, b_dir)
            diffs.append(time.perf_counter() - t)
        read, dif = statistics.median(reads), statistics.median(diffs)
        ratio = dif / read
        print(f"| two runs of {args.mib} MiB ({args.records} float32 records, {differ} differing) | read both "
              f"{read:.2f} s | diff {dif:.2f} s | **{ratio:.2f}x** (target <= 2x: {'met' if ratio <= 2 else 'MISSED'}) |")
        print(f"diff's peak memory growth: {growth / 2**20:.0f} MiB (one record: {record_bytes / 2**20:.0f} MiB; "
              f"the first call, after the reads' own peak)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"mib": args.mib, "records": args.records, "read_s": reads, "diff_s": diffs,
                           "ratio": ratio, "peak_growth_bytes": growth, "record_bytes": record_bytes}, f, indent=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
