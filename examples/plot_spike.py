"""Shows a loss spike the spike trigger caught, and the steps before it.

    PYTHONPATH=python python3 examples/plot_spike.py runs/spike runs/spike/plots

Reads the statistics table (every step) and the full tensors the flight
recorder dumped, prints which rule fired, and writes spike.png:
  left:  the loss over the whole run (its statistics' mean), the rule's
         threshold (factor x the running median) and the dumped steps shaded;
  right: over the dumped steps, from the full tensors: each parameter
         gradient's L2 norm, so what led up to the spike is visible.
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
    spikes = [d for d in run.dumps if d.get("trigger", {}).get("kind") == "spike"]
    if not spikes:
        sys.exit(f"{path}: no spike trigger fired")
    dump = spikes[0]
    rule = dump["trigger"]
    print(f"spike in {dump['kind']} '{dump['name']}' at step {dump['step']}: {dump['value']:.3g} against a median "
          f"of {dump['median']:.3g} over {rule['window']} steps (factor {rule['factor']}); "
          f"dumped steps {dump['steps'][0]}..{dump['steps'][-1]}")
    loss = run.stats(dump["name"], kind=dump["kind"])
    steps, values = loss["step"], loss["mean"]
    window = rule["window"]
    threshold = [rule["factor"] * np.median(np.abs(values[max(0, i - window):i])) if i else np.nan
                 for i in range(len(values))]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    a.plot(steps, values, label="loss")
    a.plot(steps, threshold, "--", label=f"{rule['factor']:g} x median of the last {window}")
    a.axvspan(dump["steps"][0], dump["steps"][-1], alpha=0.2, color="tab:orange", label="dumped steps")
    a.axvline(dump["step"], color="tab:red", lw=1)
    a.set_yscale("log")
    a.set_xlabel("step")
    a.set_title("the loss, from the statistics table")
    a.legend(fontsize=8)
    for name in run.names("grad"):
        norms = [float(np.linalg.norm(run.load(name, s, kind="grad"))) for s in dump["steps"]]
        b.plot(dump["steps"], norms, marker=".", label=name)
    b.axvline(dump["step"], color="tab:red", lw=1)
    b.set_yscale("log")
    b.set_xlabel("step")
    b.set_title("gradient L2 norms of the dumped steps, from the full tensors")
    b.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "spike.png")
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else os.path.join(sys.argv[1], "plots"))
