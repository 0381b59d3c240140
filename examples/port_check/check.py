"""Does the C++ port compute what the Python original does? A port check
with tensortap and a noise floor (docs/diff.md, "The floor workflow").

    python3 check.py PORT_CHECK WORK [--bug BUG] [--seeds 0,1] [--ulps U] [--factor F] [--html OUT] [--reuse]

1. A: the Python original (model.py) trains 30 steps from seed 0, recorded
   by the Python twin (tensortap.torch) into WORK/py: its weights as each
   recorded step begins (kind "param": step 0's are the initial ones),
   buffers, every layer's output and gradient, the clipped gradients AdamW
   applies, the learning rate and the loss.
2. A2, the floor: the same program, its initial weights moved by `ulps`
   units in the last place (tensortap.torch.perturb) before the first step,
   into WORK/floor<seed>, once per seed: how far rounding alone takes A.
3. B: the C++ port (PORT_CHECK, port_check.cpp) starts from A's step-0
   weights (tensortap::load_params) and trains the same 30 steps into
   WORK/cpp, with the same names and steps.
4. `tensortap diff WORK/py WORK/cpp --floor WORK/floor<seed>` for each seed:
   a record of B is noise when it differs from A no more than `factor`
   times A2 does. The exit status is the worst of the diffs'.

With --bug, the C++ side has a port bug (port_check.cpp lists them).
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUGS = ("layernorm-eps", "detach-residual", "loss-sum", "adamw-decay", "schedule", "bn-momentum")


def record_python(path, perturb_seed=None, ulps=1):
    """Runs the Python original into `path`, from seed 0's weights, moved by
    `ulps` ulps with `perturb_seed` for a floor run."""
    import torch

    import tensortap.torch as ttt
    from model import RECORDED, Net, train

    torch.manual_seed(0)
    model = Net()
    if perturb_seed is not None:
        ttt.perturb(model, ulps=ulps, seed=perturb_seed)
    kinds = ("activation", "activation_grad", "param", "buffer", "grad", "tensor")
    with ttt.watch(model, path, kinds=kinds, steps=RECORDED, overwrite=True) as rec:
        train(model, rec)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("port_check", help="the C++ program (port_check.cpp)")
    p.add_argument("work", help="a folder for the runs")
    p.add_argument("--bug", choices=BUGS, help="run the C++ port with this bug")
    p.add_argument("--seeds", default="0,1", help="the floor runs' perturbation seeds (default 0,1)")
    p.add_argument("--ulps", type=int, default=1, help="the floor runs' perturbation (default 1)")
    p.add_argument("--factor", type=float, help="the diff's --factor (default its own, 10)")
    p.add_argument("--html", metavar="OUT", help="also write the first diff's page")
    p.add_argument("--reuse", action="store_true",
                   help="keep the Python runs (A and the floors) WORK already holds: another port against them")
    args = p.parse_args(argv)

    import torch

    from tensortap.__main__ import main as tensortap_main

    sys.path.insert(0, HERE)
    torch.set_num_threads(1)
    py, cpp = os.path.join(args.work, "py"), os.path.join(args.work, "cpp")
    seeds = [int(s) for s in args.seeds.split(",")]
    if not (args.reuse and os.path.exists(os.path.join(py, "run.json"))):
        record_python(py)
        for seed in seeds:
            record_python(os.path.join(args.work, f"floor{seed}"), perturb_seed=seed, ulps=args.ulps)
    subprocess.run([args.port_check, cpp, py] + ([args.bug] if args.bug else []), check=True)
    worst = 0
    for i, seed in enumerate(seeds):
        print(f"C++ port against the Python original (torch {torch.__version__}), floor seed {seed}:")
        sys.stdout.flush()
        command = ["diff", py, cpp, "--floor", os.path.join(args.work, f"floor{seed}"), "--ulps", str(args.ulps)]
        if args.factor is not None:
            command += ["--factor", str(args.factor)]
        if args.html and i == 0:
            command += ["--html", args.html]
        worst = max(worst, tensortap_main(command))
        sys.stdout.flush()
    return worst


if __name__ == "__main__":
    sys.exit(main())
