"""Does the C++ port compute what the Python original does? A port check
with tensortap (README, "Two runs side by side").

    python3 check.py PORT_CHECK WORK [--bug gelu-tanh|layernorm-eps] [--rtol R] [--atol A] [--html OUT]

1. PORT_CHECK (port_check.cpp, built as examples/port_check) trains the C++
   port 5 steps into WORK/cpp, recording the weights as each step begins
   (kind "param": step 0's are the initial weights), the batches, every
   layer's output and gradient, the parameter gradients and the loss.
2. The Python original (model.py) loads those weights and batches from the
   C++ run and trains the same 5 steps, recorded by the Python twin
   (tensortap.torch) into WORK/py.
3. `tensortap diff WORK/py WORK/cpp` compares them, record by record, the
   Python original the reference, and names the first layer that differs.
   Its exit status is this script's.

With --bug, the C++ side has a port bug. Against the same LibTorch version
the comparison is exact; against another (Debian's 1.13 beside PyPI's torch)
it defaults to rtol 1e-5, atol 1e-6, what their float noise needs.
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("port_check", help="the C++ program (port_check.cpp)")
    p.add_argument("work", help="a folder for the two runs")
    p.add_argument("--bug", choices=("gelu-tanh", "layernorm-eps"), help="run the C++ port with this bug")
    p.add_argument("--rtol", type=float)
    p.add_argument("--atol", type=float)
    p.add_argument("--html", metavar="OUT", help="also write the diff's page")
    args = p.parse_args(argv)

    import torch

    import tensortap
    import tensortap.torch as ttt
    from tensortap.__main__ import main as tensortap_main

    sys.path.insert(0, HERE)
    from model import Net

    cpp, py = os.path.join(args.work, "cpp"), os.path.join(args.work, "py")
    subprocess.run([args.port_check, cpp] + ([args.bug] if args.bug else []), check=True)

    torch.set_num_threads(1)
    ref = tensortap.open(cpp)
    model = Net()
    with torch.no_grad():  # the C++ side's initial weights
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(ref.load(name, 0, kind="param").copy()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # Every kind the C++ side records, parameters too: each step's weights
    # are compared, before the step's update.
    kinds = ("activation", "activation_grad", "param", "buffer", "grad", "tensor")
    with ttt.watch(model, py, kinds=kinds, overwrite=True) as rec:
        for step in ref.steps("x", kind="tensor"):
            rec.step(step)
            x = torch.from_numpy(ref.load("x", step, kind="tensor").copy())
            y = torch.from_numpy(ref.load("y", step, kind="tensor").copy())
            rec.capture("x", x)
            rec.capture("y", y)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            rec.capture("loss", loss)
            loss.backward()
            opt.step()

    same = ref.info.get("torch_version", "").split("+")[0] == torch.__version__.split("+")[0]
    rtol = args.rtol if args.rtol is not None else (0.0 if same else 1e-5)
    atol = args.atol if args.atol is not None else (0.0 if same else 1e-6)
    print(f"C++ (LibTorch {ref.info.get('torch_version')}) against Python (torch {torch.__version__}), "
          + ("exactly" if rtol == atol == 0 else f"rtol {rtol:g}, atol {atol:g}") + ":")
    sys.stdout.flush()
    return tensortap_main(["diff", py, cpp, "--rtol", str(rtol), "--atol", str(atol)]
                          + (["--html", args.html] if args.html else []))


if __name__ == "__main__":
    sys.exit(main())
