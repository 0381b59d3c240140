"""examples/port_check (issue 45): the C++ port agrees with its Python
original, and each deliberate port bug is named at its layer, at step 0.

    check_port_check.py PORT_CHECK WORK     (with a Python that has torch)

The three checks run in this process (check.main), so torch is imported once.
"""

import contextlib
import io
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "port_check"))

import check as port  # noqa: E402


def check(program, work, bug, status, first):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = port.main([program, os.path.join(work, bug or "faithful")] + (["--bug", bug] if bug else []))
    text = out.getvalue()
    print(text)
    assert rc == status, (bug, rc, text)
    lines = [x for x in text.splitlines() if not x.startswith("port_check:")]
    if first is None:
        assert "first divergence" not in text, text
        assert lines[-1].endswith("differ 0, only in A 0, only in B 0"), lines[-1]
    else:
        assert lines[1].startswith(f"first divergence: {first} step 0: "), lines[1]


def main():
    program, work = sys.argv[1:3]
    check(program, work, None, 0, None)
    check(program, work, "gelu-tanh", 1, "activation act")
    check(program, work, "layernorm-eps", 1, "activation norm")
    print("port_check: the faithful port agrees; both port bugs are named at their layer, at step 0")


if __name__ == "__main__":
    main()
