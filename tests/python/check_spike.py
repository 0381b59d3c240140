"""Checks the run examples/train_spike made: the spike rule fired once, at the
first corrupted batch, the flight recorder wrote the 20 steps before it and
that step, and run.json says which rule fired with what value.

    check_spike.py RUN BAD_STEP
"""

import sys

import numpy as np

from run_dump import the_dump


def main(path, bad_step):
    run, dump = the_dump(path)
    assert dump["step"] == bad_step, dump
    assert dump["reason"] == "spike" and dump["trigger"] == {"kind": "spike", "factor": 5, "window": 50}, dump
    assert (dump["kind"], dump["name"]) == ("tensor", "loss"), dump
    assert dump["steps"] == list(range(bad_step - 20, bad_step + 1)), dump
    # The value and median it reports are the statistics table's.
    loss = run.stats("loss", kind="tensor")
    i = list(loss["step"]).index(bad_step)
    assert np.isclose(dump["value"], loss["mean"][i]), (dump, loss["mean"][i])
    assert np.isclose(dump["median"], np.median(np.abs(loss["mean"][i - 50:i]))), dump
    assert dump["value"] > 5 * dump["median"]
    # Nothing before was a spike, and the loss recovered afterwards.
    for j in range(50, i):
        assert abs(loss["mean"][j]) <= 5 * np.median(np.abs(loss["mean"][j - 50:j]))
    assert loss["mean"][-1] < 5 * dump["median"]
    # The dumped steps are on disk, full tensors of every gradient.
    assert sorted({r["step"] for r in run.records}) == dump["steps"]
    assert run.series("fc1.weight", kind="grad").shape[0] == 21
    print(f"spike: caught at step {bad_step}, {dump['value']:.3g} against a median of {dump['median']:.3g}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
