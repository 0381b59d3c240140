"""Checks the folders' boundaries (ARCHITECTURE.md): which part may include
which. The build enforces most of it (each part compiles with an include
root holding only the folders it may use); this also covers what a compiler
cannot see: hooks/ reaching into writers/ through sdk's include root, and
public headers including a part above their own.

    python3 tests/build/check_layers.py [ROOT]
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)

# The public headers of each part, by the folder that owns them.
# As included: "tap.h", "detail/tapped_base.h" (a header's implementation
# templates, LibTorch's habit).
PUBLIC = {part: {p.relative_to(ROOT / part / "include" / "tensortap").as_posix()
                 for p in (ROOT / part / "include" / "tensortap").rglob("*.h")}
          for part in ("writers", "sdk", "hooks")}
# What each part may use: its own folder and the parts below it. hooks/
# uses sdk's interface; of the internals below it, hooks/ may include only
# the front end (sdk/src/front/front_end.h, which keeps the pipeline's headers to
# itself), writers' check.h (how every part throws) and run_records.h (a
# run read back: load_params puts a run's records into a module).
MAY_USE = {"writers": ("writers",), "sdk": ("writers", "sdk"), "hooks": ("sdk", "hooks")}
HOOKS_MAY_ALSO = {"writers/src/check.h", "writers/src/run_records.h"}
HOOKS_MAY_USE_OF_SDK = {"sdk/src/front/front_end.h"}
# What sdk/src/front/front_end.h may include of sdk/src: hooks/ sees these
# through it, so the pipeline (staging, the snapshotter, the writer thread,
# the run's files) stays out of hooks/.
FRONT_END_MAY_INCLUDE = {"sdk/src/select/names.h", "sdk/src/select/sampling.h", "sdk/src/core/process.h",
                         "sdk/src/run/settings.h"}


# Inside sdk/src the folders are floors too (ARCHITECTURE.md): a file may
# include its own folder and the floors below. The ground, core/, holds
# what every floor shares (records, staging, statistics, patterns); sinks/
# where records and the run's facts end up (the store and its budget,
# TensorBoard, run.json, the option table); select/, cuda/ and flight/ are
# peers on one floor and include none of each other; run/ holds the
# settings; back/ the writer's half, front/ the training thread's;
# recorder.cpp, the facade, sits on top.
SDK_FLOORS = {"core": 0, "sinks": 1, "select": 2, "cuda": 2, "flight": 2, "run": 3, "back": 4, "front": 5}
SDK_TOP = {"sdk/src/recorder.cpp": 6}


def sdk_floor(rel):
    """(folder, floor) of a file of sdk/src, or None for one outside it."""
    parts = rel.split("/")
    if parts[:2] != ["sdk", "src"]:
        return None
    if len(parts) == 3:
        return (parts[2], SDK_TOP.get(rel))
    return (parts[2], SDK_FLOORS.get(parts[2]))


def sdk_problems(root):
    for path in sorted((root / "sdk" / "src").rglob("*")):
        if path.suffix not in (".h", ".cpp", ".cu"):
            continue
        rel = path.relative_to(root).as_posix()
        folder, floor = sdk_floor(rel)
        if floor is None:
            yield f"{rel}: not on a floor of sdk/src ({', '.join(SDK_FLOORS)}, or recorder.cpp on top)"
            continue
        for kind, name in INCLUDE.findall(path.read_text()):
            # The facade sits on top: an internal header that included it
            # (for Counters, which <tensortap/counters.h> holds) is an arrow
            # back up, into every file that includes the header.
            if kind == "<" and name == "tensortap/recorder.h" and path.suffix == ".h":
                yield f"{rel}: includes <tensortap/recorder.h>, the facade above sdk/src: include what it needs of it"
            if kind != '"' or not name.startswith("sdk/src/"):
                continue
            target = sdk_floor(name)
            to_folder, to_floor = target
            if to_folder == folder:
                continue
            if to_floor is None or to_floor >= floor:
                why = "a peer" if to_floor == floor else "a floor above"
                yield (f"{rel}: includes \"{name}\", {why}: in sdk/src core < sinks < select, cuda, flight < run "
                       "< back < front < recorder.cpp, and the peers do not include each other")


def problems(root=ROOT):
    yield from sdk_problems(root)
    if not all(PUBLIC.values()):
        yield f"no public headers found under {ROOT}: wrong root?"
    for part, allowed in MAY_USE.items():
        public_ok = set().union(*(PUBLIC[p] for p in allowed))
        if part == "hooks":
            public_ok |= PUBLIC["writers"]  # sdk's public headers include them
        files = [p for p in (ROOT / part).rglob("*") if p.suffix in (".h", ".cpp")]
        if not files:
            yield f"{part}/ has no sources"
        for path in files:
            rel = path.relative_to(ROOT).as_posix()
            for kind, name in INCLUDE.findall(path.read_text()):
                if kind == '"':
                    owner = name.split("/", 1)[0]
                    if owner in MAY_USE and owner not in allowed and name not in (
                            HOOKS_MAY_ALSO if part == "hooks" else ()):
                        yield f"{rel}: includes \"{name}\": {part}/ may use only {', '.join(allowed)}"
                    elif part == "hooks" and name.startswith("sdk/src/") and name not in HOOKS_MAY_USE_OF_SDK:
                        yield (f"{rel}: includes \"{name}\": hooks/ may include only "
                               f"{', '.join(sorted(HOOKS_MAY_USE_OF_SDK))} of sdk/src")
                    elif rel == "sdk/src/front/front_end.h" and name.startswith("sdk/src/") and \
                            name not in FRONT_END_MAY_INCLUDE:
                        yield (f"{rel}: includes \"{name}\": the front end may include only "
                               f"{', '.join(sorted(FRONT_END_MAY_INCLUDE))} of sdk/src (hooks/ sees them)")
                elif name.startswith("tensortap/") and name[len("tensortap/"):] not in public_ok:
                    yield f"{rel}: includes <{name}>, a public header of a part {part}/ may not use"


# The reader (python/tensortap) in floors too (ARCHITECTURE.md). The face,
# __init__ (the public names), __main__ (the command), torch.py
# (tensortap.torch) and the stubs left at old public-looking paths, may
# import anything. The core, every other top-level module, imports no
# feature folder at module level (a call may import one: Run.to_xarray()
# imports _views.frames when called), so `import tensortap` costs only the
# reader. A feature folder uses the core and the folders it names here; the
# pages come last: only __main__ (and their old paths' stubs) import them.
PY_FACE = {"__init__", "__main__", "torch"}
PY_STUBS = {"report": "_pages", "diff_page": "_pages", "summary": "_views", "frames": "_views"}
PY_FEATURES = {"_ctl": set(), "_diff": set(), "_doctor": set(), "_tensorboard": set(), "_twin": set(),
               "_views": {"_doctor", "_ctl"}, "_pages": {"_doctor", "_ctl", "_diff", "_views"}}


def python_modules(package):
    """{dotted name inside the package: (path, is a package's __init__)}."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(package).with_suffix("").parts
        if rel[-1] == "__init__" and len(rel) > 1:
            found[".".join(rel[:-1])] = (path, True)
        else:
            found[".".join(rel)] = (path, False)
    return found


def python_imports(package, modules, name):
    """(target module, at module level) for each relative import of `name`,
    without those under `if TYPE_CHECKING:` (never run)."""
    import ast
    path, is_package = modules[name]
    tree = ast.parse(path.read_text())
    skip, lazy = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lazy.update(id(n) for n in ast.walk(node))
    # The package a relative import starts from: a module's own, or a
    # package's own name for its __init__.
    here = name.split(".") if is_package else name.split(".")[:-1]
    if name == "__init__":
        here = []
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
        stem = base + (node.module.split(".") if node.module else [])
        # `from .pkg import mod` imports pkg.mod (and pkg on the way): one edge, to pkg.mod.
        targets = [".".join(stem + [a.name]) for a in node.names if ".".join(stem + [a.name]) in modules]
        if not targets and node.module:
            targets = [".".join(stem)]
        for target in targets:
            if target == "":
                target = "__init__"
            elif target not in modules:
                continue  # a name from tensortap itself, or tensortap._engine (built elsewhere)
            yield target, id(node) not in lazy


def python_floor_problems(root):
    package = root / "python" / "tensortap"
    modules = python_modules(package)
    public = set()
    init = (package / "__init__.py").read_text()
    import ast
    for node in ast.walk(ast.parse(init)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            public = set(ast.literal_eval(node.value))
    for folder in sorted(p for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if folder.name in public or not folder.name.startswith("_"):
            yield (f"python/tensortap/{folder.name}/: a package would shadow tensortap.{folder.name} "
                   "or look public: a feature folder's name starts with _")
        elif folder.name not in PY_FEATURES:
            yield f"python/tensortap/{folder.name}/: not a feature folder check_layers.py knows ({', '.join(PY_FEATURES)})"
    for name in sorted(modules):
        top = name.split(".")[0]
        rel = modules[name][0].relative_to(root).as_posix()
        for target, module_level in python_imports(package, modules, name):
            to = target.split(".")[0]
            if to == top:
                continue
            if to == "_pages" and name != "__main__" and PY_STUBS.get(name) != "_pages":
                yield f"{rel}: imports {target}: nothing imports the pages but __main__"
            elif to in ("__main__",) or (to in PY_STUBS and name not in PY_FACE):
                yield f"{rel}: imports {target}: the face is imported by nobody inside the package"
            elif top in PY_FACE or top in PY_STUBS or to not in PY_FEATURES:
                continue
            elif top in PY_FEATURES:
                if to not in PY_FEATURES[top]:
                    yield (f"{rel}: imports {target}: {top}/ may use the core"
                           + (f" and {', '.join(sorted(PY_FEATURES[top]))}" if PY_FEATURES[top] else ""))
            elif module_level:
                yield f"{rel}: imports {target} at module level: the core imports a feature folder only when called"


def python_import_circles(root):
    """Circles among the reader's modules (python/tensortap), counting lazy
    imports inside functions, but not those under `if TYPE_CHECKING:`: a
    module that reaches up to one that imports it hides an order only the
    first call decides."""
    package = root / "python" / "tensortap"
    modules = python_modules(package)
    graph = {name: {t for t, _ in python_imports(package, modules, name)} - {name} for name in modules}
    found = []
    seen_circles = set()

    def visit(node, trail):
        for nxt in sorted(graph.get(node, ())):
            if nxt in trail:
                circle = trail[trail.index(nxt):]
                key = frozenset(circle)
                # __init__ imports every public module: those that import
                # names from the package itself are what __init__ is for.
                if key not in seen_circles and "__init__" not in circle:
                    seen_circles.add(key)
                    found.append("python/tensortap: import circle " + " -> ".join(circle + [nxt]))
            elif len(trail) < len(graph):
                visit(nxt, trail + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    return found


def self_test():
    """Plants includes against the floors in a copy of sdk/src (a floor
    above, the sinks from the core, a peer, the facade in an internal
    header): the check must name them, and find nothing else."""
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp)
        shutil.copytree(ROOT / "sdk" / "src", copy / "sdk" / "src")
        clean = list(sdk_problems(copy))
        planted = copy / "sdk" / "src" / "sinks" / "store.h"
        planted.write_text('#include "sdk/src/back/writer_thread.h"\n' + planted.read_text())
        ground = copy / "sdk" / "src" / "core" / "staging.h"
        ground.write_text('#include "sdk/src/sinks/budget.h"\n' + ground.read_text())
        peer = copy / "sdk" / "src" / "cuda" / "ring.h"
        peer.write_text('#include "sdk/src/flight/ring.h"\n' + peer.read_text())
        facade = copy / "sdk" / "src" / "back" / "control.h"
        facade.write_text("#include <tensortap/recorder.h>\n" + facade.read_text())
        found = list(sdk_problems(copy))
    expected = ["sdk/src/back/control.h: includes <tensortap/recorder.h>, the facade",
                "sdk/src/core/staging.h: includes \"sdk/src/sinks/budget.h\", a floor above",
                "sdk/src/cuda/ring.h: includes \"sdk/src/flight/ring.h\", a peer",
                "sdk/src/sinks/store.h: includes \"sdk/src/back/writer_thread.h\", a floor above"]
    missing = [e for e in expected if not any(f.startswith(e) for f in found)]
    if clean or missing or len(found) != len(expected):
        return [f"self-test: the floors check missed {missing} or found more: {found} (clean copy: {clean})"]
    return python_self_test()


def python_self_test():
    """Plants imports against the Python floors in a copy of the package:
    the core importing a feature folder at module level (and one that does
    so in a function, allowed), a feature folder importing the pages, and a
    package named as a public function. The check must name the three and
    nothing else."""
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp)
        package = copy / "python" / "tensortap"
        shutil.copytree(ROOT / "python" / "tensortap", package, ignore=shutil.ignore_patterns("__pycache__"))
        clean = list(python_floor_problems(copy))
        core = package / "_names.py"
        core.write_text(core.read_text() + "\nfrom ._diff import text\n\n\ndef _later():\n"
                        "    from ._doctor import rows  # noqa: F401\n")
        rows = package / "_doctor" / "rows.py"
        rows.write_text("from .._pages import frame  # noqa: F401\n" + rows.read_text())
        (package / "_doctor").rename(package / "doctor")
        found = list(python_floor_problems(copy))
    expected = ["python/tensortap/_names.py: imports _diff.text at module level",
                "python/tensortap/doctor/: a package would shadow tensortap.doctor",
                "python/tensortap/doctor/rows.py: imports _pages.frame: nothing imports the pages but __main__"]
    missing = [e for e in expected if not any(f.startswith(e) for f in found)]
    if clean or missing or len(found) != len(expected):
        return [f"self-test: the Python floors check missed {missing} or found more: {found} (clean copy: {clean})"]
    return []


if __name__ == "__main__":
    found = list(problems()) + self_test() + list(python_floor_problems(ROOT)) + python_import_circles(ROOT)
    for p in found:
        print(p)
    print(f"check_layers: {len(found)} problem(s)")
    sys.exit(1 if found else 0)
