"""Plots what a tensortap run captured, as PNG files.

    PYTHONPATH=python python3 examples/plot_run.py runs/demo runs/demo/plots

Writes:
  grad_norms.png              each parameter's gradient L2 norm over steps
  activation_histograms.png   each Tap's activation histogram, first vs last captured step
  dead_relu.png               the fraction of ReLU units dead over a whole batch, over steps
"""

import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import tensortap  # noqa: E402


def grad_norms(run, out):
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in run.names("grad"):
        g = run.series(name, kind="grad").astype(np.float64)
        norms = np.sqrt((g.reshape(len(g), -1) ** 2).sum(axis=1))
        ax.plot(run.steps(name, kind="grad"), norms, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("gradient L2 norm")
    ax.set_title("Gradient norm per parameter")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def activation_histograms(run, out):
    names = run.names("activation")
    fig, axes = plt.subplots(1, max(len(names), 1), figsize=(4.5 * max(len(names), 1), 3.5), squeeze=False)
    for ax, name in zip(axes[0], names):
        steps = run.steps(name, kind="activation")
        first = np.asarray(run.load(name, steps[0], kind="activation"), dtype=np.float64).ravel()
        last = np.asarray(run.load(name, steps[-1], kind="activation"), dtype=np.float64).ravel()
        bins = np.linspace(min(first.min(), last.min()), max(first.max(), last.max()) + 1e-9, 50)
        ax.hist(first, bins=bins, alpha=0.6, label=f"step {steps[0]}", log=True)
        ax.hist(last, bins=bins, alpha=0.6, label=f"step {steps[-1]}", log=True)
        ax.set_title(f"activations of {name}")
        ax.set_xlabel("value")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def dead_relu(run, out):
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in run.names("activation"):
        a = run.series(name, kind="activation")  # [steps, batch, units]
        if a.ndim < 3:
            continue
        dead = (a.reshape(a.shape[0], a.shape[1], -1) <= 0).all(axis=1).mean(axis=1)
        ax.plot(run.steps(name, kind="activation"), dead, marker=".", label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("fraction of units dead over the batch")
    ax.set_title("Dead ReLU units")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(path, outdir):
    run = tensortap.open(path)
    os.makedirs(outdir, exist_ok=True)
    for fn, file in ((grad_norms, "grad_norms.png"), (activation_histograms, "activation_histograms.png"),
                     (dead_relu, "dead_relu.png")):
        target = os.path.join(outdir, file)
        fn(run, target)
        print(f"wrote {target}")


if __name__ == "__main__":
    run_dir = sys.argv[1] if len(sys.argv) > 1 else "runs/demo"
    main(run_dir, sys.argv[2] if len(sys.argv) > 2 else os.path.join(run_dir, "plots"))
