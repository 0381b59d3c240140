"""Checks the run examples/train_blowup made: the flight recorder dumped exactly
the k steps before the first non-finite value and that step, full capture
stopped after it, and statistics went on to the end.

    check_flight.py RUN K
"""

import sys

import numpy as np

from run_dump import the_dump


def main(path, k):
    run, dump = the_dump(path)
    trigger = dump["step"]
    assert dump["reason"] in ("nan", "inf"), dump
    assert dump["steps"] == list(range(trigger - k, trigger + 1)), dump
    # Nothing but the dumped steps was written (StopCapture is the default).
    assert sorted({r["step"] for r in run.records}) == dump["steps"]
    # Every tensor of every dumped step, parameters included.
    for s in dump["steps"]:
        assert {(r["kind"], r["name"]) for r in run.records if r["step"] == s} >= {("param", "fc1.weight"),
                                                                               ("grad", "fc1.weight"),
                                                                               ("activation", "hidden1")}
    # The statistics say the trigger was the first non-finite value, and
    # they went on after full capture stopped.
    table, series = run.stats_table()
    bad = table[(table["nan"] + table["posinf"] + table["neginf"]) > 0]
    assert bad["step"].min() == trigger, (bad["step"].min(), trigger)
    assert table["step"].max() > trigger
    st = run.stats(dump["name"], kind=dump["kind"])
    i = list(st["step"]).index(trigger)
    assert st["nan"][i] + st["posinf"][i] + st["neginf"][i] > 0
    # The dumped tensors agree with the statistics taken of them.
    g = run.load("fc1.weight", trigger - 1, kind="grad").astype(np.float64)
    gs = run.stats("fc1.weight", kind="grad")
    j = list(gs["step"]).index(trigger - 1)
    np.testing.assert_allclose(gs["norm"][j], np.linalg.norm(g[np.isfinite(g)]), rtol=1e-10)
    print(f"{path}: dump at step {trigger} ({dump['reason']} in {dump['kind']} {dump['name']}) "
          f"holds steps {dump['steps'][0]}..{dump['steps'][-1]}; {len(table)} statistics rows")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
