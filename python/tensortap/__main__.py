"""python3 -m tensortap: summarize a run, or check it.

    python3 -m tensortap inspect RUN_DIR [--check]

The summary lists kinds, names, the steps captured, shapes, dtypes, bytes,
dropped records and whether the run was closed cleanly. --check also opens
every file the index names and compares its shape and dtype with the index;
the exit status is 1 if any does not match or cannot be read.
"""

import argparse
import os
import sys

import numpy as np

from . import NUMPY_DTYPES, Run, RunError


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _nbytes(rec):
    return int(np.prod(rec["shape"], dtype=np.int64)) * np.dtype(NUMPY_DTYPES.get(rec["dtype"], "uint8")).itemsize


def summarize(run, out=None):
    out = out if out is not None else sys.stdout
    info = run.info
    opts = info.get("options", {})
    print(f"run {run.path}", file=out)
    print(f"  tensortap {info.get('tensortap_version', '?')}, torch {info.get('torch_version', '?')}, "
          f"format {opts.get('format', '?')}, started {info.get('start_time', '?')}", file=out)
    if run.ranks:
        print(f"  ranks {run.ranks} (world size {info.get('world_size', '?')})", file=out)
    for rank, i in sorted(run.infos.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        where = "" if rank is None else f"rank {rank}: "
        if i.get("closed"):
            print(f"  {where}closed cleanly: {i.get('records', 0)} records, {i.get('bytes', 0)} bytes, "
                  f"{i.get('dropped', 0)} dropped, {i.get('errors', 0)} errors", file=out)
        else:
            print(f"  {where}NOT closed (crashed, killed, or still running)", file=out)
    rows = []
    for kind in run.kinds():
        for name in run.names(kind):
            recs = [r for r in run.records if r["kind"] == kind and r["name"] == name]
            steps = sorted({r["step"] for r in recs})
            shapes = sorted({tuple(r["shape"]) for r in recs})
            dtypes = sorted({r["dtype"] for r in recs})
            shape = str(shapes[0]) if len(shapes) == 1 else f"{len(shapes)} shapes"
            rows.append((kind, name, str(len(steps)), f"{steps[0]}..{steps[-1]}", shape, ",".join(dtypes),
                         _human(sum(_nbytes(r) for r in recs))))
    header = ("kind", "name", "steps", "first..last", "shape", "dtype", "bytes")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    for row in [header] + rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)
    total = sum(_nbytes(r) for r in run.records)
    print(f"  total: {len(run.records)} records, {_human(total)}", file=out)
    for r in [None] if not run.ranks else run.ranks:
        try:
            table, series = run.stats_table(rank=r)
        except RunError:
            continue
        where = "" if r is None else f"rank {r}: "
        bad = table[(table["nan"] + table["posinf"] + table["neginf"]) > 0]
        first = f", first non-finite at step {bad['step'].min()}" if len(bad) else ", all finite"
        print(f"  {where}statistics: {len(table)} rows of {len(series)} tensors{first}", file=out)
    for d in run.dumps:
        where = "" if d.get("rank") is None else f"rank {d['rank']}: "
        cause = f" in {d['kind']} {d['name']}" if "name" in d else ""
        print(f"  {where}flight recorder dump at step {d['step']} ({d['reason']}{cause}): "
              f"steps {d['steps'][0]}..{d['steps'][-1]}", file=out)


def check(run, out=None):
    """Opens every indexed file; returns the number of problems."""
    out = out if out is not None else sys.stdout
    problems = 0
    for rec in run.records:
        where = f"{rec['kind']} {rec['name']!r} step {rec['step']}" + (f" rank {rec['rank']}" if "rank" in rec else "")
        try:
            a = run.load(rec["name"], rec["step"], rec["kind"], rank=rec.get("rank"), mmap=False)
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            print(f"  BAD {where}: cannot read {rec['file']}: {e}", file=out)
            problems += 1
            continue
        want_dtype = np.dtype(NUMPY_DTYPES.get(rec["dtype"], rec["dtype"]))
        if list(a.shape) != rec["shape"] or a.dtype != want_dtype:
            print(f"  BAD {where}: {rec['file']} holds {a.dtype}{list(a.shape)}, "
                  f"the index says {rec['dtype']}{rec['shape']}", file=out)
            problems += 1
    leftovers = [os.path.join(d, f) for d, _, fs in os.walk(run.path) for f in fs if f.endswith(".tmp")]
    for f in leftovers:
        print(f"  note: unfinished temporary file {f} (a crash mid-write; not indexed)", file=out)
    print(f"  check: {len(run.records)} records, {problems} problems", file=out)
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m tensortap", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="summarize a run directory")
    p.add_argument("run", help="the run directory")
    p.add_argument("--check", action="store_true", help="read every indexed file and verify shape and dtype")
    args = parser.parse_args(argv)
    try:
        run = Run(args.run)
    except (RunError, OSError, ValueError) as e:
        print(f"tensortap: {e}", file=sys.stderr)
        return 2
    with run:
        summarize(run)
        if args.check and check(run):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
