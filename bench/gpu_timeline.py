"""What the GPU did while tensortap captured, from the traces `bench_cuda
--profile DIR` saves (PyTorch's profiler, Chrome's trace format).

    python3 bench/gpu_timeline.py DIR [PICTURE.png]

step_trace.json (three MLP steps, everything captured every step): the
streams the kernels and the copies ran on, whether every device-to-host copy
ran on a stream of its own (not the training's), into pinned memory, and how
much of the copies' time overlapped the training's kernels. Exits 1 when a
device-to-host copy ran on a stream that also ran the training's kernels, or
when there was none.

stats_trace.json (20 captures of one tensor for statistics only): the
kernels a statistics vector takes, per capture.

capture_trace.json (200 captures of a 4 KiB tensor, one a step): the CUDA
runtime calls of each thread, how many per capture and how long they took.

With PICTURE, draws the step trace's timeline, a row per stream.
"""

import json
import os
import sys
from collections import Counter, defaultdict

STATS_CAPTURES = 20  # bench_cuda.cpp's profile(): captures in stats_trace.json
CAPTURES = 200  # and in capture_trace.json


def device_events(path):
    """(category, name, stream, start us, end us, bytes) of each GPU event."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    out = []
    for e in events:
        cat = e.get("cat", "")
        if e.get("ph") != "X" or cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        args = e.get("args", {})
        stream = args.get("stream", e.get("tid"))
        start = float(e["ts"])
        out.append((cat, e.get("name", ""), stream, start, start + float(e.get("dur", 0)), args.get("bytes", 0)))
    return out


def union(intervals):
    merged = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def overlap(a, b, merged):
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in merged if y > a and x < b)


def kind(cat, name):
    if cat == "kernel":
        return "kernel"
    if cat == "gpu_memset":
        return "memset"
    for k in ("DtoH", "HtoD", "DtoD"):
        if k in name:
            return k
    return "memcpy"


def analyse_step(path):
    events = device_events(path)
    per_stream = defaultdict(Counter)
    busy = defaultdict(float)
    for cat, name, stream, a, b, _ in events:
        per_stream[stream][kind(cat, name)] += 1
        busy[(stream, kind(cat, name))] += b - a
    print(f"step trace: {len(events)} device events")
    for stream in sorted(per_stream, key=str):
        parts = ", ".join(f"{n} {k} ({busy[(stream, k)] / 1e3:.3f} ms)" for k, n in sorted(per_stream[stream].items()))
        print(f"  stream {stream}: {parts}")
    d2h = [e for e in events if kind(e[0], e[1]) == "DtoH"]
    if not d2h:
        print("FAIL: no device-to-host copy in the trace")
        return 1
    copy_streams = {e[2] for e in d2h}
    kernel_streams = {s for s in per_stream if per_stream[s]["kernel"] > 0}
    shared = copy_streams & kernel_streams
    pinned = sum(1 for e in d2h if "Pinned" in e[1])
    print(f"device-to-host copies: {len(d2h)}, {sum(e[5] for e in d2h) / 1e6:.1f} MB, on stream(s) "
          f"{sorted(copy_streams, key=str)}; {pinned} of them into pinned memory")
    print(f"the training's kernels ran on stream(s) {sorted(kernel_streams, key=str)}")
    kernels = union([(a, b) for cat, _, s, a, b, _ in events if cat == "kernel"])
    copy_time = sum(b - a for _, _, _, a, b, _ in d2h)
    both = sum(overlap(a, b, kernels) for _, _, _, a, b, _ in d2h)
    print(f"copy time {copy_time / 1e3:.3f} ms, of which {both / 1e3:.3f} ms ({both / copy_time:.0%}) "
          "overlapped kernels of the training")
    if shared:
        print(f"FAIL: device-to-host copies ran on stream(s) {sorted(shared, key=str)}, which ran the training's kernels")
        return 1
    print("ok: every device-to-host copy ran on a stream of its own")
    return 0


def analyse_stats(path):
    events = device_events(path)
    kernels = [e for e in events if e[0] == "kernel"]
    names = Counter(e[1].split("<")[0].split("(")[0][:60] for e in kernels)
    print(f"stats trace: {len(kernels)} kernels for {STATS_CAPTURES} statistics captures: "
          f"{len(kernels) / STATS_CAPTURES:.1f} kernels per tensor")
    for name, n in names.most_common():
        print(f"  {n / STATS_CAPTURES:5.1f} per tensor  {name}")
    others = Counter(kind(e[0], e[1]) for e in events if e[0] != "kernel")
    for k, n in sorted(others.items()):
        print(f"  {n / STATS_CAPTURES:5.1f} per tensor  {k}")


def analyse_captures(path):
    if not os.path.exists(path):
        return
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    calls = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            calls[(e.get("tid"), e.get("name", ""))].append(float(e.get("dur", 0)))
    print(f"capture trace: CUDA runtime calls during {CAPTURES} captures of a 4 KiB tensor")
    print(f"  {'thread':>12} {'call':<28} {'per capture':>11} {'mean us':>8} {'max us':>8} {'us per capture':>14}")
    for (tid, name), d in sorted(calls.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {str(tid):>12} {name:<28} {len(d) / CAPTURES:11.2f} {sum(d) / len(d):8.1f} {max(d):8.1f}"
              f" {sum(d) / CAPTURES:14.2f}")


def draw(path, picture):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = device_events(path)
    t0 = min(e[3] for e in events)
    streams = sorted({e[2] for e in events}, key=str)
    colours = {"kernel": "tab:blue", "DtoH": "tab:orange", "DtoD": "tab:green", "HtoD": "tab:purple",
               "memset": "tab:gray", "memcpy": "tab:red"}
    fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(streams)))
    for row, stream in enumerate(streams):
        for k, colour in colours.items():
            bars = [((a - t0) / 1e3, max((b - a) / 1e3, 1e-4)) for cat, name, s, a, b, _ in events
                    if s == stream and kind(cat, name) == k]
            if bars:
                ax.broken_barh(bars, (row - 0.35, 0.7), color=colour, label=k)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper right", ncol=len(unique), fontsize=8)
    ax.set_yticks(range(len(streams)))
    ax.set_yticklabels([f"stream {s}" for s in streams])
    ax.set_xlabel("ms")
    ax.set_title("Three MLP steps, every activation and gradient captured: the GPU's streams")
    fig.tight_layout()
    fig.savefig(picture, dpi=110)
    print(f"timeline: {picture}")


def main(argv):
    if len(argv) not in (2, 3):
        sys.exit(__doc__)
    rc = analyse_step(os.path.join(argv[1], "step_trace.json"))
    analyse_stats(os.path.join(argv[1], "stats_trace.json"))
    analyse_captures(os.path.join(argv[1], "capture_trace.json"))
    if len(argv) == 3:
        draw(os.path.join(argv[1], "step_trace.json"), argv[2])
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
