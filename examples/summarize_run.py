"""Prints what a tensortap run captured, read back with NumPy.

    PYTHONPATH=python python3 examples/summarize_run.py runs/demo
"""

import sys

import numpy as np

import tensortap


def main(path):
    run = tensortap.open(path)
    print(f"run {path}: {len(run.records)} records, closed cleanly: {run.closed}, "
          f"dropped: {run.info.get('dropped', 0)}")
    for kind in run.kinds():
        names = run.names(kind)
        steps = run.steps(names[0], kind=kind)
        print(f"  {kind:16s} {len(names):2d} names, steps {steps[0]}..{steps[-1]} ({len(steps)} captured)")

    if "loss" in run.names("tensor"):
        loss = run.series("loss", kind="tensor")
        steps = run.steps("loss", kind="tensor")
        print(f"loss: step {steps[0]} {float(loss[0]):.4f} -> step {steps[-1]} {float(loss[-1]):.4f}")

    print("gradient L2 norm, first and last captured step:")
    for name in run.names("grad"):
        g = run.series(name, kind="grad")
        norms = np.sqrt((g.reshape(len(g), -1).astype(np.float64) ** 2).sum(axis=1))
        print(f"  {name:12s} {str(g.shape[1:]):12s} {norms[0]:9.4f} -> {norms[-1]:9.4f}")

    print("ReLU activations (Taps): fraction of units dead over the batch, first -> last:")
    for name in run.names("activation"):
        a = run.series(name, kind="activation")  # [steps, batch, units]
        dead = (a <= 0).all(axis=1).mean(axis=1)
        print(f"  {name:12s} {str(a.shape[1:]):12s} {dead[0]:.3f} -> {dead[-1]:.3f}, "
              f"mean activation {a[0].mean():.4f} -> {a[-1].mean():.4f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/demo")
