"""The reader's analysis views at scale: a run of 1,000 names x 1,000 steps.

    /usr/bin/python3 bench/bench_analysis.py [--names 1000] [--steps 1000] [--reps 3] [--json OUT]

Builds the run by hand in a temporary directory (under $TENSORTAP_BENCH_DIR,
else /dev/shm): a statistics table of names x steps rows over four kinds, and
every name's tensor (256 floats) every 10th step, as a sampled run has. Then times, each against the
NumPy floor measured in the same run:

- stats_frame() against reading the same table with NumPy (Run.stats_table);
- index_frame() against parsing the index (tensortap.open);
- `tensortap report` (the whole page) in seconds, against reading the table;
- a lazy (dask) mean over a series of large records against the eager
  NumPy series and mean of the same records.
"""

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import tensortap  # noqa: E402
from tensortap import STATS_FIELDS  # noqa: E402
from tensortap import __main__ as cli  # noqa: E402

KINDS = ("activation", "grad", "param", "activation_grad")


def make_run(root, names, steps):
    os.makedirs(root)
    series, sid = [], 0
    for kind in KINDS:
        for n in range(names // len(KINDS)):
            series.append({"series": sid, "kind": kind, "name": f"layer{n:04d}.{kind}"})
            sid += 1
    fields = [("step", "<i8"), ("series", "<i4")] + [(f, "<f8") for f in STATS_FIELDS[:5]] + \
             [(f, "<i8") for f in STATS_FIELDS[5:]]
    table = np.zeros(len(series) * steps, dtype=fields)
    table["step"] = np.repeat(np.arange(steps), len(series))
    table["series"] = np.tile(np.arange(len(series)), steps)
    rng = np.random.default_rng(0)
    for f in ("min", "max", "mean", "std", "norm"):
        table[f] = rng.lognormal(size=len(table))
    table["numel"] = 4096
    np.save(os.path.join(root, "stats.npy"), table)
    with open(os.path.join(root, "stats_series.jsonl"), "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in series)
    # Every name's tensor every 10th step: the index a sampled run of this
    # size has (100,000 lines for 1,000 names).
    lines = []
    for step in range(0, steps, 10):
        for s in series:
            rel = f"npy/{s['kind']}/{s['name']}/{step:08d}.npy"
            if step == 0:
                os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            np.save(os.path.join(root, rel), rng.standard_normal(256).astype(np.float32))
            lines.append({"step": step, "kind": s["kind"], "name": s["name"], "dtype": "float32", "shape": [256],
                          "file": rel})
    big = []
    for step in range(64):  # 4 MiB records for the lazy reduction
        rel = f"npy/activation/big/{step:08d}.npy"
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        np.save(os.path.join(root, rel), np.full((1024, 1024), step, np.float32))
        big.append({"step": step, "kind": "activation", "name": "big", "dtype": "float32", "shape": [1024, 1024],
                    "file": rel})
    with open(os.path.join(root, "index.jsonl"), "w") as f:
        # As the writer prints them (lines_file.cpp): no spaces.
        f.writelines(json.dumps(rec, separators=(",", ":")) + "\n" for rec in lines + big)
    with open(os.path.join(root, "run.json"), "w") as f:
        json.dump({"format_version": 1, "closed": True, "options": {"format": "npy", "stats_every": 1}}, f)
    return len(table), len(lines) + len(big)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--names", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    base = os.environ.get("TENSORTAP_BENCH_DIR", "/dev/shm" if os.path.isdir("/dev/shm") else None)
    tmp = tempfile.mkdtemp(prefix="tensortap-bench-analysis-", dir=base)
    try:
        root = os.path.join(tmp, "run")
        rows, records = make_run(root, args.names, args.steps)
        import pandas  # noqa: F401 - imported before timing, as a session would have it
        import dask.array  # noqa: F401
        import matplotlib  # noqa: F401

        t = {k: [] for k in ("open", "index_frame", "stats_table", "stats_frame", "report", "eager_mean",
                             "lazy_mean")}
        for _ in range(args.reps):
            dt, run = timed(lambda: tensortap.open(root))
            t["open"].append(dt)
            t["index_frame"].append(timed(run.index_frame)[0])
            t["stats_table"].append(timed(lambda: run.stats_table())[0])
            t["stats_frame"].append(timed(run.stats_frame)[0])
            with contextlib.redirect_stdout(io.StringIO()):
                dt, rc = timed(lambda: cli.main(["report", root, "-o", os.path.join(tmp, "report.html")]))
            assert rc == 0
            t["report"].append(dt)
            dt, eager = timed(lambda: run.series("big", kind="activation").mean(axis=(1, 2)))
            t["eager_mean"].append(dt)
            dt, lazy = timed(lambda: run.series("big", kind="activation", lazy=True).mean(axis=(1, 2)).compute())
            t["lazy_mean"].append(dt)
            assert np.array_equal(eager, lazy)
        med = {k: statistics.median(v) for k, v in t.items()}
        page = os.path.getsize(os.path.join(tmp, "report.html"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"names": args.names, "steps": args.steps, "stats_rows": rows, "records": records,
              "report_bytes": page, "median_s": med}
    print(f"## analysis views: {args.names} names x {args.steps} steps ({rows} statistics rows, {records} records), "
          f"median of {args.reps}")
    print()
    print("| what | time | against | ratio |")
    print("| --- | --- | --- | --- |")
    print(f"| stats_frame() | {med['stats_frame']:.2f} s | NumPy stats_table() {med['stats_table']:.2f} s | "
          f"{med['stats_frame'] / med['stats_table']:.1f}x |")
    print(f"| index_frame() | {med['index_frame']:.2f} s | tensortap.open() {med['open']:.2f} s | "
          f"{med['index_frame'] / med['open']:.1f}x |")
    print(f"| tensortap report (page {page / 1e6:.1f} MB) | {med['report']:.1f} s | NumPy stats_table() | "
          f"{med['report'] / med['stats_table']:.0f}x |")
    print(f"| lazy mean, 64 x 4 MiB records | {med['lazy_mean']:.2f} s | eager series + mean {med['eager_mean']:.2f} s | "
          f"{med['lazy_mean'] / med['eager_mean']:.2f}x |")
    target = med["report"] <= 30.0
    print(f"\ntarget: the page in seconds, not minutes (30 s or less): {'met' if target else 'MISSED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
