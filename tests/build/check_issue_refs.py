#!/usr/bin/env python3
"""Comments and docs that stand on their own (ctest build.issue_refs).

A clone has no issue tracker and no DESIGN.md: a comment that says "issue 57",
"round 5" or "DESIGN section 10" sends a newcomer nowhere. This fails on
every line of the library, the reader, the docs, the examples, the scripts
and the build that matches

    \\bissues? [0-9]+ | \\b[Rr]ound [0-9]+ | DESIGN

except a link to docs/design.md (the project's own contract page, whose
sections replace DESIGN's) and another project's issue written as
`<project> issue N` (e.g. "pytorch issue 25888").

    check_issue_refs.py ROOT
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

PATHS = ("sdk", "hooks", "writers", "python", "docs", "examples", "scripts", "cmake", "CMakeLists.txt",
         "README.md", "ARCHITECTURE.md")


PATTERN = re.compile(r"\bissues? [0-9]+|\b[Rr]ound [0-9]+|DESIGN")
# Other projects, whose issue numbers are theirs to keep.
PROJECTS = {"pytorch", "libtorch", "torch", "numpy", "h5py", "hdf5", "cmake", "fmt", "protobuf", "tensorboard",
            "catch2", "gcc", "clang", "llvm", "cpython", "python", "pandas", "dask", "xarray", "smdebug", "debian",
            "nvidia", "cuda", "pip", "setuptools", "mypy", "ninja", "ccache", "valgrind", "glibc"}
SKIP_PARTS = {"__pycache__", "build", ".git"}


def files(root: Path) -> Iterator[Path]:
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", *PATHS], capture_output=True,
                             check=True).stdout
        for name in out.decode("utf-8", "replace").split("\0"):
            if name and (root / name).is_file():
                yield root / name
        return
    except (OSError, subprocess.CalledProcessError):
        pass
    for p in PATHS:  # not a clone (a source archive): walk the folders
        base = root / p
        if base.is_file():
            yield base
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d not in SKIP_PARTS and not d.endswith(".egg-info")]
            for f in filenames:
                yield Path(dirpath) / f


def allowed(line: str, m: "re.Match[str]") -> bool:
    if m.group(0) == "DESIGN":
        return bool(re.search(r"design\.md(?:#[\w-]+)?\)", line))
    if m.group(0).lower().startswith("issue"):
        before = re.search(r"([A-Za-z][\w.+-]*)\s+$", line[: m.start()])
        return bool(before and before.group(1).lower() in PROJECTS)
    return False


def hits(root: Path) -> List[Tuple[str, int, str]]:
    out: List[Tuple[str, int, str]] = []
    for path in files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (pictures)
        rel = str(path.relative_to(root))
        for n, line in enumerate(text.split("\n"), 1):
            for m in PATTERN.finditer(line):
                if not allowed(line, m):
                    out.append((rel, n, line.strip()))
                    break
    return out


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    root = Path(argv[1]).resolve()
    found = hits(root)
    failing = found
    for rel, n, line in failing:
        print(f"{rel}:{n}: {line[:160]}")
    if failing:
        print(f"{len(failing)} line(s) send a reader to an issue, a round or DESIGN: say the reason instead, "
              "or link docs/design.md")
        return 1
    print("no line sends a reader to an issue, a round or DESIGN")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
