"""The reader's build, with one step pyproject.toml cannot say: the C++
recorder `tensortap._engine` (sdk/python/engine.cpp, what
`tensortap.torch.watch(..., engine="native")` records through), built by
the repository's own CMake project where it can be.

`pip install ./python` builds it when the interpreter running the build
imports torch, `cmake` is on PATH and this folder sits in its clone (the
CMake project is `..`). Otherwise it installs the reader alone and says why
in one line on stderr (pip shows it with -v). TENSORTAP_ENGINE_BUILD
chooses: `auto` (the default), `on` (the engine or a failed install), `off`
(the reader alone, nothing probed). TENSORTAP_CMAKE_ARGS adds arguments to
the configure (e.g. -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc).

Nothing is downloaded: the build uses the torch the interpreter imports,
its LibTorch and pybind11, and the system's compiler and libraries, so it
works under `pip install --no-build-isolation --no-index` (build isolation
hides an installed torch from the build).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Dict, List, Optional

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# The repository's top-level CMake project: pip builds a local folder in
# place (pip 21.3 on), so `..` is the clone this folder came from.
SOURCE = HERE.parent
SWITCH = "TENSORTAP_ENGINE_BUILD"
MODES = ("auto", "on", "off")
# What the engine's build needs of the clone; a copy of python/ alone, or
# an sdist, has none of it.
SOURCE_FILES = ("CMakeLists.txt", "cmake/python_engine.cmake", "sdk/python/engine.cpp")
TARGET = "tensortap_python_engine"


class EngineError(Exception):
    """Why tensortap._engine was not built, in words for the one line."""


def engine_mode() -> str:
    """TENSORTAP_ENGINE_BUILD, strictly: unset or empty is auto; anything
    but auto, on or off (any case, spaces around) stops the build by name."""
    raw = os.environ.get(SWITCH, "")
    mode = raw.strip().lower() or "auto"
    if mode not in MODES:
        raise SystemExit(f"tensortap: {SWITCH}={raw!r} is not one of {', '.join(MODES)}")
    return mode


def torch_facts() -> Dict[str, str]:
    """Where the installing interpreter's torch keeps its CMake files and
    libraries. In a child process: torch's import is heavy and its failure
    (or a crash) must not take the build with it."""
    probe = ("import json, os, torch, torch.utils\n"
             "print(json.dumps({'prefix': torch.utils.cmake_prefix_path, "
             "'root': os.path.dirname(os.path.realpath(torch.__file__)), 'version': torch.__version__}))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        raise EngineError(f"torch does not import for {sys.executable} ({last}; pip's build isolation hides an "
                          "installed torch: pip install --no-build-isolation)")
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    return {k: str(v) for k, v in facts.items()}


def check_clone() -> str:
    """The cmake program; raises EngineError where the build cannot start."""
    for name in SOURCE_FILES:
        if not (SOURCE / name).is_file():
            raise EngineError(f"no tensortap clone around {HERE} ({SOURCE / name} is missing: "
                              "the engine builds from a clone's python/ folder)")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise EngineError("no cmake on PATH")
    return cmake


def run_logged(command: List[str], log: Path) -> str:
    """Runs one CMake step, its output appended to `log` and returned;
    raises EngineError with the output's last lines when it fails."""
    r = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with log.open("a", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(command)}\n{r.stdout}\n")
    if r.returncode != 0:
        tail = "\n".join(r.stdout.strip().splitlines()[-25:])
        raise EngineError(f"{shlex.join(command[:2])} ... exited {r.returncode} (whole log: {log}):\n{tail}")
    return r.stdout


def configure_args(cmake: str, build: Path, torch: Dict[str, str]) -> List[str]:
    """The top-level project with only the library and the engine: no
    tests, examples, benchmarks or install rules; tensortap static, so the
    module carries it and needs no library of ours beside it."""
    args = [cmake, "-S", str(SOURCE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            # The torch root too, ahead of any other LibTorch (Debian's
            # libtorch-dev), as README's wheel build says.
            f"-DCMAKE_PREFIX_PATH={torch['prefix']};{torch['root']}",
            f"-DTENSORTAP_PYTHON={sys.executable}", "-DTENSORTAP_BUILD_PYTHON_ENGINE=ON",
            "-DTENSORTAP_BUILD_TESTS=OFF", "-DTENSORTAP_BUILD_EXAMPLES=OFF", "-DTENSORTAP_BUILD_BENCH=OFF",
            "-DTENSORTAP_INSTALL=OFF", "-DBUILD_SHARED_LIBS=OFF"]
    # Ninja where there is one, unless the user chose (CMAKE_GENERATOR) or
    # the folder was configured already (its generator cannot change).
    if shutil.which("ninja") and "CMAKE_GENERATOR" not in os.environ and not (build / "CMakeCache.txt").exists():
        args += ["-G", "Ninja"]
    return args + shlex.split(os.environ.get("TENSORTAP_CMAKE_ARGS", ""))


def build_engine(build_root: Path) -> Path:
    """Configures and builds the engine target; the module's path."""
    cmake = check_clone()
    torch = torch_facts()
    # One folder per interpreter and torch: CMake's cache keeps the LibTorch
    # it found, so another torch gets a fresh configure, and the same one
    # an incremental build.
    key = hashlib.sha256(f"{sys.executable}\0{torch['root']}\0{torch['version']}".encode()).hexdigest()[:12]
    build = build_root / f"engine-{key}"
    build.mkdir(parents=True, exist_ok=True)
    log = build / "tensortap-engine.log"
    log.write_text("", encoding="utf-8")
    out = run_logged(configure_args(cmake, build, torch), log)
    if "tensortap: tensortap._engine for" not in out:
        # cmake/python_engine.cmake declined it, and said why.
        why = [ln.strip("- ").strip() for ln in out.splitlines() if "no tensortap._engine" in ln]
        raise EngineError(why[0] if why else f"the CMake project did not add {TARGET} for torch {torch['version']} "
                          f"({torch['root']}/lib has no libtorch_python.so?)")
    command = [cmake, "--build", str(build), "--target", TARGET]
    if "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ:
        command += ["--parallel", str(os.cpu_count() or 1)]
    run_logged(command, log)
    module = build / "python" / "tensortap" / f"_engine{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not module.is_file():
        raise EngineError(f"the build made no {module}")
    return module


class BuildEngine(build_ext):
    """build_ext for the one extension, by CMake instead of setuptools'
    compiler: tensortap, LibTorch and the option table are CMake's to put
    together, as they are for the C++ trees."""

    def run(self) -> None:
        mode = engine_mode()
        built: List[str] = []
        for ext in self.extensions:
            try:
                module = build_engine(Path(self.build_temp).resolve())
            except EngineError as e:
                if mode == "on":
                    raise SystemExit(f"tensortap: {SWITCH}=on, but tensortap._engine was not built: {e}") from None
                print(f"tensortap: installing the reader without tensortap._engine (engine='native'): {e} "
                      f"({SWITCH}=off skips the attempt, =on makes it an error)", file=sys.stderr)
                continue
            target = Path(self.get_ext_fullpath(ext.name))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(module, target)
            built.append(str(target))
            print(f"tensortap: built tensortap._engine ({target.name})", file=sys.stderr)
        self._built = built

    def get_outputs(self) -> List[str]:
        # Only what run() made: a reader installed alone lists no module.
        return list(getattr(self, "_built", []))


class BuildPackage(build_py):
    """build_py, and a module an earlier build left in the build folder
    removed: setuptools never empties it, so a reader built alone (off, or
    no torch now) would otherwise ship the old engine. build_ext, which
    runs after, puts a fresh one there when it builds."""

    def run(self) -> None:
        super().run()
        for stale in Path(self.build_lib, "tensortap").glob("_engine*"):
            stale.unlink()


def extensions() -> Optional[List[Extension]]:
    """The engine as an extension (so the wheel says its platform), unless
    TENSORTAP_ENGINE_BUILD=off: then the package is pure Python."""
    if engine_mode() == "off":
        return None
    return [Extension("tensortap._engine", sources=[])]


setup(ext_modules=extensions(), cmdclass={"build_py": BuildPackage, "build_ext": BuildEngine})
