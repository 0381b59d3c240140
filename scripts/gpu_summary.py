"""Ratios of the GPU benchmarks against the issue's targets, from the JSON
files scripts/gpu.sh writes: python3 scripts/gpu_summary.py RESULTS_DIR."""

import json
import os
import statistics
import sys
from collections import defaultdict


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [b for b in json.load(f)["benchmarks"] if not b.get("error_occurred")]


def seconds(b):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
    return b["real_time"] * scale


def size_name(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n // k} {unit}"
    return f"{n} B"


def main(results):
    engine = load(os.path.join(results, "bench_cuda_engine.json"))
    rate = defaultdict(dict)
    floor = {}
    for b in engine:
        name, size = b["name"].split("/")[:2]
        if "bytes_per_second" in b:
            rate[int(size)][name] = b["bytes_per_second"]
        elif name == "BM_RuntimeFloor":
            floor[int(size)] = seconds(b)
    if rate:
        print("D2H throughput: engine vs pinned cudaMemcpyAsync (target 0.95 from 1 MiB up)")
        print(f"{'size':>9} {'memcpy GB/s':>12} {'engine GB/s':>12} {'ratio':>6}")
        for size in sorted(rate):
            r = rate[size]
            if "BM_PinnedMemcpyD2H" in r and "BM_EngineD2H" in r:
                ratio = r["BM_EngineD2H"] / r["BM_PinnedMemcpyD2H"]
                mark = "" if size < (1 << 20) else ("  ok" if ratio >= 0.95 else "  BELOW TARGET")
                print(f"{size_name(size):>9} {r['BM_PinnedMemcpyD2H'] / 1e9:12.1f} {r['BM_EngineD2H'] / 1e9:12.1f}"
                      f" {ratio:6.2f}{mark}")
        print()
    if floor:
        print("The floor under a capture: a 4 KiB device-to-device cudaMemcpyAsync and a cudaEventRecord alone")
        labels = {0: "nothing else running", 1: "beside a busy copier thread",
                  2: "cudaStreamIsCapturing alone"}
        for busy, t in sorted(floor.items()):
            print(f"  {labels.get(busy, busy):>28}: {t * 1e6:6.1f} us")
        print()

    torch_side = load(os.path.join(results, "bench_cuda.json"))
    capture = [b for b in torch_side if b["name"].startswith("BM_CaptureCuda/")]
    naive = {b["name"].split("/")[1]: b for b in torch_side if b["name"].startswith("BM_CaptureCudaNaive/")}
    if capture:
        print("Training-thread cost per capture of a CUDA tensor (target <= 5 us and below half of t.cpu())")
        for b in capture:
            size = b["name"].split("/")[1]
            us = seconds(b) * 1e6
            cpu = seconds(naive[size]) * 1e6 if size in naive else None
            ok = us <= 5 and (cpu is None or us < cpu / 2)
            peer = f"   naive t.cpu(): {cpu:.1f} us" if cpu is not None else ""
            label = b.get("label", "")
            print(f"{size_name(int(size)):>9} {label:>12} {us:8.1f} us{'  ok' if ok else '  ABOVE TARGET'}{peer}")
        print()

    steps = defaultdict(list)
    captured = defaultdict(list)  # (model, mode) -> bytes per step
    for b in torch_side:
        if b["name"].startswith("BM_Train"):
            model, mode = b["name"].split("/")[:2]
            steps[(model, int(mode))].append(seconds(b) / 50)
            if "bytes_per_step" in b:
                captured[(model, int(mode))].append(b["bytes_per_step"])
    # The PCIe budget: the plain pinned cudaMemcpyAsync rate of the largest
    # size bench_cuda_engine measured, in the same session.
    budget = None
    for size in sorted(rate):
        if "BM_PinnedMemcpyD2H" in rate[size]:
            budget = rate[size]["BM_PinnedMemcpyD2H"]
    if steps:
        print("Step time, capture on vs off (median of rounds; the ratio of each mode's fastest round to the")
        print("  fastest round off beside it, as noise only adds time)")
        print("  targets: every 100 steps <= 1.01; every tensor every step <= 1.10; statistics of everything every step <= 1.03")
        if budget:
            print(f"  PCIe budget: {budget / 1e9:.1f} GB/s device to host (plain pinned cudaMemcpyAsync, largest size)")
        labels = ((1, "every 100", 1.01), (2, "every step", 1.10), (3, "stats every step", 1.03),
                  (4, "pageable peer", None))
        for model in sorted({m for m, _ in steps}):
            off = statistics.median(steps.get((model, 0), [float("nan")]))
            off_min = min(steps.get((model, 0), [float("nan")]))
            spread = steps.get((model, 0), [])
            print(f"{model:>20} off {off * 1e3:8.3f} ms  (rounds {', '.join(f'{t * 1e3:.3f}' for t in spread)})")
            for mode, label, target in labels:
                if (model, mode) not in steps:
                    continue
                t = statistics.median(steps[(model, mode)])
                best = min(steps[(model, mode)])
                line = f"{'':>20} {label:>16} {t * 1e3:8.3f} ms  ratio {t / off:6.3f} (of the fastest rounds {best / off_min:6.3f})"
                if target is not None:
                    line += "  ok" if t / off <= target else "  ABOVE TARGET"
                if captured.get((model, mode)):
                    per_step = statistics.median(captured[(model, mode)])
                    line += f"  captured {per_step / 1e6:8.3f} MB/step = {per_step / t / 1e9:6.2f} GB/s"
                    if budget:
                        line += f" ({per_step / t / budget:.0%} of the budget)"
                print(line)
            if (model, 2) in steps and (model, 4) in steps:
                mine = statistics.median(steps[(model, 2)])
                peer = statistics.median(steps[(model, 4)])
                print(f"{'':>20} pinned double buffering against the pageable peer: {peer / mine:.2f}x faster steps")
    paired = [b for b in torch_side if b["name"].startswith("BM_Paired")]
    if paired:
        print()
        print("Step time, paired: the model watched against its unwatched twin, alternating 10-step blocks")
        print("  (targets: every 100 steps <= 1.01, every tensor every step <= 1.10, statistics every step <= 1.03)")
        labels = {"1": "every 100", "2": "every step", "3": "stats every step"}
        for b in paired:
            model, mode = b["name"].split("/")[:2]
            ratio = b["ratio"]
            target = {"1": 1.01, "2": 1.10, "3": 1.03}.get(mode, 1.03)
            print(f"{model:>22} {labels.get(mode, mode):>16}  off {b['off_step'] * 1e3:7.3f} ms  on {b['on_step'] * 1e3:7.3f} ms"
                  f"  ratio {ratio:6.3f}{'  ok' if ratio <= target else '  ABOVE TARGET'}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
