"""`tensortap doctor` at scale (issue 61): a run of a million statistics rows
(2,000 tensors x 500 steps by default), the time of every rule over it.

    /usr/bin/python3 bench/bench_doctor.py [--tensors 2000] [--steps 500] [--reps 3]

The run is written directly (run.json, an empty index, stats.npy and
stats_series.jsonl as the recorder writes them) under $TENSORTAP_BENCH_DIR,
else /dev/shm: per layer of a model, a ReLU, tanh and sigmoid output and
their inputs (`relu<k>_input`...), the activation gradients, the weight's
and the bias's gradients and parameters, and one loss; healthy values with
one planted problem per rule, so that every rule does its work to the end.
Timed in this process, warm cache, medians: the command's work
(run_command: open the run, evaluate every rule, the lines), then each rule
alone. The target (issue 61): under 10 s.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from tensortap._doctor import command as _doctor  # noqa: E402
from tensortap._doctor.settings import RULES  # noqa: E402
from tensortap import STATS_FIELDS  # noqa: E402
from tensortap._writer import RunWriter, default_options  # noqa: E402

KINDS_PER_LAYER = [("activation", "relu{k}"), ("activation", "relu{k}_input"), ("activation", "tanh{k}"),
                   ("activation", "sigmoid{k}"), ("activation_grad", "relu{k}"), ("grad", "fc{k}.weight"),
                   ("grad", "fc{k}.bias"), ("param", "fc{k}.weight"), ("param", "fc{k}.bias"),
                   ("activation_grad", "tanh{k}")]


def make_run(path, tensors, steps):
    """A run of `tensors` series by `steps` steps; returns the row count."""
    w = RunWriter(path, default_options(1, ["activation", "activation_grad", "param", "grad", "tensor"]),
                  overwrite=True, rank=0, world_size=1)
    w.close()
    keys = []
    k = 0
    while len(keys) < tensors - 1:
        k += 1
        keys += [(kind, name.format(k=k)) for kind, name in KINDS_PER_LAYER]
    keys = keys[:tensors - 1] + [("tensor", "loss")]
    rng = np.random.default_rng(0)
    n = len(keys) * steps
    fields = [("step", "<i8"), ("series", "<i8")] + [(f, "<f8" if f in ("min", "max", "mean", "std", "norm")
                                                      else "<i8") for f in STATS_FIELDS]
    table = np.zeros(n, np.dtype(fields))
    # Step-major, as the recorder appends rows: every tensor of a step, then the next step.
    table["step"] = np.repeat(np.arange(steps), len(keys))
    table["series"] = np.tile(np.arange(len(keys)), steps)
    numel = 4096
    std = np.exp(rng.normal(0, 0.1, n)) * np.tile(np.exp(rng.uniform(-3, 1, len(keys))), steps)
    mean = rng.normal(0, 0.1, n) * std
    table["std"], table["mean"] = std, mean
    table["min"], table["max"] = mean - 3 * std, mean + 3 * std
    table["norm"] = np.sqrt(numel * (std ** 2 + mean ** 2))
    table["numel"] = numel
    table["zeros"] = np.where(np.tile([name.startswith("relu") and not name.endswith("_input")
                                       for _, name in keys], steps), numel // 2, 0)
    loss = len(keys) - 1
    at = table["series"] == loss
    table["mean"][at] = 2.3 * np.exp(-np.arange(steps) / steps)
    table["numel"][at], table["std"][at] = 1, 0
    # One planted problem per rule, late in the run.
    late = table["step"] >= steps * 3 // 4
    table["zeros"][(table["series"] == 0) & late] = numel - 1          # dead_relu on relu1
    table["norm"][(table["series"] == 5) & late] = 1e-9                 # vanishing_gradient on fc1.weight
    table["nan"][(table["series"] == 1) & (table["step"] == steps - 5)] = 3   # exploding_tensor
    table["std"][(table["series"] == 2) & late] *= 1e4                  # tensor_variance on tanh1
    np.save(os.path.join(path, "stats.npy"), table)
    with open(os.path.join(path, "stats_series.jsonl"), "w") as f:
        for i, (kind, name) in enumerate(keys):
            f.write(json.dumps({"series": i, "kind": kind, "name": name}) + "\n")
    return n


def timed(fn, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    root = os.environ.get("TENSORTAP_BENCH_DIR", "/dev/shm" if os.path.isdir("/dev/shm") else None)
    with tempfile.TemporaryDirectory(dir=root, prefix="tt-bench-doctor-") as tmp:
        path = os.path.join(tmp, "run")
        t = time.perf_counter()
        n = make_run(path, args.tensors, args.steps)
        print(f"run: {n:,} statistics rows ({args.tensors} tensors x {args.steps} steps), written in "
              f"{time.perf_counter() - t:.1f} s")
        seconds, (lines, status) = timed(lambda: _doctor.run_command(path, None, [], False, lambda s: None),
                                         args.reps)
        print(f"tensortap doctor (every rule): {seconds:.2f} s, median of {args.reps}, exit {status}, "
              f"{len(lines) - 1} lines before the count: " + "; ".join(ln[:60] for ln in lines[:4]))
        for rule in RULES:
            s, _ = timed(lambda: _doctor.run_command(path, rule, [], False, lambda s: None), args.reps)
            print(f"  {rule:28} {s:6.2f} s")
        verdict = "met" if seconds < 10 else "MISSED"
        print(f"target: under 10 s for a million rows: {verdict}")


if __name__ == "__main__":
    main()
