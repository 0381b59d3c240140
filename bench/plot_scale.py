"""Draws bench_scale's CSV: step time against bytes and tensors per step.

    /usr/bin/python3 bench/plot_scale.py SCALE_CSV OUT_PNG

Next to the measured step time with every step captured, it draws the
limits measured in the same run: the step's compute alone (off), compute
plus memcpy of the step's bytes (what the training thread cannot avoid), and
raw write() of the same files to the same directory (once that is longer
than a step, the writer thread runs behind and the step cannot be shorter).
The knee is where the write() line crosses the memcpy line.
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def panel(ax, rows, xkey, xlabel, title):
    xs = [int(r[xkey]) for r in rows]
    if xkey == "bytes_per_step":
        xs = [x / 2**20 for x in xs]
    col = {k: [float(r[k]) for r in rows] for k in ("off_ms", "on_ms", "capture_ms", "memcpy_ms", "write_ms")}
    copy_limit = [o + c for o, c in zip(col["off_ms"], col["memcpy_ms"])]
    ax.plot(xs, col["on_ms"], "o-", color="C3", lw=2, label="tensortap on: step time")
    ax.plot(xs, col["capture_ms"], "s--", color="C1", label="of which inside capture()")
    ax.plot(xs, col["off_ms"], "-", color="0.5", label="off: compute only")
    ax.plot(xs, copy_limit, ":", color="C0", lw=2, label="memcpy limit: compute + memcpy of the bytes")
    ax.plot(xs, col["write_ms"], ":", color="C2", lw=2, label="disk limit: raw write() of the same files")
    knee = next((x for x, w, c in zip(xs, col["write_ms"], copy_limit) if w > c), None)
    if knee is not None:
        ax.axvline(knee, color="C2", alpha=0.3, lw=6)
        ax.annotate("knee: write() > step", (knee, min(col["off_ms"])), xytext=(5, 5), textcoords="offset points",
                    color="C2", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms per step")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    by_bytes = [r for r in rows if r["sweep"] == "bytes"]
    by_tensors = [r for r in rows if r["sweep"] == "tensors"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    panel(axes[0], by_bytes, "bytes_per_step", "MiB captured per step (in 10 tensors)",
          "Step time against bytes per step")
    n_bytes = int(by_tensors[0]["bytes_per_step"]) // 2**20 if by_tensors else 0
    panel(axes[1], by_tensors, "tensors_per_step", "tensors captured per step (%d MiB in all)" % n_bytes,
          "Step time against tensors per step")
    fig.suptitle("tensortap, every step captured, /dev/shm (bench/bench_scale.cpp)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
