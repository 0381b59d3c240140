"""Checks the runs of the third-party style examples (examples/train_gan.cpp,
examples/train_mnist_style.cpp) through the reader, as a user would.

    check_examples.py GAN_RUN MNIST_RUN
"""

import contextlib
import io
import sys

import numpy as np

import tensortap
from tensortap import __main__ as cli


def check_clean(path):
    run = tensortap.open(path)
    assert run.closed, f"{path}: not closed"
    assert run.info.get("errors", 0) == 0, run.info
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["inspect", path, "--check"])
    assert rc == 0, out.getvalue()
    assert " 0 problems" in out.getvalue(), out.getvalue()
    return run


def check_gan(path):
    run = check_clean(path)
    assert set(run.kinds()) == {"activation", "activation_grad", "param", "buffer", "grad", "tensor"}, run.kinds()
    steps = run.steps("0.weight", kind="grad")
    assert steps[:3] == [0, 10, 20], steps
    # One recorder, two models: the generator's names under "G/".
    grads = run.names("grad")
    assert "0.weight" in grads and "G/0.weight" in grads, grads
    # record_grads(): one record per parameter and step, no end-of-step sum beside it.
    assert not any("#" in n for n in grads), grads
    for name in grads:
        assert run.steps(name, kind="grad") == steps, (name, run.steps(name, kind="grad"))
    # Scopes: the discriminator's three runs a step, apart; no repeat suffixes.
    acts = run.names("activation")
    for scope in ("real", "fake", "gen"):
        assert all(f"{scope}/{i}" in acts for i in range(10)), (scope, acts)
    assert not any("#" in n for n in acts), acts
    # The generator's Tapped transposed convolutions, inside its Sequential.
    assert run.series("G/0", kind="activation").shape == (len(steps), 32, 64, 4, 4)
    assert run.series("G/9", kind="activation").shape == (len(steps), 32, 1, 28, 28)
    # Buffers: BatchNorm's running statistics when steps begin; they move.
    mean = run.series("G/1.running_mean", kind="buffer")
    assert mean.shape == (len(steps), 64)
    assert not np.array_equal(mean[0], mean[-1])
    assert run.series("G/1.num_batches_tracked", kind="buffer")[1] == 10
    losses = run.series("d_loss", kind="tensor")
    assert np.isfinite(losses).all()


def check_mnist(path):
    run = check_clean(path)
    # The test pass (eval mode) is not recorded: one activation per Tapped layer and step.
    assert run.names("activation") == ["conv1", "conv2", "fc1", "fc2"], run.names("activation")
    steps = run.steps("fc2", kind="activation")
    assert steps == list(range(0, 40, 5)), steps
    assert run.series("conv1", kind="activation").shape == (len(steps), 64, 10, 24, 24)
    assert run.series("fc2", kind="activation").shape == (len(steps), 64, 10)
    # Tapped keeps parameter names.
    assert run.names("grad") == ["conv1.bias", "conv1.weight", "conv2.bias", "conv2.weight", "fc1.bias",
                                 "fc1.weight", "fc2.bias", "fc2.weight"], run.names("grad")
    loss = run.series("loss", kind="tensor")
    assert loss[-1] < loss[0], loss


if __name__ == "__main__":
    check_gan(sys.argv[1])
    check_mnist(sys.argv[2])
    print("examples: GAN and MNIST-style runs check out")
