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

C++: every function defined in the library (sdk/, hooks/, writers/: .h,
.cpp, .cu; not tests/ or bench/), measured by its braces: from the body's
`{` to its matching `}`, both lines counted. Comments, string and char
literals and preprocessor lines are blanked first, so a brace in them does
not count; lambdas and local classes count toward the function around them.
The self-test plants a C++ function one line over, and one that fits but has
braces in its strings, chars and comments.
"""

import ast
import os
import re
import sys
import tempfile

LIMIT = 80
PYTHON = ("python", "tensortap")

# Over the limit and to be split: (path, name) as the check prints them; a
# function listed here that fits fails the check too, so the list only
# shrinks.
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


CPP_PARTS = ("sdk", "hooks", "writers")
CPP_SUFFIXES = (".h", ".cpp", ".cu")


def cpp_functions(root):
    """(path, name, lines) for every function defined in sdk/, hooks/ and writers/."""
    for part in CPP_PARTS:
        for folder, dirs, files in os.walk(os.path.join(root, part)):
            dirs.sort()
            for name in sorted(files):
                if not name.endswith(CPP_SUFFIXES):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for fname, lines in cpp_bodies(text):
                    yield os.path.relpath(path, root), fname, lines


def blank_cpp(text):
    """The text with comments, string and char literals and preprocessor
    lines turned to spaces (newlines kept), so that braces are only code's."""
    out = list(text)
    i, n = 0, len(text)
    at_line_start = True

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if c in " \t":
            i += 1
            continue
        if at_line_start and c == "#":  # a directive, with its continuation lines
            j = i
            while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                j += 1
            blank(i, j)
            i = j
            continue
        at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == '"' and i > 0 and text[i - 1] == "R":  # R"delim( ... )delim"
            open_paren = text.find("(", i)
            close = ")" + text[i + 1:open_paren] + '"'
            j = text.find(close, open_paren)
            j = n if j < 0 else j + len(close)
            blank(i, j)
            i = j
        elif c == '"' or (c == "'" and not _digit_separator(text, i)):
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _digit_separator(text, i):
    """Whether the ' at i separates digits (100'000) rather than opening a char."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "'."):
        j -= 1
    return j < i and text[j].isdigit()


CONTAINER = re.compile(r"^(template\s*<.*>\s*)?(inline\s+)?(namespace|class|struct|union|extern)\b", re.S)
ACCESS = re.compile(r"^\s*(public|private|protected)\s*:")
NAME = re.compile(r"(operator\s*\(\s*\)|operator\s*[^\s(]+|[~\w:]+)\s*(<[^()]*>)?\s*\($")


def cpp_bodies(text):
    """(name, lines) of each function body at namespace or class scope: from
    its `{` to the matching `}`, lambdas and local classes inside counted
    with it. A brace opens a body when its head (the code since the last
    `;`, `{` or `}` of its scope) has balanced parentheses and no `=` outside
    them (or is `= [...](...)`, a lambda); a class, struct, union, namespace
    or `extern "C"` is a scope to look inside; anything else (an enum, an
    initializer, a default argument's braces) is skipped whole."""
    code = blank_cpp(text)
    stack = []  # each open brace: (kind "scope" | "body" | "skip", name, line of the `{`)
    head_start = 0
    parens = 0  # open parentheses of the head, at namespace or class scope
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
            continue
        outside = all(kind == "scope" for kind, _, _ in stack)
        if c == "{":
            if not outside or parens:
                stack.append(("skip", None, line))
                continue
            head = ACCESS.sub("", code[head_start:i]).strip()
            kind = _classify(head)
            stack.append((kind, _name(head), line))
            if kind == "scope":
                head_start = i + 1
        elif c == "}" and stack:
            kind, name, first = stack.pop()
            if not all(k == "scope" for k, _, _ in stack):
                continue
            if kind == "body":
                yield name, line - first + 1
            rest = code[i + 1:i + 200].lstrip()
            # Braces inside the head's parentheses (a default argument) or a
            # braced member initializer (`x_{a}, y_(b) {`) leave the head open.
            if not parens and rest[:1] not in (",", "{"):
                head_start, parens = i + 1, 0
        elif outside and c == "(":
            parens += 1
        elif outside and c == ")":
            parens -= 1
        elif outside and c == ";" and not parens:
            head_start = i + 1


def _classify(head):
    if CONTAINER.match(head):
        return "skip" if re.match(r"^(template\s*<.*>\s*)?enum\b", head) else "scope"
    if head.startswith("enum"):
        return "skip"
    depth, eq = 0, False
    for k, ch in enumerate(head):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "=" and depth == 0 and not re.search(r"operator\s*\S*$", head[:k + 1]):
            eq = head[k + 1:].lstrip().startswith("[")
            if not eq:
                return "skip"
    if depth != 0 or ")" not in head:
        return "skip"
    return "body"


def _name(head):
    depth = 0
    for k, ch in enumerate(head):
        if ch == "(":
            if depth == 0:
                m = NAME.search(head[:k + 1])
                return re.sub(r"\s+", "", m.group(1)) if m else "?"
            depth += 1
        elif ch == ")":
            depth -= 1
    return "?"


def check(root):
    over = []
    counted = 0
    for path, name, lines in list(python_functions(root)) + list(cpp_functions(root)):
        counted += 1
        waiting = (path.replace(os.sep, "/"), name) in WAITING
        if lines > LIMIT and not waiting:
            over.append((lines, path, name))
        elif waiting and lines <= LIMIT:
            over.append((lines, path, name))
    for lines, path, name in sorted(over, reverse=True):
        if lines <= LIMIT:
            print(f"{path}: {name}() is {lines} lines, listed in WAITING but fits: take it off the list")
        else:
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
        if _cpp_self_test(root):
            return 1
    print("self-test: the planted over-long functions (Python, C++) are named, those at the limit are not")
    return 0


def _cpp_self_test(root):
    """Plants in sdk/src/planted.cpp a C++ function of LIMIT + 1 lines from
    `{` to `}` and one of LIMIT whose strings, chars and comments hold
    unmatched braces (were they counted, its body would end early or run on
    into the next function); only the first may be named."""
    folder = os.path.join(root, "sdk", "src")
    os.makedirs(folder)
    long_body = "".join(f"  int x{i} = {i};\n" for i in range(LIMIT - 1))  # + the two brace lines
    tricky = ('  const char* s = "}}} {";  // }\n'
              "  char c = '}';\n"
              "  /* { { */ int n = 1'000;\n"
              '  const char* r = R"x(}")x";\n')
    fits_body = tricky + "".join(f"  int y{i} = {i};\n" for i in range(LIMIT - 2 - tricky.count("\n")))
    with open(os.path.join(folder, "planted.cpp"), "w") as f:
        f.write("#define OPEN {\nnamespace a {\nstruct S {\n  int member() const {\n    return 1;\n  }\n};\n"
                f"void Planted::too_long(int a, int b) {{\n{long_body}}}\n\n"
                f"int fits(const char* p = \"{{\") {{\n{fits_body}}}\n"
                "}  // namespace a\n")
    over = [name for _, path, name in check(root) if path.endswith("planted.cpp")]
    if over != ["Planted::too_long"]:
        print(f"self-test FAILED: planted C++ functions of {LIMIT + 1} and {LIMIT} lines gave {over}, "
              "not ['Planted::too_long']")
        return 1
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    return 1 if check(sys.argv[1]) else 0


if __name__ == "__main__":
    sys.exit(main())
