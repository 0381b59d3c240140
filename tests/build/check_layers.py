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
PUBLIC = {part: {p.name for p in (ROOT / part / "include" / "tensortap").glob("*.h")}
          for part in ("writers", "sdk", "hooks")}
# What each part may use: its own folder and the parts below it. hooks/
# uses sdk's interface; of the internals below it, hooks/ may include only
# the front end (sdk/src/front_end.h, which keeps the pipeline's headers to
# itself) and writers' check.h (how every part throws).
MAY_USE = {"writers": ("writers",), "sdk": ("writers", "sdk"), "hooks": ("sdk", "hooks")}
HOOKS_MAY_ALSO = {"writers/src/check.h"}
HOOKS_MAY_USE_OF_SDK = {"sdk/src/front_end.h"}
# What sdk/src/front_end.h may include of sdk/src: hooks/ sees these
# through it, so the pipeline (staging, the snapshotter, the writer thread,
# the run's files) stays out of hooks/.
FRONT_END_MAY_INCLUDE = {"sdk/src/select/names.h", "sdk/src/select/sampling.h", "sdk/src/run/process.h",
                         "sdk/src/run/settings.h"}


def problems():
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
                    elif rel == "sdk/src/front_end.h" and name.startswith("sdk/src/") and \
                            name not in FRONT_END_MAY_INCLUDE:
                        yield (f"{rel}: includes \"{name}\": the front end may include only "
                               f"{', '.join(sorted(FRONT_END_MAY_INCLUDE))} of sdk/src (hooks/ sees them)")
                elif name.startswith("tensortap/") and name[len("tensortap/"):] not in public_ok:
                    yield f"{rel}: includes <{name}>, a public header of a part {part}/ may not use"


if __name__ == "__main__":
    found = list(problems())
    for p in found:
        print(p)
    print(f"check_layers: {len(found)} problem(s)")
    sys.exit(1 if found else 0)
