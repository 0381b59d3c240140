"""No source file of the library is over 450 lines (issue 63): a reader
should find one concern a file, and later work keeps it so.

    check_file_sizes.py ROOT

Every .h, .cpp and .cu under sdk/, hooks/ and writers/ (generated code is
in the build tree, not here), and every .py of the reader, python/tensortap.
Exit 1 naming each file over the limit.
"""

import os
import sys

LIMIT = 450
PARTS = (("sdk", (".h", ".cpp", ".cu", ".cuh")), ("hooks", (".h", ".cpp", ".cu", ".cuh")),
         ("writers", (".h", ".cpp", ".cu", ".cuh")), (os.path.join("python", "tensortap"), (".py",)))

# Over the limit and to be split; each line says why it waits. A file listed
# here that fits fails the check too, so the list only shrinks.
WAITING = {
}


def main():
    root = sys.argv[1]
    over = []
    counted = 0
    for part, suffixes in PARTS:
        for folder, _, files in os.walk(os.path.join(root, part)):
            for name in files:
                if not name.endswith(suffixes):
                    continue
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    lines = f.read().count(b"\n")
                counted += 1
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if rel in WAITING:
                    if lines <= LIMIT:
                        over.append((lines, rel + " (listed in WAITING but fits: take it off the list)"))
                    continue
                if lines > LIMIT:
                    over.append((lines, rel))
    for lines, path in sorted(over, reverse=True):
        print(f"{path}: {lines} lines, over {LIMIT}: split it where it holds two things")
    print(f"file sizes: {counted} files, {len(over)} over {LIMIT} lines")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
