"""A recorder held in a global closes its run whole at exit (issue 57).

    check_static_recorder.py PROGRAM WORKDIR

Runs tests/programs/static_recorder.cpp, which leaves main without close(),
by returning and by std::exit (the global's destructor closes the run), and
by std::quick_exit (no destructor runs: the run is left as after SIGKILL,
readable and not closed), twice each: the defect was a read of freed memory,
which did not abort every time.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np

import tensortap
from tensortap._views.summary import check

STEPS = 20


def run(program, how, path):
    shutil.rmtree(path, ignore_errors=True)
    p = subprocess.run([program, how, path], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"{how}: exit status {p.returncode} (a negative one is a signal)\n{p.stderr}"
    assert p.stdout == "trained\n", p.stdout
    assert "error" not in p.stderr, p.stderr
    return p


def check_closed(path, how):
    with open(os.path.join(path, "run.json")) as f:
        info = json.load(f)
    assert info.get("closed") is True, f"{how}: run.json was not closed"
    assert info["errors"] == 0, info
    r = tensortap.open(path)
    assert len(r.records) == info["records"]
    # Every step's statistics rows, the last step's included: 4 parameters'
    # grads, 4 params, the loss; each a row a step.
    table, series = r.stats_table()
    steps = np.unique(table["step"])
    assert steps.tolist() == list(range(STEPS)), f"{how}: statistics of steps {steps.tolist()}"
    per_step = np.bincount(table["step"])
    assert (per_step == per_step[0]).all() and per_step[0] >= 9, f"{how}: rows a step {per_step.tolist()}"
    events = [f for f in os.listdir(path) if f.startswith("events.out.tfevents.")]
    assert len(events) <= 1
    for e in events:
        assert os.path.getsize(os.path.join(path, e)) > 0
    assert check(r, out=open(os.devnull, "w")) == 0
    r.close()


def check_killed(path):
    # Left as after SIGKILL: not closed, every indexed record readable.
    with open(os.path.join(path, "run.json")) as f:
        info = json.load(f)
    assert not info.get("closed"), "quick_exit closed the run"
    r = tensortap.open(path)
    assert check(r, out=open(os.devnull, "w")) == 0
    r.close()


def main():
    program, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    for trial in range(2):
        for how in ("return", "exit"):
            path = os.path.join(work, how)
            run(program, how, path)
            check_closed(path, how)
        path = os.path.join(work, "quick_exit")
        run(program, "quick_exit", path)
        check_killed(path)
    print("a recorder in a global closed its run whole at return and exit; quick_exit left it readable")


if __name__ == "__main__":
    main()
