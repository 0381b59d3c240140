"""Checks the runs of examples/train_ddp with the reader's rank merge.

    check_ddp.py ALL_RANKS_DIR RANK0_ONLY_DIR
"""

import json
import os
import sys

import numpy as np

import tensortap


def check_all(path):
    run = tensortap.open(path)
    assert run.ranks == [0, 1], run.ranks
    assert run.closed
    for r in (0, 1):
        with open(os.path.join(path, f"rank{r}", "run.json")) as f:
            info = json.load(f)
        assert info["rank"] == r and info["world_size"] == 2, info
    names = run.names("grad")
    assert "fc1.weight" in names, names
    for name in names:
        local = run.series(name, kind="grad")                    # [rank, step, ...]: each rank's own
        reduced = run.series("allreduced." + name, kind="tensor")  # [rank, step, ...]: after allreduce
        assert local.shape[:2] == (2, 4), local.shape
        # After the allreduce both ranks hold the same gradient, bit for bit...
        np.testing.assert_array_equal(reduced[0], reduced[1], err_msg=name)
        # ... which is the mean of what each rank computed.
        np.testing.assert_allclose(local.mean(axis=0), reduced[0], rtol=1e-5, atol=1e-7, err_msg=name)
        assert not np.array_equal(local[0], local[1]), f"{name}: ranks saw the same data"
    one = run.series("fc1.weight", kind="grad", rank=1)
    np.testing.assert_array_equal(one, run.series("fc1.weight", kind="grad")[1])
    print(f"ddp: {len(run.records)} records over ranks {run.ranks}; allreduced gradients equal, "
          f"and equal to the mean of the ranks' own")


def check_rank0_only(path):
    assert sorted(os.listdir(path)) == ["rank0"], os.listdir(path)
    run = tensortap.open(path)
    assert run.ranks == [0]
    assert run.series("fc1.weight", kind="grad").shape[0] == 1
    print("ddp: capture on rank 0 only wrote rank0/ alone")


if __name__ == "__main__":
    check_all(sys.argv[1])
    check_rank0_only(sys.argv[2])
