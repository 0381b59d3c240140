"""examples/port_check (issues 45 and 54): the faithful C++ port of an AdamW
model agrees with its Python original against two noise floors, and each
planted port bug is named at the right record and step, with the right
clause ("arises in the forward...", "in the backward", "in the loss", "in
the update", "in a captured tensor", "in a buffer").

    check_port_check.py PORT_CHECK WORK [--report]     (with a Python that has torch)

Everything runs in this process (check.main), so torch is imported once; the
Python runs (A and its two floors) are made once and shared by every port.
With --report (another LibTorch version than the Python's: Debian's 1.13
against the wheel's 2.x), only the faithful port runs, and its result is
printed, not asserted: tests/README.md reports it.
"""

import contextlib
import io
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "port_check"))

import check as port  # noqa: E402

# Each bug: the first divergence's kind and name (a regular expression),
# its step, and the clause its line gives.
EXPECTED = {
    "layernorm-eps": (r"activation ln1", 0, "in the forward between"),
    "detach-residual": (r"(activation_grad|grad) \S+", 0, "in the backward between"),
    "loss-sum": (r"tensor loss", 0, "in the loss"),
    "adamw-decay": (r"param \S+", 1, "in the update between steps 0 and 1"),
    "schedule": (r"tensor lr", 0, "in a captured tensor lr"),
    "bn-momentum": (r"buffer bn\.running_(mean|var)", 1, "in a buffer: bn.running_(mean|var) between steps 0 and 1"),
}


def run(program, work, bug, reuse):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = port.main([program, work] + (["--bug", bug] if bug else []) + (["--reuse"] if reuse else []))
    text = out.getvalue()
    print(text)
    return rc, text


def main():
    program, work = sys.argv[1:3]
    report = "--report" in sys.argv[3:]
    rc, text = run(program, work, None, reuse=False)
    if report:
        print(f"port_check (another LibTorch than the Python's): the faithful port's diffs exit {rc}")
        return
    assert rc == 0, f"the faithful port against its floors: exit {rc}\n{text}"
    assert "first divergence" not in text, text
    lasts = [line for line in text.splitlines() if line.startswith("compared ")]
    assert len(lasts) == 2 and all(re.search(r"differ \d+, noise \d+, only in A 0, only in B 0$", x) for x in lasts), lasts
    for bug, (record, step, clause) in EXPECTED.items():
        rc, text = run(program, work, bug, reuse=True)
        assert rc == 1, (bug, rc, text)
        firsts = [line for line in text.splitlines() if line.startswith("first divergence:")]
        assert len(firsts) == 2, (bug, text)
        for line in firsts:
            want = rf"^first divergence: {record} step {step}: arises {clause}"
            assert re.match(want, line), f"{bug}: {line!r} does not match {want!r}"
    print("port_check: the faithful AdamW port agrees against two floors; six port bugs are each named at their "
          "record and step, with the clause where they arise")


if __name__ == "__main__":
    main()
