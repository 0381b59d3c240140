#!/usr/bin/env python3
"""README's install line for the reader, run as written (ctest python.install).

README.md's "Reading a run in NumPy" gives one line that makes a virtual
environment `~/tt` with a named interpreter and installs `./python` into it.
This runs that line as it stands, through `sh`, with HOME a fresh folder (so
`~/tt` is made there) and the working directory holding a copy of python/
(pip writes build files beside the sources), without the network. Then the
environment's `tensortap` command runs, the package imports from the
environment (not the source tree) and says the library's version.

It is skipped (exit 77) with the reason where the interpreter the line names,
or a Debian package the sentence before it names, is absent: the line is
meant for a machine that has them, and says so.

    check_python_install.py SOURCE_DIR WORK_DIR VERSION
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

SKIP = 77


def readme_line(readme: Path) -> Tuple[str, List[str]]:
    """The install line and the Debian packages its paragraph names."""
    lines = readme.read_text(encoding="utf-8").split("\n")
    for i, ln in enumerate(lines):
        if re.search(r"\bpython[\w.]* -m venv\b.*\bpip install\b", ln):
            para: List[str] = []
            j = i - 2  # the fence is the line before, then blank lines
            while j >= 0 and not lines[j].strip():
                j -= 1
            while j >= 0 and lines[j].strip():
                para.insert(0, lines[j])
                j -= 1
            return ln.strip(), sorted(set(re.findall(r"`(python3-[\w.+-]+)`", " ".join(para))))
    raise SystemExit("FAIL: README.md has no line with 'python3 -m venv ... pip install'")


def installed(package: str) -> bool:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip().endswith("installed") and "not-installed" not in r.stdout


def main(argv: List[str]) -> int:
    if len(argv) != 4:
        print(__doc__)
        return 2
    src, work, want = Path(argv[1]), Path(argv[2]), argv[3]
    line, packages = readme_line(src / "README.md")
    print(f"README's line: {line}")
    interpreter = line.split()[0]
    if "/" in interpreter and not os.access(interpreter, os.X_OK):
        print(f"skipped: the line names {interpreter}, which this machine does not have")
        return SKIP
    if not packages:
        print("FAIL: the sentence before README's install line names no Debian package it needs")
        return 1
    if shutil.which("dpkg-query") is None:
        print(f"skipped: no dpkg-query to tell whether {', '.join(packages)} are installed (not Debian)")
        return SKIP
    missing = [p for p in packages if not installed(p)]
    if missing:
        print(f"skipped: the line needs Debian's {', '.join(missing)}, not installed here")
        return SKIP
    shutil.rmtree(work, ignore_errors=True)
    (work / "home").mkdir(parents=True)
    shutil.copytree(src / "python", work / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HOME=str(work / "home"), PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    r = subprocess.run(["sh", "-c", line], cwd=work, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        print(f"FAIL: README's install line exited {r.returncode}")
        return 1
    venv = work / "home" / "tt"
    r = subprocess.run([str(venv / "bin" / "tensortap"), "--help"], cwd=work, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr[-2000:])
        print("FAIL: the environment's tensortap --help failed")
        return 1
    probe = ("import os, sys, tensortap\n"
             "where = os.path.realpath(tensortap.__file__)\n"
             "assert where.startswith(os.path.realpath(sys.prefix)), where\n"
             "print(tensortap.__version__)")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=work, env=env, capture_output=True, text=True)
    got = r.stdout.strip()
    if r.returncode != 0 or got != want:
        print(r.stderr[-2000:])
        print(f"FAIL: the installed reader says version {got!r}, the library {want}")
        return 1
    print(f"OK: tensortap {got} installed by README's line as written (needs {', '.join(packages)}); its command runs")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
