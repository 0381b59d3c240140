"""Does the C++ ResNet port compute what the Python original does? The
floor workflow of docs/diff.md with three floor runs, on a model with
BatchNorm, a max-pool and an SGD schedule.

    python3 check.py PORT_RESNET WORK [--bug BUG] [--threads N] [--channels-last]
                     [--floors 0,1,2] [--ulps U] [--factor F] [--html OUT] [--reuse]

1. A: the Python original (resnet.py) trains 16 steps from seed 0, recorded
   by the Python twin (tensortap.torch) into WORK/py: the weights as each
   recorded step begins (kind "param": step 0's are the initial ones), the
   buffers (BatchNorm's running statistics), every layer's output and
   gradient, the parameters' gradients, the loss, the learning rate and
   the evaluation passes' logits and loss.
2. The floor runs: the same program, its initial weights moved by `ulps`
   units in the last place (tensortap.torch.perturb) with each seed of
   --floors, into WORK/floor<seed>.
3. B: the C++ port (PORT_RESNET, port_resnet.cpp) starts from A's step-0
   weights (tensortap::load_params) and trains the same 16 steps into
   WORK/cpp, with the same names and steps (--threads and --channels-last
   run it another way, --bug with a port bug).
4. `tensortap diff WORK/py WORK/cpp --floor WORK/floor0 --floor ...`: a
   record of B is noise when it differs from A no more than `factor` times
   the furthest floor run does. The exit status is the diff's.

With --reuse, the Python runs WORK already holds are kept (A, and each floor
run asked for that is there): another port, or another floor set, against
them.
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUGS = ("bn_eps", "bn_momentum", "no_nesterov", "no_decay_norm", "same_padding", "sched_first", "bgr", "no_eval",
        "frozen_conv1", "no_smoothing", "relu_before_add")
KINDS = ("activation", "activation_grad", "param", "buffer", "grad", "tensor")


def record_python(path, perturb_seed=None, ulps=1):
    """Runs the Python original into `path`, from seed 0's weights, moved by
    `ulps` ulps with `perturb_seed` for a floor run."""
    import torch

    import tensortap.torch as ttt
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from resnet import RECORDED, ResNet, train

    torch.manual_seed(0)
    model = ResNet()
    if perturb_seed is not None:
        ttt.perturb(model, ulps=ulps, seed=perturb_seed)
    with ttt.watch(model, path, kinds=KINDS, steps=RECORDED, overwrite=True) as rec:
        train(model, rec)


def record_references(work, seeds, ulps=1, reuse=False):
    """A and a floor run per seed, each unless `reuse` finds it in `work`."""
    import torch

    torch.set_num_threads(1)
    runs = [("py", None)] + [(f"floor{s}", s) for s in seeds]
    for name, seed in runs:
        path = os.path.join(work, name)
        if not (reuse and os.path.exists(os.path.join(path, "run.json"))):
            record_python(path, perturb_seed=seed, ulps=ulps)


def run_port(program, work, jobs):
    """Runs the C++ port once for several runs: `jobs` is a list of (name,
    options), each into WORK/<name>, from A's initial weights."""
    command = [program, os.path.join(work, "py")]
    for name, options in jobs:
        command += [os.path.join(work, name)] + list(options)
    # OpenMP threads that wait passively: on a busy machine (a suite run in
    # parallel) a spinning thread held the core its preempted partner needed,
    # and a 2-thread run took 2 to 3 s where it takes 0.5. The same threads
    # split the same work either way: no result changes.
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    subprocess.run(command, check=True, env=env)


def diff(work, name, seeds, ulps=1, factor=None, html=None, steps=None):
    """`tensortap diff` of A against WORK/<name>, with a floor run per seed,
    in this process (`steps`: its --steps). Returns its exit status."""
    from tensortap.__main__ import main as tensortap_main

    command = ["diff", os.path.join(work, "py"), os.path.join(work, name), "--ulps", str(ulps)]
    if steps:
        command += ["--steps", steps]
    for seed in seeds:
        command += ["--floor", os.path.join(work, f"floor{seed}")]
    if factor is not None:
        command += ["--factor", str(factor)]
    if html:
        command += ["--html", html]
    sys.stdout.flush()
    rc = tensortap_main(command)
    sys.stdout.flush()
    return rc


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("port_resnet", help="the C++ program (port_resnet.cpp)")
    p.add_argument("work", help="a folder for the runs")
    p.add_argument("--bug", choices=BUGS, help="run the C++ port with this bug")
    p.add_argument("--threads", type=int, default=1, help="the port's intra-op threads (default 1)")
    p.add_argument("--channels-last", action="store_true", help="the port's weights and images channels-last")
    p.add_argument("--floors", default="0,1,2", help="the floor runs' perturbation seeds (default 0,1,2)")
    p.add_argument("--ulps", type=int, default=1, help="the floor runs' perturbation (default 1)")
    p.add_argument("--factor", type=float, help="the diff's --factor (default its own, 10)")
    p.add_argument("--html", metavar="OUT", help="also write the diff's page")
    p.add_argument("--reuse", action="store_true", help="keep the Python runs WORK already holds")
    args = p.parse_args(argv)

    import torch

    seeds = [int(s) for s in args.floors.split(",")]
    record_references(args.work, seeds, ulps=args.ulps, reuse=args.reuse)
    options = ["--threads", str(args.threads)] + (["--channels-last"] if args.channels_last else [])
    options += ["--bug", args.bug] if args.bug else []
    run_port(args.port_resnet, args.work, [("cpp", options)])
    print(f"C++ ResNet port against the Python original (torch {torch.__version__}), floor seeds "
          f"{', '.join(map(str, seeds))}:")
    return diff(args.work, "cpp", seeds, ulps=args.ulps, factor=args.factor, html=args.html)


if __name__ == "__main__":
    sys.exit(main())
