"""The Python reader at scale: a run of a million index lines (issue 19, section 4).

    /usr/bin/python3 bench/bench_reader_scale.py [--names 1000] [--steps 1000] [--reps 3]
                                                 [--reader DIR] [--json OUT]

Builds, by hand, in a temporary directory (under $TENSORTAP_BENCH_DIR, else
/dev/shm), runs of `names` (four kinds) x `steps`, one record per name and step,
a tensor of 16 float32:

- packed: Format::Packed exactly as writers/src/packed/writer.cpp writes it:
  each record a complete .npy image (NumPy writes the same bytes as the C++
  writer) at a 64-byte-aligned offset of packed/00000000.npys, the records of
  a step in one stretch, and index lines as writers/src/lines_file.cpp formats
  them, with "offset" and "nbytes";
- npy: the same index in the Format::Npy layout (npy/<kind>/<name>/<step>.npy),
  with the files of one name only: opening a run reads no tensor file;
- small: the packed run's names at one step (names index lines), for memory.

Then measures, each against a floor taken in the same run:

- tensortap.open() of the million lines against json.loads of the same lines;
- the memory opening takes (peak RSS of a fresh process after open, less
  before), for the million lines and for the small run of the same names;
- series() over every step of one name, packed, against np.load of the same
  records at their offsets (f.seek(offset); np.load(f)), and .npy, against
  np.load of the same files; both stacked.

--reader DIR times the reader package found in DIR (e.g. another worktree's
python/), so that a before and an after come from the same script.
"""

import argparse
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
KINDS = ("activation", "grad", "param", "activation_grad")
SHAPE = (16,)
ALIGN = 64  # packed/writer.cpp: records start at multiples of 64 bytes


def names_of(n):
    return [(kind, f"layer{i:04d}.{kind}") for kind in KINDS for i in range(n // len(KINDS))]


def value(step, i):
    return np.full(SHAPE, step * 10000 + i, np.float32)


def image(a):
    """The .npy image of `a`, as the C++ writer writes it (checked equal byte
    for byte on the e2e runs): header padded to 64 bytes, then the data."""
    b = io.BytesIO()
    np.save(b, a, allow_pickle=False)
    return b.getvalue()


def index_line(step, kind, name, location):
    # lines_file.cpp append_index_line: no spaces, this member order.
    return (f'{{"step":{step},"kind":"{kind}","name":"{name}","dtype":"float32",'
            f'"shape":[{",".join(map(str, SHAPE))}],{location}}}\n').encode()


def run_json(path, fmt, records):
    info = {"format_version": 1, "tensortap_version": "0.2.0", "torch_version": "bench",
            "options": {"dir": path, "format": fmt, "every": 1, "packed": {"segment_bytes": 1 << 30}},
            "rank": 0, "world_size": 1, "start_time": "bench", "dumps": [], "records": records,
            "bytes": records * 4 * int(np.prod(SHAPE)), "dropped": 0, "errors": 0, "closed": True}
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump(info, f, indent=2)


def make_packed(root, names, steps):
    """Format::Packed: one segment (1 GiB default segment_bytes holds it all:
    192 bytes a record), appended step by step as the writer does."""
    os.makedirs(os.path.join(root, "packed"))
    seg_rel = "packed/00000000.npys"
    header = image(value(0, 0))[:-4 * int(np.prod(SHAPE))]
    size = -(-(len(header) + 4 * int(np.prod(SHAPE))) // ALIGN) * ALIGN
    data = np.arange(len(names), dtype=np.float32)
    offset = 0
    with open(os.path.join(root, seg_rel), "wb") as seg, open(os.path.join(root, "index.jsonl"), "wb") as index:
        for step in range(steps):
            block = bytearray(size * len(names))
            lines = []
            for i, (kind, name) in enumerate(names):
                at = i * size
                vals = np.full(SHAPE, step * 10000, np.float32) + data[i]
                block[at:at + len(header)] = header
                block[at + len(header):at + len(header) + vals.nbytes] = vals.tobytes()
                lines.append(index_line(step, kind, name, f'"file":"{seg_rel}","offset":{offset + at},'
                                                           f'"nbytes":{len(header) + vals.nbytes}'))
            seg.write(block)
            index.write(b"".join(lines))
            offset += len(block)
    run_json(root, "packed", len(names) * steps)
    return seg_rel


def make_npy(root, names, steps, with_files):
    os.makedirs(root)
    with open(os.path.join(root, "index.jsonl"), "wb") as index:
        for step in range(steps):
            index.write(b"".join(index_line(step, kind, name, f'"file":"npy/{kind}/{name}/{step:08d}.npy"')
                                 for kind, name in names))
    for kind, name in with_files:
        d = os.path.join(root, "npy", kind, name)
        os.makedirs(d)
        i = names.index((kind, name))
        for step in range(steps):
            np.save(os.path.join(d, f"{step:08d}.npy"), value(step, i))
    run_json(root, "npy", len(names) * steps)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def child_open(reader, path):
    """In a fresh process: RSS before and after tensortap.open(path) (peak and
    current), and the records it holds."""
    # VmHWM, the peak of this process's own memory: getrusage's ru_maxrss
    # would report the parent's peak, which a child inherits.
    code = (
        "import json, sys, time\n"
        f"sys.path.insert(0, {reader!r})\n"
        "import numpy, tensortap\n"
        "def status(key):\n"
        "    with open('/proc/self/status') as f:\n"
        "        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ':'))\n"
        "base = status('VmRSS')\n"
        "t = time.perf_counter()\n"
        f"run = tensortap.open({path!r})\n"
        "dt = time.perf_counter() - t\n"
        "print(json.dumps({'peak': status('VmHWM') - base, 'kept': status('VmRSS') - base,\n"
        "                  'records': len(run.records), 'open_s': dt}))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--names", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--reader", default=os.path.join(HERE, "..", "python"),
                    help="the directory holding the tensortap package to measure")
    ap.add_argument("--json")
    args = ap.parse_args()
    reader = os.path.abspath(args.reader)
    sys.path.insert(0, reader)
    import tensortap
    import pandas  # noqa: F401 - imported before timing index_frame(), as a session would have it

    names = names_of(args.names)
    target_kind, target = names[len(names) // 2]
    base = os.environ.get("TENSORTAP_BENCH_DIR", "/dev/shm" if os.path.isdir("/dev/shm") else None)
    tmp = tempfile.mkdtemp(prefix="tensortap-bench-reader-", dir=base)
    try:
        packed, npy, small = (os.path.join(tmp, d) for d in ("packed", "npy", "small"))
        t0 = time.perf_counter()
        seg_rel = make_packed(packed, names, args.steps)
        make_npy(npy, names, args.steps, [(target_kind, target)])
        make_packed(small, names, 1)
        built = time.perf_counter() - t0
        lines = sum(1 for _ in open(os.path.join(packed, "index.jsonl"), "rb"))
        index_mb = os.path.getsize(os.path.join(packed, "index.jsonl")) / 1e6
        seg_mb = os.path.getsize(os.path.join(packed, seg_rel)) / 1e6
        # The records of the target name, from the index, for the NumPy floors.
        offsets = [json.loads(b)["offset"] for b in open(os.path.join(packed, "index.jsonl"), "rb")
                   if b"\"name\":\"%s\"" % target.encode() in b]
        files = [os.path.join(npy, "npy", target_kind, target, f"{s:08d}.npy") for s in range(args.steps)]
        want = np.stack([value(s, names.index((target_kind, target))) for s in range(args.steps)])

        def json_floor(path):
            with open(path, "rb") as f:
                return [json.loads(b) for b in f]

        def np_load_packed():
            with open(os.path.join(packed, seg_rel), "rb") as f:
                out = []
                for off in offsets:
                    f.seek(off)
                    out.append(np.load(f, allow_pickle=False))
            return np.stack(out)

        def np_load_npy():
            return np.stack([np.load(p, allow_pickle=False) for p in files])

        t = {k: [] for k in ("json_packed", "open_packed", "open_npy", "index_frame", "series_packed",
                             "np_load_packed", "series_npy", "np_load_npy")}
        for _ in range(args.reps):
            t["json_packed"].append(timed(lambda: json_floor(os.path.join(packed, "index.jsonl")))[0])
            for layout, path, np_floor in (("packed", packed, np_load_packed), ("npy", npy, np_load_npy)):
                dt, run = timed(lambda: tensortap.open(path))
                t[f"open_{layout}"].append(dt)
                assert len(run.records) == lines
                if layout == "packed":
                    t["index_frame"].append(timed(run.index_frame)[0])
                # series() against NumPy's own loads of the same records.
                for key, read in ((f"series_{layout}", lambda: run.series(target, kind=target_kind)),
                                  (f"np_load_{layout}", np_floor)):
                    dt, s = timed(read)
                    t[key].append(dt)
                    np.testing.assert_array_equal(s, want)
                del run
        med = {k: statistics.median(v) for k, v in t.items()}
        mem_big = child_open(reader, packed)
        mem_npy = child_open(reader, npy)
        mem_small = child_open(reader, small)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    mib = 1 << 20
    print(f"## the reader at scale: {len(names)} names x {args.steps} steps = {lines} index lines "
          f"({index_mb:.0f} MB of index, a {seg_mb:.0f} MB segment; built in {built:.0f} s), median of {args.reps}, "
          f"reader {reader}")
    print()
    print("| what | time | against, in the same run | ratio |")
    print("| --- | --- | --- | --- |")
    print(f"| `tensortap.open()`, packed, {lines} lines | {med['open_packed']:.2f} s | `json.loads` of each line "
          f"{med['json_packed']:.2f} s | {med['open_packed'] / med['json_packed']:.2f}x |")
    print(f"| `tensortap.open()`, .npy layout, {lines} lines | {med['open_npy']:.2f} s | `json.loads` of each line "
          f"| {med['open_npy'] / med['json_packed']:.2f}x |")
    print(f"| `index_frame()`, packed | {med['index_frame']:.2f} s | `tensortap.open()` | "
          f"{med['index_frame'] / med['open_packed']:.2f}x |")
    print(f"| `series()`, packed, {args.steps} steps | {med['series_packed'] * 1e3:.1f} ms | `f.seek(offset); "
          f"np.load(f)` of each record, stacked {med['np_load_packed'] * 1e3:.1f} ms | "
          f"{med['series_packed'] / med['np_load_packed']:.2f}x |")
    print(f"| `series()`, .npy, {args.steps} steps | {med['series_npy'] * 1e3:.1f} ms | `np.load` of each file, "
          f"stacked {med['np_load_npy'] * 1e3:.1f} ms | {med['series_npy'] / med['np_load_npy']:.2f}x |")
    print()
    print("| memory of `tensortap.open()` (fresh process) | records | peak RSS added | RSS kept | per record kept |")
    print("| --- | --- | --- | --- | --- |")
    for label, m in ((f"packed, {lines} lines", mem_big), (f".npy layout, {lines} lines", mem_npy),
                     (f"packed, the same names, {len(names)} lines", mem_small)):
        print(f"| {label} | {m['records']} | {m['peak'] / mib:.1f} MiB | {m['kept'] / mib:.1f} MiB | "
              f"{m['kept'] / max(1, m['records']):.0f} B |")
    ok_time = med["open_packed"] < 5.0 and med["open_npy"] < 5.0
    print(f"\ntarget: a million index lines open in under 5 s: {'met' if ok_time else 'MISSED'} "
          f"({med['open_packed']:.2f} s packed, {med['open_npy']:.2f} s .npy)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"names": len(names), "steps": args.steps, "lines": lines, "reader": reader,
                       "median_s": med, "memory": {"packed": mem_big, "npy": mem_npy, "small": mem_small}},
                      f, indent=1)


if __name__ == "__main__":
    main()
