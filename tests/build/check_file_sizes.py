"""No source file of the library is over 450 lines (issue 63): a reader
should find one concern a file, and later work keeps it so.

    check_file_sizes.py ROOT

Every .h, .cpp and .cu under sdk/, hooks/ and writers/ (generated code is
in the build tree, not here). Exit 1 naming each file over the limit.
"""

import os
import sys

LIMIT = 450
PARTS = ("sdk", "hooks", "writers")
SUFFIXES = (".h", ".cpp", ".cu", ".cuh")


def main():
    root = sys.argv[1]
    over = []
    counted = 0
    for part in PARTS:
        for folder, _, files in os.walk(os.path.join(root, part)):
            for name in files:
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    lines = f.read().count(b"\n")
                counted += 1
                if lines > LIMIT:
                    over.append((lines, os.path.relpath(path, root)))
    for lines, path in sorted(over, reverse=True):
        print(f"{path}: {lines} lines, over {LIMIT}: split it where it holds two things")
    print(f"file sizes: {counted} files, {len(over)} over {LIMIT} lines")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
