"""Budget::KeepLatest while the reader reads (issue 59): a real C++ job
(examples/train_mlp, every step captured through TENSORTAP_OPTIONS, into a
budget ten times too small) gives up its oldest steps while this script
opens the run again and again and reads every record it lists. Each read
either returns the record's array or raises GivenUpError (given up since
the Run was opened); nothing else. After the job: the directory within the
budget's bound, `inspect --check` without a problem, the steps kept whole
and contiguous up to the last, in .npy and packed.

    check_keep_latest_live.py TRAIN_MLP OUT
"""

import contextlib
import io
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np

import tensortap
from tensortap import __main__ as cli

BUDGET = 1 << 20
STEPS = 300


def du_sb(path):
    total = os.lstat(path).st_size
    for d, dirs, files in os.walk(path):
        for n in dirs + files:
            total += os.lstat(os.path.join(d, n)).st_size
    return total


def read_while_running(run_dir, job):
    """Opens and reads the run until the job ends: (records read, given up since opened)."""
    read = given_up = 0
    while job.poll() is None:
        if not os.path.exists(os.path.join(run_dir, "run.json")):
            continue
        with warnings.catch_warnings():
            # A torn last index line of a running job is no record, said quietly.
            warnings.simplefilter("ignore")
            run = tensortap.open(run_dir)
            for rec in list(run.records):
                try:
                    a = run._read(rec, mmap=False)
                except tensortap.GivenUpError as e:
                    assert e.step == rec["step"] and e.given_up_below > rec["step"], (e, rec)
                    given_up += 1
                    continue
                assert list(a.shape) == rec["shape"], (rec, a.shape)
                read += 1
    return read, given_up


def check(train_mlp, out, fmt):
    run_dir = os.path.join(out, fmt)
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ, TENSORTAP_OPTIONS=(f"every=1,kinds=grad+activation+tensor,format={fmt},"
                                              f"max_bytes={BUDGET},on_budget=keep_latest"))
    job = subprocess.Popen([train_mlp, run_dir, str(STEPS), "10"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    read, given_up = read_while_running(run_dir, job)
    err = job.stderr.read()
    assert job.wait() == 0, err
    assert "the oldest steps are given up to make room (Budget::KeepLatest" in err, err
    print(f"{fmt}: while the job ran, {read} records read, {given_up} given up since their Run was opened")
    assert read > 0

    run = tensortap.open(run_dir)
    k = run.given_up_below[None]
    assert 0 < k < STEPS - 1, k
    # Every step from the marker on, whole: 9 records a step (6 grads, 2
    # activations, the loss), the last step among them.
    steps = sorted({r["step"] for r in run.records})
    assert steps == list(range(k, STEPS)), (k, steps[:5], steps[-5:])
    assert len(run.records) == 9 * len(steps), len(run.records)
    loss = run.series("loss", kind="tensor")
    assert loss.shape == (len(steps),) and np.isfinite(loss).all()
    # The bound: the budget, 5%, the largest step (about 100 KiB), packed's one segment.
    size = du_sb(run_dir)
    assert size <= BUDGET + BUDGET // 20 + (128 << 10) + BUDGET // 8, size
    out_text, err_text = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out_text), contextlib.redirect_stderr(err_text):
        status = cli.main(["inspect", "--check", run_dir])
    text = out_text.getvalue()
    assert status == 0, text + err_text.getvalue()
    assert f"steps below {k} given up" in text, text
    assert "0 problems" in text, text
    print(f"{fmt}: {size} bytes on disk (budget {BUDGET}), steps {k}..{STEPS - 1} kept, inspect --check clean")


def main():
    train_mlp, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for fmt in ("npy", "packed"):
        check(train_mlp, out, fmt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
