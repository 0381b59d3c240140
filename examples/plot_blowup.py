"""Shows how a run that blew up got there, from what the flight recorder dumped.

    PYTHONPATH=python python3 examples/plot_blowup.py runs/blowup runs/blowup/plots

Reads the statistics table (every step) and the full tensors of the dumped
steps (the last k before the first NaN or Inf, and that step), prints what
tripped the recorder, and writes blowup.png:
  left:  each parameter gradient's L2 norm over the whole run, from the
         statistics, with the dumped window shaded and the trigger marked;
  right: over the dumped steps only, from the full tensors: the largest
         |value| of each parameter and each activation.
"""

import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import tensortap  # noqa: E402


def main(path, out_dir):
    run = tensortap.open(path)
    if not run.dumps:
        sys.exit(f"{path}: the flight recorder never dumped: nothing blew up")
    dump = run.dumps[0]
    steps = dump["steps"]
    print(f"dump at step {dump['step']} ({dump['reason']}"
          + (f" first seen in {dump['kind']} '{dump['name']}'" if "name" in dump else "")
          + f"): steps {steps[0]}..{steps[-1]} written")

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5))
    for name in run.names("grad"):
        st = run.stats(name, kind="grad")
        ax.plot(st["step"], st["norm"], label=name, lw=1)
    ax.axvspan(steps[0], steps[-1], color="orange", alpha=0.2, label="dumped steps")
    ax.axvline(dump["step"], color="red", ls="--", lw=1, label=f"first {dump['reason']}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("gradient L2 norm (finite values)")
    ax.set_title("Statistics, every step")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, alpha=0.3)

    # The full tensors exist only for the dumped steps.
    for kind, style in (("param", "-"), ("activation", "--")):
        for name in run.names(kind):
            got = run.steps(name, kind=kind)
            peaks = [np.nanmax(np.abs(run.load(name, s, kind=kind).astype(np.float64)), initial=0) for s in got]
            bx.plot(got, peaks, style, marker=".", label=f"{kind} {name}")
    bx.axvline(dump["step"], color="red", ls="--", lw=1)
    bx.set_yscale("log")
    bx.set_xlabel("step")
    bx.set_ylabel("max |value|")
    bx.set_title(f"Full tensors of the {len(steps)} dumped steps")
    bx.legend(fontsize=7)
    bx.grid(True, alpha=0.3)
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "blowup.png")
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")

    # Where the NaN came from, step by step, from the statistics.
    for s in steps:
        bad = [(k, n) for k in run.kinds() for n in run.names(k)
               if k in ("grad", "activation", "activation_grad", "tensor")
               and _nonfinite(run, n, k, s)]
        print(f"  step {s}: " + (", ".join(f"{k} {n}" for k, n in bad) + " not finite" if bad else "all finite"))


def _nonfinite(run, name, kind, step):
    try:
        st = run.stats(name, kind=kind)
    except KeyError:
        return False
    i = np.flatnonzero(st["step"] == step)
    return bool(i.size) and (st["nan"][i[0]] + st["posinf"][i[0]] + st["neginf"][i[0]]) > 0


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else os.path.join(sys.argv[1], "plots"))
