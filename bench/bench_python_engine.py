"""What recording a PyTorch loop costs from Python: tensortap.torch.watch(...,
engine="native") (the C++ recorder) against engine="python" (the twin's
writer) and against peer (b), the naive Python way (bench/peer_python.py:
forward hooks and Tensor hooks calling .detach().cpu().numpy() and np.save
on the training thread), at every step and every 10th, on the demo MLP and
the bench CNN of peer_python.py, CPU.

    cd /work/main && PYTHONPATH=python:build-torch2/python build-torch2/torch2-python \\
        bench/bench_python_engine.py [--reps 5] [--steps 300] [--json PATH]

Every way records the same tensors: each parameter's gradient, and the
activations of the tap modules (peer_python.TAPS) and their gradients: 10
records a step for either model. Each repetition runs every mode once, in
an order rotated from one repetition to the next, with its own "off"
baseline; an overhead is (time with recording - time off) / time off of the
same repetition (paired), and the tables give medians over repetitions. A
tensortap run's time includes its close() (the writes it queued). Files go
to /dev/shm (or $TENSORTAP_BENCH_DIR). Target (issue 78 (3)): the native
engine at every step costs at most a fifth of peer (b)'s overhead.
"""

import argparse
import ctypes
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_python  # noqa: E402  (the models, batches and peer (b))

import tensortap.torch as ttt  # noqa: E402

MODES = ("off", "peer_b", "peer_b_10", "python", "python_10", "native", "native_10", "packed", "packed_10")
# packed: the native engine with format="packed" (one file a segment, not a
# file a record).


class EveryPeer(peer_python.PythonPeer):
    """Peer (b) that saves only at every `every`-th step (the hooks return
    at once on the others), as one would write it by hand."""

    def __init__(self, directory, model, taps, every):
        self.every = every
        super().__init__(directory, model, taps)

    def _saver(self, kind, name):
        save = super()._saver(kind, name)

        def maybe(t):
            if self.step % self.every == 0:
                save(t)

        return maybe

    def _forward_hook(self, name):
        hook = super()._forward_hook(name)

        def maybe(module, inputs, output):
            if self.step % self.every == 0:
                hook(module, inputs, output)

        return maybe


def recorder(mode, model_name, model, directory):
    """The mode's recorder: (step(s), close()) or None for off."""
    every = 10 if mode.endswith("_10") else 1
    if mode.startswith("peer_b"):
        peer = EveryPeer(directory, model, peer_python.TAPS[model_name], every)

        def step(s):
            peer.step = s

        return step, peer.close
    if mode.startswith(("python", "native", "packed")):
        engine = "python" if mode.startswith("python") else "native"
        options = {"format": "packed"} if mode.startswith("packed") else {}
        rec = ttt.watch(model, directory, every=every, engine=engine, modules=list(peer_python.TAPS[model_name]),
                        kinds=["activation", "activation_grad", "grad"], **options)
        return rec.step, rec.close
    return None


def train(model_name, mode, batches, steps, warmup, directory):
    """Seconds a step (wall, close() included) and the training thread's CPU
    seconds a step, over `steps` steps after `warmup`."""
    torch.manual_seed(42)
    model = peer_python.Mlp() if model_name == "mlp" else peer_python.SmallCnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rec = recorder(mode, model_name, model, directory)
    t0 = c0 = None
    for s in range(warmup + steps):
        if s == warmup:
            t0, c0 = time.perf_counter(), time.thread_time()
        if rec:
            rec[0](s)
        x, y = batches[s % len(batches)]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rec:
        rec[1]()
    return (time.perf_counter() - t0) / steps, (time.thread_time() - c0) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300, help="timed steps a run (the CNN: two thirds of them)")
    ap.add_argument("--json")
    args = ap.parse_args()
    libc = ctypes.CDLL("libc.so.6")  # fixed malloc thresholds, as peer_python.py and bench_training
    libc.mallopt(-3, 32 << 20)
    libc.mallopt(-1, 1 << 30)
    torch.set_num_threads(1)
    plans = {"mlp": (20, args.steps), "cnn": (10, max(10, args.steps * 2 // 3 // 10 * 10))}
    batches = {"mlp": peer_python.mlp_batches(), "cnn": peer_python.cnn_batches()}
    base = os.environ.get("TENSORTAP_BENCH_DIR") or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp")
    scratch = tempfile.mkdtemp(prefix="tensortap-bench-pyengine-", dir=base)
    runs = {m: {mode: [] for mode in MODES} for m in plans}
    cpu = {m: {mode: [] for mode in MODES} for m in plans}
    n = 0
    try:
        for m, (warmup, steps) in plans.items():  # a first run of each mode, untimed: imports, first allocations
            for mode in MODES:
                train(m, mode, batches[m], 10, 2, os.path.join(scratch, f"w{n}"))
                n += 1
        for rep in range(args.reps):
            for m, (warmup, steps) in plans.items():
                for k in range(len(MODES)):
                    mode = MODES[(k + rep) % len(MODES)]
                    directory = os.path.join(scratch, f"r{n}")
                    n += 1
                    wall, thread = train(m, mode, batches[m], steps, warmup, directory)
                    runs[m][mode].append(wall)
                    cpu[m][mode].append(thread)
                    shutil.rmtree(directory, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def overheads(m, mode):
        return [t / off - 1 for t, off in zip(runs[m][mode], runs[m]["off"])]

    print(f"bench_python_engine: torch {torch.__version__}, 1 intra-op thread, {args.reps} repetitions, "
          f"files in {base}")
    print("| model | mode | steps | ms a step (median) | overhead vs off (median of paired) "
          "| training thread CPU ms | native's overhead / this one's | packed's / this one's |")
    print("|---|---|---|---|---|---|---|---|")
    out = {"torch": torch.__version__, "reps": args.reps, "models": {}}
    for m in plans:
        out["models"][m] = {"steps": plans[m][1], "step_s": runs[m], "thread_cpu_s": cpu[m]}
        for mode in MODES:
            t = statistics.median(runs[m][mode])
            c = statistics.median(cpu[m][mode])
            over = statistics.median(overheads(m, mode)) if mode != "off" else 0.0
            fracs = ["", ""]
            if mode.startswith(("peer_b", "python")):
                tail = "_10" if mode.endswith("_10") else ""
                fracs = ["%.2f" % statistics.median(a / b for a, b in zip(overheads(m, mine + tail), overheads(m, mode)))
                         for mine in ("native", "packed")]
            print(f"| {m} | {mode} | {plans[m][1]} | {t * 1e3:.3f} | {over * 100:+.1f}% | {c * 1e3:.3f} "
                  f"| {fracs[0]} | {fracs[1]} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
