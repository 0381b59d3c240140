"""PyTorch itself as the reference (issue 29, item 5; issue 45): the same
small model, weights and batches trained twice, in Python recorded by the
Python twin (tensortap.torch) and in C++ with tensortap
(torch_reference.cpp); `tensortap.diff` then compares the two runs, record
by record: every activation, activation gradient, parameter gradient and
loss.

    torch_reference.py make DIR          weights, batches and the Python run (DIR/py-run)
    torch_reference.py check DIR RUN [--rtol R --atol A]
                                         RUN (written by torch_reference.cpp) against
                                         DIR/py-run: bit for bit unless a tolerance is given
    torch_reference.py check DIR RUN ref-cuda
                                         a run of torch_reference.cpp --cuda against the
                                         .cpu() copies it took at capture (scripts/gpu.sh),
                                         written as a run first

Run `make` with the Python torch whose LibTorch the C++ side links for the
bit-exact check: the same kernels, one thread each, so there is nothing to
differ but tensortap. Against another LibTorch (Debian's 1.13) the check
takes a tolerance (tests/CMakeLists.txt, reference.twin_tolerance).
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

    import tensortap.torch as ttt

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = fc1, fc2, fc3

        def forward(self, x):
            return self.fc3(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run = os.path.join(work, "py-run")
    with ttt.watch(model, run, overwrite=True) as rec:
        for step, (x, y) in enumerate(batches):
            rec.step(step)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            rec.capture("loss", loss)
            loss.backward()
            opt.step()
    print(f"torch_reference: torch {torch.__version__}, {rec.records} records by the Python twin in {run}")


RECORDS = STEPS * (3 + 3 + 6 + 1)


def copies_as_run(ref_dir, run):
    """The .cpu() copies torch_reference.cpp --cuda saved (KIND__NAME__STEP.npy)
    as a run, written as the Python twin writes one, so that one comparison,
    tensortap.diff, serves both checks."""
    from tensortap._writer import RunWriter, default_options

    writer = RunWriter(run, default_options(1, ["activation", "activation_grad", "grad", "tensor"]), overwrite=True)
    try:
        for f in sorted(os.listdir(ref_dir)):
            kind, name, step = f[:-len(".npy")].split("__")
            a = np.load(os.path.join(ref_dir, f))
            writer.write(kind, name, int(step), a, a.dtype.name)
    finally:
        writer.close()
    return run


def check(work, run_dir, refs=None, rtol=0.0, atol=0.0):
    """RUN against the reference: the Python twin's run (make), or with
    refs="ref-cuda", the .cpu() copies torch_reference.cpp --cuda took."""
    import tensortap

    reference = os.path.join(work, "py-run") if refs is None else copies_as_run(os.path.join(work, refs),
                                                                                 os.path.join(work, refs + "-run"))
    for path in (reference, run_dir):
        run = tensortap.open(path)
        assert run.closed and run.info.get("errors", 0) == 0, (path, run.info)
        assert run.info.get("dropped", 0) == 0, (path, run.info)
        assert len(run.records) == RECORDS, (path, len(run.records))
    df = tensortap.diff(reference, run_dir, rtol=rtol, atol=atol)
    # Nothing in one run that the other did not take, and every value equal.
    assert len(df) == RECORDS and (df.status == "equal").all(), df[df.status != "equal"].to_string()
    how = "bit for bit" if rtol == 0 and atol == 0 else f"within rtol {rtol:g}, atol {atol:g}"
    worst = df.loc[df.max_rel.idxmax()]
    print(f"torch_reference: {len(df)} records of {run_dir} equal {reference}'s {how} "
          f"(largest relative difference {worst.max_rel:.3g}: {worst.kind} {worst['name']} step {worst.step}; "
          f"largest normwise error ||a - b|| / ||a|| {df.rel_norm.max():.3g})")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "check":
        import argparse

        p = argparse.ArgumentParser(prog="torch_reference.py check")
        p.add_argument("work")
        p.add_argument("run")
        p.add_argument("refs", nargs="?")
        p.add_argument("--rtol", type=float, default=0.0)
        p.add_argument("--atol", type=float, default=0.0)
        a = p.parse_args(sys.argv[2:])
        check(a.work, a.run, a.refs, a.rtol, a.atol)
    else:
        sys.exit(f"usage: {sys.argv[0]} make DIR | check DIR RUN [ref-cuda] [--rtol R --atol A]")
