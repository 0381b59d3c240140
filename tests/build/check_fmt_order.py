"""tensortap compiles against the fmt it links, even when torch ships fmt
headers of its own (issue 17, item 1; cmake/fmt.cmake).

    check_fmt_order.py SOURCE_DIR WORK_DIR TORCH_DIR

Plants a poisoned fmt/ (every header an #error) in a torch-like include
folder: a TorchConfig.cmake that loads the real one from TORCH_DIR, then puts
that folder first in the `torch` target's include directories, as a
PyTorch wheel's torch/include/fmt is. Configures tensortap with it (tests and
benchmarks on) and preprocesses every compile command: each must succeed,
and each fmt header it reads must be the found fmt's, through the build
tree's link. The control: one command with that link's -I taken out must
reach the poison, so the test would fail without the fix.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

POISON = "tensortap-fmt-poison: compiled against torch's fmt, not the fmt linked"


def main():
    src, work, torch_dir = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    poison = os.path.join(work, "fake_torch", "include")
    os.makedirs(os.path.join(poison, "fmt"))
    config = os.path.join(work, "fake_torch", "cmake")
    os.makedirs(config)
    with open(os.path.join(config, "TorchConfig.cmake"), "w") as f:
        f.write(f'include("{torch_dir}/TorchConfig.cmake")\n'
                "get_target_property(_inc torch INTERFACE_INCLUDE_DIRECTORIES)\n"
                f'set_target_properties(torch PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "{poison};${{_inc}}")\n')

    build = os.path.join(work, "build")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    run(["cmake", "-S", src, "-B", build, *gen, "-DCMAKE_BUILD_TYPE=Release", f"-DTorch_DIR={config}",
         "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", "-DTENSORTAP_BUILD_TESTS=ON", "-DTENSORTAP_BUILD_BENCH=ON",
         "-DTENSORTAP_BUILD_EXAMPLES=OFF", "-DTENSORTAP_INSTALL=OFF",
         # Each source's own includes, not a precompiled header's.
         "-DTENSORTAP_PRECOMPILE_HEADERS=OFF",
         f"-DTENSORTAP_PYTHON={sys.executable}"])
    shim = os.path.join(build, "fmt_include")
    # Every header name the found fmt has, poisoned.
    for name in os.listdir(os.path.join(shim, "fmt")):
        with open(os.path.join(poison, "fmt", name), "w") as f:
            f.write(f'#error "{POISON} ({name})"\n')
    with open(os.path.join(build, "compile_commands.json")) as f:
        # Only what sees torch's include folder can meet its fmt: the
        # protobuf code of TensorBoard's events compiles without LibTorch
        # (and its generated header exists only once built).
        commands = [c for c in json.load(f) if poison in c["command"]]
    # A unit generated at build time (the docs' snippets) does not exist yet;
    # it includes public headers only, which the tests' own units include too.
    commands = [c for c in commands if not c["file"].startswith(build + os.sep) or os.path.exists(c["file"])]

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: headers_of(c, shim=True), commands))
    users = 0
    for c, (rc, out, deps) in zip(commands, results):
        check(rc == 0, f"{c['file']} does not preprocess:\n{out[-3000:]}")
        fmt_deps = [d for d in deps if "/fmt/" in d]
        wrong = [d for d in fmt_deps if not d.startswith(shim + "/fmt/")]
        check(not wrong, f"{c['file']} reads fmt headers from elsewhere than {shim}: {wrong}")
        # The poison was in reach: it is on the command line, as torch's is.
        check(not fmt_deps or poison in c["command"], f"{c['file']}: the poisoned folder is not on its command line")
        users += bool(fmt_deps)
    # The library's, the tests' and the benchmarks' sources that use fmt.
    check(users >= 30, f"only {users} of {len(commands)} sources include fmt: is this tensortap's tree?")

    # Control: without the link's -I, a library source that reads fmt meets
    # the poison.
    probe = next(c for c, (_, _, deps) in zip(commands, results)
                 if "/writers/src/" in c["file"] and any("/fmt/" in d for d in deps))
    rc, out, _ = headers_of(probe, shim=False)
    check(rc != 0 and POISON in out, f"without {shim} the poison was not reached (rc {rc}):\n{out[-2000:]}")
    print(f"ok: {len(commands)} sources, {users} include fmt, all from {os.path.realpath(shim + '/fmt')}")


def headers_of(entry, shim):
    """Preprocesses one compile command (-M: the headers it reads, system
    ones included); without `shim`, with the fmt link's -I removed."""
    args = shlex.split(entry["command"])
    out_args = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD"):
            continue
        if not shim and a.startswith("-I") and a.rstrip("/").endswith("fmt_include"):
            continue
        out_args.append(a)
    p = subprocess.run(out_args + ["-M"], cwd=entry["directory"], capture_output=True, text=True)
    deps = p.stdout.replace("\\\n", " ").split()
    return p.returncode, p.stdout + p.stderr, [d for d in deps if d.endswith((".h", ".hpp")) or "/fmt/" in d]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    check(p.returncode == 0, f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")


def check(ok, message):
    if not ok:
        print(f"FAIL: {message}")
        sys.exit(1)


if __name__ == "__main__":
    main()
