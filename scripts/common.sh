# Shared by scripts/demo.sh, scripts/test.sh and scripts/bench.sh. Sourced, not run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Debian packages tensortap builds, tests and demos with (python3-dev: the
# headers tensortap._engine, the C++ recorder for Python, builds against).
CORE_PACKAGES="cmake g++ make ninja-build ccache libtorch-dev libfmt-dev catch2 libbenchmark-dev
  libhdf5-dev python3 python3-numpy python3-h5py python3-matplotlib python3-pip python3-setuptools libgloo-dev
  python3-pandas python3-xarray python3-dask python3-tqdm libprotobuf-dev protobuf-compiler
  python3-dev"

# What only the tests need: a real browser that renders `tensortap report`'s
# page (tests/python/test_analysis.py); mypy, which checks the reader's
# annotations (the package ships py.typed); python3-venv, for the test that
# installs the reader into a fresh virtual environment.
TEST_PACKAGES="chromium chromium-driver python3-selenium mypy python3-venv"

# Debian packages the GPU machine (no network, PyTorch's LibTorch) needs to
# build tensortap's tests and benchmarks: scripts/fetch_debs.sh downloads
# them into .deb/, scripts/gpu.sh unpacks them there. Runtime libraries
# (libfmt9, libbenchmark1debian) come with their -dev packages.
GPU_DEB_PACKAGES="catch2 libfmt-dev libfmt9 libbenchmark-dev libbenchmark1debian"

# Installs the packages of $* that are missing; asks apt only if one is.
install_missing() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "tensortap: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The Python that sees Debian's numpy. `python3` on PATH may be a pyenv
# interpreter without it, so /usr/bin/python3 comes first.
numpy_python() {
  for py in /usr/bin/python3 python3; do
    if "$py" -c "import numpy" >/dev/null 2>&1; then
      echo "$py"
      return 0
    fi
  done
  echo "tensortap: no python3 with numpy found" >&2
  return 1
}

# Installs the reader for the Python that sees Debian's NumPy, so that
# `tensortap inspect RUN` works as a command whatever `python3` on PATH is.
# Offline: no index, no build isolation (Debian's setuptools builds it).
# The reader alone (TENSORTAP_ENGINE_BUILD=off): where this Python imports
# torch, pip would otherwise compile tensortap._engine, minutes each time
# (python/build is removed after); the scripts build the engine in
# build-torch2/ instead.
install_reader() {
  local py
  py=$(numpy_python)
  TENSORTAP_ENGINE_BUILD=off PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$py" -m pip install -q --no-deps --no-build-isolation --break-system-packages "$ROOT/python" 2>&1 |
    grep -v "Running pip as the 'root' user" || true
  rm -rf "$ROOT/python/build" "$ROOT"/python/*.egg-info
  "$py" -c "import tensortap" || { echo "tensortap: the reader did not install for $py" >&2; return 1; }
}

# The compiler cache (Debian's ccache): a build that compiles what an
# earlier build compiled, in this clone or another, takes the objects from
# ~/.cache/ccache instead. base_dir makes paths inside the clone relative,
# so a fresh clone in another folder hits the cache; the sloppiness lets
# precompiled headers (CMakeLists.txt, tensortap_precompile) be cached and
# used: a clone's files, and the header built in it, are all newer than the
# cache's entries. The consumer tests' own CMake projects get the launcher
# through consumer-cache.cmake (tests/CMakeLists.txt) and these variables
# through ctest's environment. TENSORTAP_CCACHE=0 builds without it.
# Compiler launcher arguments for cmake (none without ccache).
ccache_args() {
  [ "${TENSORTAP_CCACHE:-1}" = 1 ] && command -v ccache >/dev/null || return 0
  echo "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
}
if [ "${TENSORTAP_CCACHE:-1}" = 1 ]; then
  export CCACHE_DIR=${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ccache}
  export CCACHE_BASEDIR=$ROOT
  export CCACHE_NOHASHDIR=1
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  # Both LibTorches' trees and their C++20 consumer builds: about 2 GB.
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
fi

# configure_and_build BUILD_DIR [cmake args...]: against the LibTorch CMake
# finds first (Debian's 1.13 unless CMAKE_PREFIX_PATH says otherwise).
configure_and_build() {
  local dir=$1
  shift
  # shellcheck disable=SC2046
  timed "$(basename "$dir")/: configure" cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DTENSORTAP_PYTHON="$(numpy_python)" $(ccache_args) "$@"
  timed "$(basename "$dir")/: build" cmake --build "$dir" --parallel "$(nproc)"
}

# PyTorch's own LibTorch 2.x with CUDA: the `torch` wheel from PyPI, which
# brings its CUDA libraries (nvidia/cu13/...) as wheels of their own. 2.11.0
# is what the GPU machine runs (2.11.0+cu130); PyPI's 2.11.0 for Linux is
# that build, for the CUDA 13.0 toolkit in /usr/local/cuda. Installed with
# pip's --target into a folder of the scripts' own, outside the repository
# (about 4.6 GB, so a fresh clone does not download it again), never into a
# system Python; Python finds it through PYTHONPATH (torch2_python).
TORCH2_VERSION=2.11.0
torch2_dir() {
  local tag
  tag=$("$(numpy_python)" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  echo "${TENSORTAP_TORCH2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tensortap/torch-$TORCH2_VERSION-$tag}"
}

# The Python that sees Debian's NumPy and, through PYTHONPATH, the torch of
# torch2_dir: torch2_python -c 'import torch'.
torch2_python() {
  PYTHONPATH="$(torch2_dir)${PYTHONPATH:+:$PYTHONPATH}" "$(numpy_python)" "$@"
}

# Installs torch==$TORCH2_VERSION into torch2_dir unless it is there. A
# half-finished install (a failed download) is never taken for a finished
# one: pip writes into DIR.partial, renamed only once complete.
install_torch2() {
  local py dir
  py=$(numpy_python)
  dir=$(torch2_dir)
  if torch2_python -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$TORCH2_VERSION')" \
    >/dev/null 2>&1; then
    return 0
  fi
  echo "tensortap: installing torch==$TORCH2_VERSION and its CUDA libraries from PyPI into $dir"
  rm -rf "$dir.partial"
  mkdir -p "$(dirname "$dir")"
  PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$py" -m pip install -q --no-warn-script-location \
    --target "$dir.partial" "torch==$TORCH2_VERSION"
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
  torch2_python -c 'import torch; print("tensortap: torch", torch.__version__, "CUDA", torch.version.cuda)'
}

# TensorBoard from PyPI, for the tests that read tensortap's event files
# with TensorBoard's own reader and open its page in a browser
# (tests/python/test_tensorboard.py). Debian has no tensorboard. Installed
# like torch, into a folder of the scripts' own, with pinned versions and
# without pip's resolver (--no-deps): its numpy requirement would pull a
# second NumPy over Debian's, which the reader and h5py are built against.
TENSORBOARD_PACKAGES="tensorboard==2.21.0 tensorboard-data-server==0.7.2 absl-py==2.5.1 grpcio==1.85.3
  markdown==3.11.3 markupsafe==3.0.4 packaging==26.4 pillow==13.0.0 protobuf==7.36.2 werkzeug==3.1.9
  typing_extensions==4.16.0"
tensorboard_dir() {
  local tag
  tag=$("$(numpy_python)" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  echo "${TENSORTAP_TENSORBOARD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tensortap/tensorboard-2.21.0-$tag}"
}
install_tensorboard() {
  local py dir
  py=$(numpy_python)
  dir=$(tensorboard_dir)
  if PYTHONPATH="$dir" "$py" -c "import tensorboard.backend.event_processing.event_accumulator" >/dev/null 2>&1; then
    return 0
  fi
  echo "tensortap: installing TensorBoard from PyPI into $dir"
  rm -rf "$dir.partial"
  mkdir -p "$(dirname "$dir")"
  # shellcheck disable=SC2086
  PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$py" -m pip install -q --no-warn-script-location \
    --no-deps --target "$dir.partial" $TENSORBOARD_PACKAGES
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
  PYTHONPATH="$dir" "$py" -c 'import tensorboard; print("tensortap: tensorboard", tensorboard.__version__)'
}

# configure_torch2 BUILD_DIR PYTHON [cmake args...]: configures a build
# against the LibTorch of PYTHON's torch, found as its users do
# (torch.utils.cmake_prefix_path), with tensortap's CUDA engine. Used by
# scripts/test.sh (CI, no GPU) and scripts/gpu.sh (the GPU machine), so both
# compile the same way. Fails unless the engine is on and the toolkit is
# the CUDA major version torch was built for (two runtimes do not mix).
configure_torch2() {
  local dir=$1 py=$2
  shift 2
  local prefix torch_py torch_cuda
  prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  torch_py=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  torch_cuda=$("$py" -c 'import torch; print(torch.version.cuda or "")')
  # No linker flags for the wheel's CUDA libraries (nvidia/*/lib beside
  # torch): the tensortap target and its installed package config name them
  # (cmake/torch_wheel.cmake), which the suite's programs and the consumer
  # projects check by linking without any.
  local args=(-DCMAKE_BUILD_TYPE=Release
    # The torch folder itself too: TorchConfig's find_library(torch) would
    # otherwise take the first libtorch.so on the system's paths (Debian's
    # 1.13, where libtorch-dev is installed) for TORCH_LIBRARY.
    "-DCMAKE_PREFIX_PATH=$prefix;$torch_py${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}"
    -DTENSORTAP_WITH_CUDA=ON)
  [ -d /usr/local/cuda ] && args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
  [ -x /usr/local/cuda/bin/nvcc ] && args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
  # LibTorch's CMake asks the GPU for its architecture, or warns without
  # one. Its list is added to tensortap's own kernels' (stats_kernel.cu,
  # TENSORTAP_CUDA_ARCHITECTURES): the H100/H200's.
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  local extra=("$@")
  # shellcheck disable=SC2016
  timed "$(basename "$dir")/: configure" eval 'cmake -S "$ROOT" -B "$dir" -G Ninja "${args[@]}" $(ccache_args) \
    "${extra[@]}" 2>&1 | tee "$dir.configure.log"'
  if ! grep -q "tensortap: CUDA engine on" "$dir.configure.log"; then
    echo "tensortap: the LibTorch at $prefix has no CUDA (no TARGET torch_cuda), or no CUDA toolkit was found" >&2
    return 1
  fi
  local toolkit
  toolkit=$(sed -n 's/.*CUDA engine on (LibTorch with CUDA, toolkit \([0-9.]*\)).*/\1/p' "$dir.configure.log" | head -1)
  if [ -z "$torch_cuda" ] || [ "${torch_cuda%%.*}" != "${toolkit%%.*}" ]; then
    echo "tensortap: torch was built for CUDA '$torch_cuda' but the toolkit found is '$toolkit':" \
      "set CUDAToolkit_ROOT to a toolkit of the same major version" >&2
    return 1
  fi
}

# torch2_wrapper DIR: writes DIR/torch2-python, one interpreter path for
# CMake and the tests: Debian's Python with torch2_dir on its path. Prints
# its path.
torch2_wrapper() {
  local py=$1/torch2-python
  mkdir -p "$1"
  printf '#!/bin/sh\nPYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}" exec "%s" "$@"\n' "$(torch2_dir)" "$(numpy_python)" >"$py"
  chmod +x "$py"
  echo "$py"
}

# configure_and_build_torch2 BUILD_DIR [cmake args...]: the CI build against
# torch2_dir's LibTorch 2.x with CUDA.
configure_and_build_torch2() {
  local dir=$1
  shift
  local py
  py=$(torch2_wrapper "$dir")
  configure_torch2 "$dir" "$py" -DTENSORTAP_PYTHON="$(numpy_python)" -DTENSORTAP_TORCH_PYTHON="$py" "$@"
  timed "$(basename "$dir")/: build" cmake --build "$dir" --parallel "$(nproc)"
}

# timed LABEL COMMAND...: runs COMMAND; its time goes to $TENSORTAP_TIMES
# (when set) for the time table scripts/test.sh prints last.
timed() {
  local label=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  [ -n "${TENSORTAP_TIMES:-}" ] && printf '  %-58s %5d s\n' "$label" $((SECONDS - start)) >>"$TENSORTAP_TIMES"
  return $rc
}

# run_ctest BUILD_DIR LABEL [ctest arguments...]: the build's suite (all of it, or
# what the arguments select); its summary line goes to $CTEST_SUMMARY for the
# closing line of scripts/test.sh, its 15 slowest tests to $CTEST_SLOWEST.
run_ctest() {
  local dir=$1 label=$2 log rc=0
  shift 2
  log=$(mktemp)
  (cd "$dir" && ctest --output-on-failure --parallel "$(nproc)" --timeout 900 "$@") 2>&1 | tee "$log" || rc=$?
  local line
  line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$log" | tail -1 || true)
  echo "$label: ${line:-no ctest summary (exit $rc)}" >>"$CTEST_SUMMARY"
  if [ -n "${CTEST_SLOWEST:-}" ]; then
    echo "$label, the 15 slowest tests (s):" >>"$CTEST_SLOWEST"
    sed -nE 's/^.*Test +#[0-9]+: (.*[^ .]) \.+.* ([0-9.]+) sec$/\2  \1/p' "$log" | sort -rn | head -15 |
      awk '{ printf "  %7.1f  %s\n", $1, substr($0, index($0, $2)) }' >>"$CTEST_SLOWEST"
  fi
  rm -f "$log"
  return $rc
}
