"""No function of the library is over 80 lines: one a reader can hold, and
later work keeps it so (check_file_sizes.py holds the files).

    check_function_sizes.py ROOT
    check_function_sizes.py --self-test

Python: every def under python/tensortap, measured by ast from its `def`
line to its last (end_lineno - lineno + 1; decorators not counted, a nested
function counted in its own right and inside its parent). Exit 1 naming
each function over the limit. --self-test plants an over-long function and
a short one in a scratch tree and exits 1 unless the check names exactly
the long one.
"""

import ast
import os
import sys
import tempfile

LIMIT = 80
PYTHON = ("python", "tensortap")

# Over the limit and to be split; a function listed here that fits fails the
# check too, so the list only shrinks.
WAITING = {
}


def python_functions(root):
    """(path, qualified name, lines) for every def under python/tensortap."""
    top = os.path.join(root, *PYTHON)
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            yield from _defs(tree, os.path.relpath(path, root), "")


def _defs(node, path, prefix):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + child.name
            yield path, name, child.end_lineno - child.lineno + 1
            yield from _defs(child, path, name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _defs(child, path, prefix + child.name + ".")
        else:
            yield from _defs(child, path, prefix)


def check(root):
    over = []
    counted = 0
    for path, name, lines in python_functions(root):
        counted += 1
        waiting = (path.replace(os.sep, "/"), name) in WAITING
        if lines > LIMIT and not waiting:
            over.append((lines, path, name))
        elif waiting and lines <= LIMIT:
            over.append((lines, path, name + " (listed in WAITING but fits: take it off the list)"))
    for lines, path, name in sorted(over, reverse=True):
        print(f"{path}: {name}() is {lines} lines, over {LIMIT}: split it where it does two things")
    print(f"function sizes: {counted} functions, {len(over)} over {LIMIT} lines")
    return over


def self_test():
    with tempfile.TemporaryDirectory() as root:
        folder = os.path.join(root, *PYTHON, "_planted")
        os.makedirs(folder)
        body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT))  # LIMIT + 1 lines with the def
        with open(os.path.join(folder, "long.py"), "w") as f:
            f.write("class C:\n    def fits(self):\n        return 1\n\n\n"
                    f"def too_long():\n{body}\n\ndef just_fits():\n" + body[:-len(f"    x{LIMIT - 1} = {LIMIT - 1}\n")])
        over = check(root)
        names = [name for _, _, name in over]
        if names != ["too_long"]:
            print(f"self-test FAILED: a planted function of {LIMIT + 1} lines gave {names}, not ['too_long']")
            return 1
    print("self-test: the planted over-long function is named, the one at the limit is not")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    return 1 if check(sys.argv[1]) else 0


if __name__ == "__main__":
    sys.exit(main())
