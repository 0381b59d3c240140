"""Draws bench_scale's CSV: step time against bytes and tensors per step.

    /usr/bin/python3 bench/plot_scale.py SCALE_CSV OUT_PNG

Next to the measured step time with every step captured, it draws the
limits measured in the same run: the step's compute alone (off), compute
plus memcpy of the step's bytes (what the training thread cannot avoid), and
raw write() of the same bytes to the same directory, as a file per tensor
(.npy's layout) and as one file (the packed format's): once that is longer
than a step, the writer thread runs behind and the step cannot be shorter.
One step-time line per format. A knee is where a write() line crosses the
memcpy line.
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


STYLE = {"npy": "C3", "packed": "C4", "hdf5": "C5"}


def panel(ax, rows, xkey, xlabel, title):
    formats = sorted({r.get("format", "npy") for r in rows}, key=lambda f: list(STYLE).index(f) if f in STYLE else 9)
    knees = []
    for i, fmt in enumerate(formats):
        rs = [r for r in rows if r.get("format", "npy") == fmt]
        xs = [int(r[xkey]) for r in rs]
        if xkey == "bytes_per_step":
            xs = [x / 2**20 for x in xs]
        col = {k: [float(r[k]) for r in rs] for k in ("off_ms", "on_ms", "memcpy_ms", "write_ms")}
        color = STYLE.get(fmt, "C%d" % (6 + i))
        ax.plot(xs, col["on_ms"], "o-", color=color, lw=2, label="%s: step time, every step captured" % fmt)
        if i == 0:
            copy_limit = [o + c for o, c in zip(col["off_ms"], col["memcpy_ms"])]
            ax.plot(xs, col["off_ms"], "-", color="0.5", label="off: compute only")
            ax.plot(xs, copy_limit, ":", color="C0", lw=2, label="memcpy limit: compute + memcpy of the bytes")
        if fmt in ("npy", "packed"):
            ax.plot(xs, col["write_ms"], ":", color=color, lw=1.5,
                    label="raw write() of the same bytes, %s" % ("a file per tensor" if fmt == "npy" else "one file"))
        copy_limit = [o + c for o, c in zip(col["off_ms"], col["memcpy_ms"])]
        knee = next((x for x, w, c in zip(xs, col["write_ms"], copy_limit) if w > c), None)
        if knee is not None and fmt in ("npy", "packed"):
            knees.append((knee, fmt, color, min(col["off_ms"])))
    for knee, fmt, color, y in knees:
        ax.axvline(knee, color=color, alpha=0.2, lw=6)
        ax.annotate("%s knee: write() > step" % fmt, (knee, y), xytext=(5, 5), textcoords="offset points",
                    color=color, fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms per step")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    by_bytes = [r for r in rows if r["sweep"] == "bytes"]
    by_tensors = [r for r in rows if r["sweep"] == "tensors"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    panel(axes[0], by_bytes, "bytes_per_step", "MiB captured per step (in 10 tensors)",
          "Step time against bytes per step")
    per_tensor = int(by_tensors[0]["bytes_per_step"]) // int(by_tensors[0]["tensors_per_step"]) if by_tensors else 0
    panel(axes[1], by_tensors, "tensors_per_step", "tensors captured per step (%d bytes each)" % per_tensor,
          "Step time against tensors per step")
    fig.suptitle("tensortap, every step captured, /dev/shm (bench/bench_scale.cpp)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
