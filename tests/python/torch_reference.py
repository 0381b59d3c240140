"""PyTorch itself as the reference (issue 29, item 5): the same small model,
weights and batches trained twice, in Python with hooks that take
`.detach().clone()` copies and in C++ with tensortap (torch_reference.cpp);
every activation, activation gradient, parameter gradient and loss must
agree bit for bit through the reader.

    torch_reference.py make DIR          weights, batches and Python's copies
    torch_reference.py check DIR RUN     RUN (written by torch_reference.cpp) against them
    torch_reference.py check DIR RUN ref-cuda
                                         a run of torch_reference.cpp --cuda against the
                                         .cpu() copies it took at capture (scripts/gpu.sh)

Run with the Python torch whose LibTorch the C++ side links: the same
kernels, one thread each, so there is nothing to differ but tensortap.
"""

import os
import sys

import numpy as np

STEPS = 6
BATCH, IN, HIDDEN, OUT = 16, 12, 32, 5


def make(work):
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(1234)
    fc1, fc2, fc3 = torch.nn.Linear(IN, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, OUT)
    layers = {"fc1": fc1, "fc2": fc2, "fc3": fc3}
    init = os.path.join(work, "init")
    os.makedirs(init, exist_ok=True)
    for lname, layer in layers.items():
        for pname, p in layer.named_parameters():
            np.save(os.path.join(init, f"{lname}.{pname}.npy"), p.detach().numpy())
    data = os.path.join(work, "data")
    os.makedirs(data, exist_ok=True)
    batches = []
    for step in range(STEPS):
        x, y = torch.randn(BATCH, IN), torch.randn(BATCH, OUT)
        np.save(os.path.join(data, f"x{step}.npy"), x.numpy())
        np.save(os.path.join(data, f"y{step}.npy"), y.numpy())
        batches.append((x, y))

    ref = {}  # (kind, name, step) -> array

    def keep(kind, name, t):
        key = (kind, name, current[0])
        assert key not in ref, key
        ref[key] = t.detach().clone().numpy()

    current = [0]
    for lname, layer in layers.items():
        # The forward hook copies the layer's output; a tensor hook on that
        # output copies the gradient flowing back into it.
        def forward_hook(module, inputs, output, lname=lname):
            keep("activation", lname, output)
            output.register_hook(lambda g, lname=lname: keep("activation_grad", lname, g))

        layer.register_forward_hook(forward_hook)
        for pname, p in layer.named_parameters():
            p.register_hook(lambda g, name=f"{lname}.{pname}": keep("grad", name, g))

    params = [p for layer in layers.values() for p in layer.parameters()]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    for step, (x, y) in enumerate(batches):
        current[0] = step
        opt.zero_grad()
        out = fc3(torch.tanh(fc2(torch.relu(fc1(x)))))
        loss = torch.nn.functional.mse_loss(out, y)
        keep("tensor", "loss", loss)
        loss.backward()
        opt.step()

    out_dir = os.path.join(work, "ref")
    os.makedirs(out_dir, exist_ok=True)
    for (kind, name, step), a in ref.items():
        np.save(os.path.join(out_dir, f"{kind}__{name}__{step}.npy"), a)
    print(f"torch_reference: torch {torch.__version__}, {len(ref)} reference tensors in {out_dir}")


def check(work, run_dir, refs="ref"):
    """RUN against WORK/<refs>: "ref", PyTorch's own copies (make), or
    "ref-cuda", the .cpu() copies torch_reference.cpp --cuda took at capture."""
    import tensortap

    ref_dir = os.path.join(work, refs)
    refs = sorted(os.listdir(ref_dir))
    assert len(refs) == STEPS * (3 + 3 + 6 + 1), len(refs)
    run = tensortap.open(run_dir)
    assert run.closed and run.info.get("errors", 0) == 0, run.info
    assert run.info.get("dropped", 0) == 0, run.info
    # Nothing in the run that Python did not take, and the reverse.
    in_run = {(r["kind"], r["name"], r["step"]) for r in run.records}
    in_ref = set()
    for f in refs:
        kind, name, step = f[:-len(".npy")].split("__")
        in_ref.add((kind, name, int(step)))
    assert in_run == in_ref, (sorted(in_run - in_ref), sorted(in_ref - in_run))
    for kind, name, step in sorted(in_ref):
        want = np.load(os.path.join(ref_dir, f"{kind}__{name}__{step}.npy"))
        got = run.load(name, step, kind=kind)
        assert got.dtype == want.dtype and got.shape == want.shape, (kind, name, step, got.dtype, got.shape,
                                                                      want.dtype, want.shape)
        # Bit for bit: the bytes, not a tolerance (NaN-safe, -0.0 apart from 0.0).
        if got.tobytes() != want.tobytes():
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
            raise AssertionError(f"{kind}/{name} at step {step} differs from PyTorch's copy (max |diff| {diff})")
    print(f"torch_reference: {len(in_ref)} tensors equal the copies in {ref_dir} bit for bit")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "check":
        check(*sys.argv[2:5])
    else:
        sys.exit(f"usage: {sys.argv[0]} make DIR | check DIR RUN [REFS]")
