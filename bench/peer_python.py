"""Peer (b) of bench_training: the Python way to get tensors out of training.

    bash -c 'source scripts/common.sh; torch2_python bench/peer_python.py [--reps N] [--scale F] [--threads T] [--json PATH]' 

PyTorch's own hooks (register_forward_hook on the modules where the C++ models
have a Tap, Tensor.register_hook on the parameters and on those activations)
call .detach().cpu().numpy() and np.save, synchronously, on every step. Same
models, initial weights, batches, optimizer and step counts as
bench/bench_training.cpp (bench/bench_models.h), with its own "off" baseline
run interleaved in the same process, so its overhead is a ratio measured in
one run like the C++ ones. Runs on PyPI's torch 2.x, which scripts/common.sh
installs (install_torch2) into a folder of its own.
"""

import argparse
import ctypes
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    """demo::Mlp: identity modules where the C++ model has its Taps."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 128)
        self.hidden1 = nn.Identity()
        self.fc2 = nn.Linear(128, 64)
        self.hidden2 = nn.Identity()
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.hidden1(F.relu(self.fc1(x)))
        x = self.hidden2(F.relu(self.fc2(x)))
        return self.fc3(x)


class SmallCnn(nn.Module):
    """bench::SmallCnn."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.act1 = nn.Identity()
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.act2 = nn.Identity()
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(self.act1(F.relu(self.conv1(x))), 2)
        x = F.max_pool2d(self.act2(F.relu(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


TAPS = {"mlp": ("hidden1", "hidden2"), "cnn": ("act1", "act2")}
N_BATCHES = 8


def mlp_batches():
    # demo::make_task(), draw for draw.
    torch.manual_seed(0)
    data = torch.randn(4096, 32)
    w1, w2 = torch.randn(32, 64), torch.randn(64, 10)
    labels = F.relu(data.mm(w1)).mm(w2).argmax(1)
    return [(data[i * 128:(i + 1) * 128].contiguous(), labels[i * 128:(i + 1) * 128].contiguous())
            for i in range(N_BATCHES)]


def cnn_batches():
    torch.manual_seed(1)
    x = torch.randn(N_BATCHES * 32, 1, 28, 28)
    y = torch.randint(0, 10, (N_BATCHES * 32,))
    return [(x[i * 32:(i + 1) * 32].contiguous(), y[i * 32:(i + 1) * 32].contiguous()) for i in range(N_BATCHES)]


class PythonPeer:
    """Every gradient and activation, saved from PyTorch hooks as .npy."""

    def __init__(self, directory, model, taps):
        self.step = 0
        self.handles = []
        self.dir = directory
        for name, p in model.named_parameters():
            self.handles.append(p.register_hook(self._saver("grad", name)))
        for name in taps:
            self.handles.append(getattr(model, name).register_forward_hook(self._forward_hook(name)))

    def _folder(self, kind, name):
        path = os.path.join(self.dir, kind, name)
        os.makedirs(path, exist_ok=True)
        return path

    def _saver(self, kind, name):
        folder = self._folder(kind, name)

        def save(t):
            np.save(os.path.join(folder, "%08d.npy" % self.step), t.detach().cpu().numpy())

        return save

    def _forward_hook(self, name):
        save_act = self._saver("activation", name)
        save_grad = self._saver("activation_grad", name)

        def hook(module, inputs, output):
            save_act(output)
            if output.requires_grad:
                output.register_hook(save_grad)

        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def train(model_name, mode, batches, steps, warmup, directory):
    torch.manual_seed(42)
    model = Mlp() if model_name == "mlp" else SmallCnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    peer = PythonPeer(directory, model, TAPS[model_name]) if mode == "python" else None
    first_loss = None
    t0 = c0 = None
    for s in range(warmup + steps):
        if s == warmup:
            t0, c0 = time.perf_counter(), time.thread_time()
        if peer:
            peer.step = s
        x, y = batches[s % len(batches)]
        loss = F.cross_entropy(model(x), y)
        if s == 0:
            first_loss = loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    seconds, cpu = time.perf_counter() - t0, time.thread_time() - c0
    if peer:
        peer.close()
    return seconds / steps, cpu / steps, first_loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--only", choices=["mlp", "cnn"])
    args = ap.parse_args()
    # Fixed glibc malloc thresholds, as bench_training sets them (see there).
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    default_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)

    def round100(n):
        return max(100, int(n * args.scale) // 100 * 100)

    # (warmup, timed steps) as in bench_training.cpp.
    plans = {"mlp": (20, round100(1000)), "cnn": (10, round100(400))}
    if args.only:
        plans = {args.only: plans[args.only]}
    batches = {"mlp": mlp_batches(), "cnn": cnn_batches()}
    modes = ["off", "python"]
    base = os.environ.get("TENSORTAP_BENCH_DIR") or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp")
    scratch = tempfile.mkdtemp(prefix="tensortap-bench-py-", dir=base)
    results = {m: {"batch": 128 if m == "mlp" else 32, "warmup": plans[m][0], "steps": plans[m][1],
                   "step_s": {mode: [] for mode in modes}, "thread_cpu_s": {mode: [] for mode in modes}}
               for m in plans}
    run_id = 0
    try:
        for rep in range(args.reps):
            for model_name, (warmup, steps) in plans.items():
                for k in range(len(modes)):
                    mode = modes[(k + rep) % len(modes)]
                    directory = os.path.join(scratch, "run%d" % run_id)
                    run_id += 1
                    step_s, cpu_s, first_loss = train(model_name, mode, batches[model_name], steps, warmup, directory)
                    results[model_name]["step_s"][mode].append(step_s)
                    results[model_name]["thread_cpu_s"][mode].append(cpu_s)
                    if mode == "off" and rep == 0:
                        results[model_name]["first_loss"] = first_loss
                    shutil.rmtree(directory, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print("peer_python: torch %s, intra-op threads %d (default here: %d), %d repetitions, files in %s"
          % (torch.__version__, args.threads, default_threads, args.reps, base))
    print("| model | mode | steps | ms per step (median) | overhead vs off |\n|---|---|---|---|---|")
    for model_name, r in results.items():
        off = statistics.median(r["step_s"]["off"])
        for mode in modes:
            t = statistics.median(r["step_s"][mode])
            print("| %s | %s | %d | %.4f | %+.1f%% |" % (model_name, mode, r["steps"], t * 1e3, (t / off - 1) * 100))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": args.threads, "default_threads": default_threads,
                       "reps": args.reps, "models": results}, f)


if __name__ == "__main__":
    main()
