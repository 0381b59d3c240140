#!/usr/bin/env bash
# On the GPU machine: builds tensortap against the LibTorch of its PyTorch
# (with CUDA), then runs the [gpu] tests and the GPU benchmarks.
#
#   bash scripts/gpu.sh [build|tests|bench|all]      (default: all)
#
# That machine has no network: the Debian packages the build needs come from
# .deb/ (scripts/fetch_debs.sh, run where there is a network; carry .deb with
# the working tree) and are unpacked into .deb/prefix without root. Results
# go to $OUT when it is set (the device tool's output folder), otherwise to
# build-gpu/out: configure and build logs, tests.txt, bench_*.json and
# summary.txt with the ratios the issue sets targets for.
#
# Environment: PYTHON (the interpreter with torch; default python3),
# TENSORTAP_GPU_BUILD (build folder; default build-gpu), TORCH_CUDA_ARCH_LIST
# (default 9.0, for the H200, which spares LibTorch's CMake probing the GPU).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BUILD=${TENSORTAP_GPU_BUILD:-$ROOT/build-gpu}
RESULTS=${OUT:-$BUILD/out}
PREFIX=$ROOT/.deb/prefix
PYTHON=${PYTHON:-python3}
WHAT=${1:-all}
mkdir -p "$RESULTS" "$BUILD"

unpack_debs() {
  compgen -G "$ROOT/.deb/*.deb" >/dev/null || {
    echo "tensortap: no .deb/*.deb: using the system's Catch2, fmt and benchmark"
    return 0
  }
  mkdir -p "$PREFIX"
  for deb in "$ROOT"/.deb/*.deb; do
    local stamp="$PREFIX/.$(basename "$deb").unpacked"
    [ -e "$stamp" ] && continue
    if command -v dpkg-deb >/dev/null 2>&1; then
      dpkg-deb -x "$deb" "$PREFIX"
    else
      # Not a Debian system: a .deb is an ar archive holding data.tar.*.
      local tmp
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$PREFIX")
      rm -rf "$tmp"
    fi
    touch "$stamp"
  done
}

ARCHLIB=$PREFIX/usr/lib/x86_64-linux-gnu
TORCH_PY=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
# Debian's runtime libraries unpacked from .deb (libfmt9, libbenchmark);
# torch's own and its CUDA wheels' are found through their RPATHs.
export LD_LIBRARY_PATH="$ARCHLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

build() {
  unpack_debs
  {
    nvidia-smi || true
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "devices", torch.cuda.device_count())'
    cmake --version | head -1
    "${CXX:-c++}" --version | head -1
    # Recent wheels ship fmt headers of their own (issue 17): say so.
    if [ -d "$TORCH_PY/include/fmt" ]; then echo "torch ships fmt headers: $TORCH_PY/include/fmt"; fi
  } >"$RESULTS/machine.txt" 2>&1
  local args=(-DTENSORTAP_WITH_HDF5=OFF -DTENSORTAP_BUILD_TESTS=ON -DTENSORTAP_BUILD_BENCH=ON
    -DTENSORTAP_BUILD_EXAMPLES=OFF -DTENSORTAP_INSTALL=OFF)
  [ -d "$PREFIX/usr/lib/cmake/Catch2" ] && args+=("-DCatch2_DIR=$PREFIX/usr/lib/cmake/Catch2")
  [ -d "$ARCHLIB/cmake/fmt" ] && args+=("-Dfmt_DIR=$ARCHLIB/cmake/fmt")
  [ -d "$ARCHLIB/cmake/benchmark" ] && args+=("-Dbenchmark_DIR=$ARCHLIB/cmake/benchmark")
  # The function CI's build of LibTorch 2.x goes through (scripts/common.sh).
  configure_torch2 "$BUILD" "$PYTHON" "${args[@]}" >"$RESULTS/configure.log" 2>&1 || {
    tail -30 "$RESULTS/configure.log" >&2
    return 1
  }
  # The build's own status decides, not whether old binaries are there; the
  # log keeps everything, the terminal gets the errors.
  local rc=0
  cmake --build "$BUILD" --parallel "$(nproc)" \
    --target tensortap_cuda_tests bench_cuda_engine bench_cuda >"$RESULTS/build.log" 2>&1 || rc=$?
  grep -E "error|warning: unused|FAILED" "$RESULTS/build.log" || true
  if [ "$rc" -ne 0 ]; then
    echo "tensortap: the build failed (exit $rc), see $RESULTS/build.log" >&2
    tail -40 "$RESULTS/build.log" >&2
    return 1
  fi
  # What the compiler read, from ninja's dependency log: no object may have
  # been compiled against torch's own fmt (cmake/fmt.cmake).
  echo "fmt compiled against: $(readlink "$BUILD/fmt_include/fmt")" >>"$RESULTS/machine.txt"
  if ninja -C "$BUILD" -t deps | grep -E "torch/include/fmt/" >"$RESULTS/fmt_from_torch.txt"; then
    echo "tensortap: sources were compiled against torch's fmt headers (see $RESULTS/fmt_from_torch.txt)" >&2
    return 1
  fi
}

run_tests() {
  # The engine against the real runtime, and CUDA tensors through LibTorch.
  "$BUILD/tests/tensortap_cuda_tests" "[gpu]" --durations yes 2>&1 | tee "$RESULTS/tests.txt"
}

run_bench() {
  local dir
  dir=$(mktemp -d /dev/shm/tensortap-bench-XXXXXX 2>/dev/null || mktemp -d)
  export TENSORTAP_BENCH_DIR=$dir
  "$BUILD/bench/bench_cuda_engine" --benchmark_out="$RESULTS/bench_cuda_engine.json" \
    --benchmark_out_format=json 2>&1 | tee "$RESULTS/bench_cuda_engine.txt"
  "$BUILD/bench/bench_cuda" --benchmark_out="$RESULTS/bench_cuda.json" --benchmark_out_format=json 2>&1 |
    tee "$RESULTS/bench_cuda.txt"
  rm -rf "$dir"
  "$PYTHON" "$ROOT/scripts/gpu_summary.py" "$RESULTS" | tee "$RESULTS/summary.txt"
}

case $WHAT in
  build) build ;;
  tests) [ -x "$BUILD/tests/tensortap_cuda_tests" ] || build; run_tests ;;
  bench) [ -x "$BUILD/bench/bench_cuda" ] || build; run_bench ;;
  all)
    build
    rc=0
    run_tests || rc=1
    run_bench || rc=1
    exit $rc
    ;;
  *)
    echo "usage: $0 [build|tests|bench|all]" >&2
    exit 2
    ;;
esac
