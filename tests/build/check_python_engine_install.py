#!/usr/bin/env python3
"""`pip install ./python` builds tensortap._engine (ctest python.pip_builds_engine).

With an interpreter that imports torch and `cmake` on PATH, python/setup.py
configures the repository's CMake project and builds the C++ recorder into
the package. This installs a copy of the clone's sources (the library's
folders, cmake/ and python/: pip writes its build folder beside setup.py)
with that interpreter's pip, offline (--no-index, --no-build-isolation,
--target), then, in a fresh process that sees the installed copy and not
the source tree, imports tensortap._engine from it and records three steps
of a small model with tensortap.torch.watch(..., engine="native"), read back
with tensortap.open. Then TENSORTAP_ENGINE_BUILD=off installs the reader
alone (no module, though the build folder still holds one), an unknown
value stops pip naming it, and =on with python/ alone (no clone around it)
fails naming the missing file.

The build is the one a user gets: a fresh configure and the library's
sources compiled, which takes minutes cold on two cores. With ccache as the
compiler launcher (CMAKE_CXX_COMPILER_LAUNCHER, which ctest passes from the
build), the copy keeps one path, so a second run takes its objects from the
cache.

Skipped (exit 77) with the reason where cmake is not on PATH, or the
interpreter imports no torch or has no pip.

    check_python_engine_install.py SOURCE_DIR WORK_DIR PYTHON_WITH_TORCH
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

SKIP = 77
# What python/setup.py's build needs of a clone, no more (no tests, docs).
CLONE = ("CMakeLists.txt", "cmake", "sdk", "hooks", "writers", "python")
IGNORE = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "_engine*.so")

RECORD = """
import os, sys, torch
import tensortap, tensortap._engine as engine, tensortap.torch as ttt
site = os.path.realpath(sys.argv[1])
for module in (tensortap, engine):
    assert os.path.realpath(module.__file__).startswith(site + os.sep), module.__file__
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
run = os.path.join(sys.argv[2], "run")
rec = ttt.watch(model, run, engine="native")
for step in range(3):
    rec.step(step)
    model(torch.randn(2, 4)).sum().backward()
rec.close()
r = tensortap.open(run)
assert r.names("grad") == ["0.bias", "0.weight", "2.bias", "2.weight"], r.names("grad")
assert r.steps("0.weight", kind="grad") == [0, 1, 2], r.steps("0.weight", kind="grad")
assert r.load("0.weight", 2, kind="grad").shape == (3, 4)
print("recorded", r.kinds(), "through", os.path.basename(engine.__file__))
"""


def pip(python: str, env: Dict[str, str], source: Path, target: Path,
        mode: Optional[str]) -> subprocess.CompletedProcess:
    """`pip install` of `source` into `target`, offline; -v so the build's
    own lines (setup.py's) come back."""
    env = dict(env)
    env.pop("TENSORTAP_ENGINE_BUILD", None)
    if mode is not None:
        env["TENSORTAP_ENGINE_BUILD"] = mode
    command = [python, "-m", "pip", "install", "-v", "--no-deps", "--no-index", "--no-build-isolation",
               "--target", str(target), str(source)]
    return subprocess.run(command, env=env, capture_output=True, text=True)


def said(r: subprocess.CompletedProcess) -> str:
    """The lines setup.py printed (they start with "tensortap:")."""
    return "\n".join(ln.strip() for ln in (r.stdout + r.stderr).splitlines() if ln.strip().startswith("tensortap:"))


def fail(why: str, r: Optional[subprocess.CompletedProcess] = None) -> int:
    if r is not None:
        print(r.stdout[-4000:], r.stderr[-4000:])
    print(f"FAIL: {why}")
    return 1


def check_built(python: str, env: Dict[str, str], work: Path) -> int:
    """The default install builds the engine, and it records from there."""
    site = work / "site"
    started = time.monotonic()
    r = pip(python, env, work / "src" / "python", site, None)
    took = time.monotonic() - started
    if r.returncode != 0:
        return fail(f"pip install ./python exited {r.returncode}", r)
    print(f"pip install ./python: {took:.0f} s (configure and build included)\n{said(r)}")
    if "tensortap: built tensortap._engine" not in said(r):
        return fail("pip install ./python did not build tensortap._engine where torch imports and cmake is on PATH", r)
    modules = list((site / "tensortap").glob("_engine*.so"))
    if len(modules) != 1:
        return fail(f"the installed package holds {[m.name for m in modules]}, not one _engine*.so")
    env = dict(env, PYTHONPATH=str(site))
    (work / "runs").mkdir()
    r = subprocess.run([python, "-c", RECORD, str(site), str(work / "runs")], cwd=work, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        return fail("the installed tensortap._engine did not record a run that reads back", r)
    print(r.stdout.strip())
    return 0


def check_off_and_refusals(python: str, env: Dict[str, str], work: Path) -> int:
    """off installs the reader alone; a bad value and =on without a clone stop pip by name."""
    off = work / "site-off"
    r = pip(python, env, work / "src" / "python", off, "off")
    if r.returncode != 0:
        return fail(f"TENSORTAP_ENGINE_BUILD=off: pip install exited {r.returncode}", r)
    left = [p.name for p in (off / "tensortap").glob("_engine*")]
    if left or not (off / "tensortap" / "__init__.py").is_file():
        return fail(f"TENSORTAP_ENGINE_BUILD=off installed {left or 'no tensortap package'}", r)
    probe = "import tensortap._native as n; assert n.load() is None; print('reader alone')"
    r = subprocess.run([python, "-c", probe], cwd=work, env=dict(env, PYTHONPATH=str(off)), capture_output=True,
                       text=True)
    if r.returncode != 0:
        return fail("TENSORTAP_ENGINE_BUILD=off: the installed reader imports an engine, or does not import", r)
    r = pip(python, env, work / "src" / "python", work / "site-bad", "sometimes")
    if r.returncode == 0 or "TENSORTAP_ENGINE_BUILD='sometimes'" not in r.stdout + r.stderr:
        return fail("TENSORTAP_ENGINE_BUILD=sometimes was not refused by name", r)
    alone = work / "alone" / "python"
    shutil.copytree(work / "src" / "python", alone, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    r = pip(python, env, alone, work / "site-alone", "on")
    if r.returncode == 0 or "CMakeLists.txt is missing" not in r.stdout + r.stderr:
        return fail("TENSORTAP_ENGINE_BUILD=on with python/ alone did not fail naming the missing clone", r)
    print("off: the reader alone; 'sometimes' refused by name; on without a clone refused by name")
    return 0


def main(argv: List[str]) -> int:
    if len(argv) != 4:
        print(__doc__)
        return 2
    src, work, python = Path(argv[1]), Path(argv[2]), argv[3]
    if shutil.which("cmake") is None:
        print("skipped: no cmake on PATH, so pip install ./python builds no engine")
        return SKIP
    # Neither the source tree's package nor a build tree's engine: only
    # what pip installs (the torch interpreter's own path stays).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore")
    for probe, what in (("import torch", "imports no torch"), ("import pip", "has no pip")):
        if subprocess.run([python, "-c", probe], env=env, capture_output=True).returncode != 0:
            print(f"skipped: {python} {what}")
            return SKIP
    # One run at a time in WORK_DIR: a second ctest of the same tree
    # would delete the first one's build under it.
    work.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{work}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return run_in(src, work, python, env)


def run_in(src: Path, work: Path, python: str, env: Dict[str, str]) -> int:
    """The clone's sources copied into WORK_DIR/src, then the checks."""
    shutil.rmtree(work, ignore_errors=True)
    for name in CLONE:
        if (src / name).is_dir():
            shutil.copytree(src / name, work / "src" / name, ignore=IGNORE)
        else:
            (work / "src").mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / name, work / "src" / name)
    rc = check_built(python, env, work) or check_off_and_refusals(python, env, work)
    if rc == 0:
        print("OK: pip install ./python builds tensortap._engine, which records; off and refusals as documented")
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
