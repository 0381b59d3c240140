#!/usr/bin/env bash
# The checks that need a GPU: the [gpu] tests (plain, then under
# compute-sanitizer), the GPU benchmarks, the demo end to end on the GPU and a
# profile of one step.
#
#   bash scripts/gpu.sh pack        here: build-torch2's GPU programs and the
#                                   shared libraries they need besides
#                                   LibTorch's, into .gpu/ (carry it)
#   bash scripts/gpu.sh [build|tests|sanitize|bench|e2e|profile|all]
#                                   on the GPU machine (default: all)
#
# Two ways to get the programs there. The GPU machine has no network and
# costs minutes per start, so the usual one is `pack` here, against the
# same PyTorch (2.11.0+cu130) through the same build function CI uses
# (configure_torch2), then `carry` .gpu; the stages find .gpu/bin and run
# those programs against the machine's own LibTorch (LD_LIBRARY_PATH), so
# the libraries they run against are the machine's. Without .gpu/, `build`
# builds there, from .deb/ (scripts/fetch_debs.sh, run where there is a
# network; carry .deb), unpacked into .deb/prefix without root.
#
# Results go to $OUT when it is set (the device tool's output folder),
# otherwise to build-gpu/out: machine.txt, tests.txt, sanitize_*.txt,
# bench_*.json, summary.txt with the ratios the issue sets targets for,
# e2e.txt, profile.txt and timeline.png. TENSORTAP_GPU_DEADLINE (seconds
# since the epoch) bounds every program, so a call ends in its lease;
# TENSORTAP_GPU_STAGES picks the stages of `all`, TENSORTAP_GPU_SANITIZE_SECONDS
# caps the sanitizers.
#
# Environment: PYTHON (the interpreter with torch; default python3),
# TENSORTAP_GPU_BUILD (build folder; default build-gpu), TORCH_CUDA_ARCH_LIST
# (default 9.0, for the H100 and H200, which spares LibTorch's CMake probing
# the GPU).
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
PACK=$ROOT/.gpu
# The programs the stages run, by where build-torch2 (or build-gpu) puts them.
GPU_PROGRAMS="tests/tensortap_cuda_tests bench/bench_cuda_engine bench/bench_cuda tests/torch_reference
  examples/train_mlp examples/train_blowup"

torch_py() { "$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))'; }

# Where the stages find the programs, and the libraries they load: the
# machine's LibTorch and CUDA runtime first, then what `pack` carried
# (Debian's fmt, HDF5, protobuf, benchmark and their needs) or .deb's. Only
# for these programs (bounded, run_sanitize): the machine's Python must keep
# its own libraries.
use_programs() {
  local torch
  torch=$(torch_py)
  if [ -d "$PACK/bin" ]; then
    BIN=$PACK/bin
    PROGRAM_LIBS="$torch/lib:$torch/../nvidia/cu13/lib:$PACK/lib"
  else
    BIN=$BUILD/bin
    [ -x "$BIN/tensortap_cuda_tests" ] || build
    PROGRAM_LIBS=$ARCHLIB
  fi
}

machine() {
  {
    date -u
    nvidia-smi || true
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "devices", torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
    command -v compute-sanitizer && compute-sanitizer --version | tail -1
    [ -e "$PACK/built.txt" ] && cat "$PACK/built.txt"
    # Every library each program loads, and from where.
    for p in $GPU_PROGRAMS; do
      echo "== ldd $(basename "$p")"
      LD_LIBRARY_PATH=$PROGRAM_LIBS ldd "$BIN/$(basename "$p")" | grep -E "not found|torch|cuda|cudart|stdc" || true
    done
  } 2>&1 | tee "$RESULTS/machine.txt"
}

# Here, after build-torch2 is built (scripts/test.sh builds it with the tests,
# benchmarks and examples): the programs, and every library they load that is
# neither LibTorch's (the GPU machine has its own, the same version) nor the C
# library's.
pack() {
  local from=${TENSORTAP_GPU_FROM:-$ROOT/build-torch2}
  rm -rf "$PACK"
  mkdir -p "$PACK/bin" "$PACK/lib"
  for p in $GPU_PROGRAMS; do
    [ -x "$from/$p" ] || {
      echo "tensortap: $from/$p is not built" >&2
      return 1
    }
    cp "$from/$p" "$PACK/bin/"
  done
  local torch
  torch=$(cd "$(torch2_dir)" && pwd)
  for p in "$PACK"/bin/*; do ldd "$p"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    while read -r lib; do
      case $lib in
        # The C and C++ runtimes (glibc's parts must match that machine's
        # libc; its libstdc++ is newer than this one's).
        "$torch"/* | */libc.so.* | */libm.so.* | */libpthread.so.* | */libdl.so.* | */librt.so.* | */ld-linux* | \
          */libresolv.so.* | */libutil.so.* | */libstdc++.so.* | */libgcc_s.so.*) ;;
        # The driver's own libraries belong to that machine's driver.
        */libcuda.so.* | */libnvidia-*) ;;
        *) cp -L "$lib" "$PACK/lib/" ;;
      esac
    done
  {
    echo "packed $(date -u +%FT%TZ) from $from, commit $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ' (with changes)')"
    grep -E "^CMAKE_CXX_COMPILER:|^Torch_DIR:|^TENSORTAP_WITH_CUDA:" "$from/CMakeCache.txt"
  } >"$PACK/built.txt"
  du -sh "$PACK"
}

build() {
  unpack_debs
  {
    nvidia-smi || true
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "devices", torch.cuda.device_count())'
    cmake --version | head -1
    "${CXX:-c++}" --version | head -1
    # Recent wheels ship fmt headers of their own (cmake/fmt.cmake keeps them out): say so.
    if [ -d "$(torch_py)/include/fmt" ]; then echo "torch ships fmt headers: $(torch_py)/include/fmt"; fi
  } >"$RESULTS/build_machine.txt" 2>&1
  local args=(-DTENSORTAP_WITH_HDF5=OFF -DTENSORTAP_BUILD_TESTS=ON -DTENSORTAP_BUILD_BENCH=ON
    -DTENSORTAP_BUILD_EXAMPLES=ON -DTENSORTAP_INSTALL=OFF)
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
    --target tensortap_cuda_tests bench_cuda_engine bench_cuda torch_reference train_mlp train_blowup >"$RESULTS/build.log" 2>&1 || rc=$?
  grep -E "error|warning: unused|FAILED" "$RESULTS/build.log" || true
  if [ "$rc" -ne 0 ]; then
    echo "tensortap: the build failed (exit $rc), see $RESULTS/build.log" >&2
    tail -40 "$RESULTS/build.log" >&2
    return 1
  fi
  # What the compiler read, from ninja's dependency log: no object may have
  # been compiled against torch's own fmt (cmake/fmt.cmake).
  echo "fmt compiled against: $(readlink "$BUILD/fmt_include/fmt")" >>"$RESULTS/build_machine.txt"
  if ninja -C "$BUILD" -t deps | grep -E "torch/include/fmt/" >"$RESULTS/fmt_from_torch.txt"; then
    echo "tensortap: sources were compiled against torch's fmt headers (see $RESULTS/fmt_from_torch.txt)" >&2
    return 1
  fi
  # Where use_programs() looks for them.
  mkdir -p "$BUILD/bin"
  for p in $GPU_PROGRAMS; do ln -sf "$BUILD/$p" "$BUILD/bin/"; done
}

# Seconds left before TENSORTAP_GPU_DEADLINE (a long time without one).
left() {
  local deadline=${TENSORTAP_GPU_DEADLINE:-0}
  [ "$deadline" -gt 0 ] || { echo 3600; return; }
  echo $((deadline - $(date +%s)))
}

# Runs a program within the time left, or says there is none.
bounded() {
  local budget=$(($(left) - 5))
  if [ "$budget" -lt 5 ]; then
    echo "tensortap: no time left for $(basename "$1")"
    return 124
  fi
  timeout -k 5 "$budget" env LD_LIBRARY_PATH="$PROGRAM_LIBS" "$@"
}

run_tests() {
  # The engine against the real runtime, and CUDA tensors through LibTorch;
  # the [slow] case (10,000 captures) too. Then again with one event a step
  # (TENSORTAP_CUDA_BATCH=on): the same records either way.
  local rc=0
  bounded "$BIN/tensortap_cuda_tests" "[gpu]" --durations yes 2>&1 | tee "$RESULTS/tests.txt"
  rc=${PIPESTATUS[0]}
  TENSORTAP_CUDA_BATCH=on bounded "$BIN/tensortap_cuda_tests" "[gpu]" --durations yes 2>&1 |
    tee "$RESULTS/tests_batch_on.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  return "$rc"
}

# The [gpu] cases under compute-sanitizer: memcheck over every case that is
# not [slow], but the one that calls cudaSetDevice with a device that does not
# exist on purpose (memcheck reports the API error it provokes); racecheck over the fused statistics kernels' case (the only
# kernels of ours, and their shared memory); synccheck over those and the
# engine's cases (test_cuda_engine.cpp: its own copies, events and streams).
run_sanitize() {
  command -v compute-sanitizer >/dev/null || {
    echo "tensortap: no compute-sanitizer on this machine" | tee "$RESULTS/sanitize.txt"
    return 1
  }
  # TENSORTAP_GPU_SANITIZE_SECONDS caps the three together (default: what
  # is left): memcheck gets 60% of it, racecheck and synccheck 20% each.
  local total=${TENSORTAP_GPU_SANITIZE_SECONDS:-$(left)}
  [ "$total" -le "$(left)" ] || total=$(left)
  local rc=0 run tool spec share budget status
  for run in "memcheck|60|[gpu]~[slow]~[invalid_device]" "racecheck|20|[fused]" "synccheck|20|[#test_cuda_engine][gpu],[fused]"; do
    IFS='|' read -r tool share spec <<<"$run"
    budget=$((total * share / 100))
    [ "$budget" -le $(($(left) - 10)) ] || budget=$(($(left) - 10))
    if [ "$budget" -lt 20 ]; then
      echo "tensortap: no time left for $tool" | tee "$RESULTS/sanitize_$tool.txt"
      rc=1
      continue
    fi
    echo "== compute-sanitizer --tool $tool, '$spec', at most ${budget}s" | tee "$RESULTS/sanitize_$tool.txt"
    timeout -k 5 "$budget" env LD_LIBRARY_PATH="$PROGRAM_LIBS" compute-sanitizer --tool "$tool" --error-exitcode 99 \
      --print-limit 50 "$BIN/tensortap_cuda_tests" -# "$spec" >>"$RESULTS/sanitize_$tool.txt" 2>&1
    status=$?
    echo "== $tool exit $status$([ "$status" -eq 124 ] && echo ' (out of time)')" | tee -a "$RESULTS/sanitize_$tool.txt"
    tail -4 "$RESULTS/sanitize_$tool.txt"
    [ "$status" -eq 0 ] || rc=1
  done
  return $rc
}

run_bench() {
  local dir
  dir=$(mktemp -d /dev/shm/tensortap-bench-XXXXXX 2>/dev/null || mktemp -d)
  export TENSORTAP_BENCH_DIR=$dir
  # TENSORTAP_GPU_BENCH_FILTER: only those of bench_cuda (a regex).
  local filter="--benchmark_filter=." rc=0
  if [ -n "${TENSORTAP_GPU_BENCH_FILTER:-}" ]; then
    filter="--benchmark_filter=$TENSORTAP_GPU_BENCH_FILTER"
  else
    bounded "$BIN/bench_cuda_engine" --benchmark_out="$RESULTS/bench_cuda_engine.json" \
      --benchmark_out_format=json 2>&1 | tee "$RESULTS/bench_cuda_engine.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  fi
  bounded "$BIN/bench_cuda" "$filter" --benchmark_out="$RESULTS/bench_cuda.json" --benchmark_out_format=json 2>&1 |
    tee "$RESULTS/bench_cuda.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  rm -rf "$dir"
  "$PYTHON" "$ROOT/scripts/gpu_summary.py" "$RESULTS" | tee "$RESULTS/summary.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  return $rc
}

# The demo end to end on the GPU. torch_reference --cuda: every tensor the
# run holds, read back by the Python reader, against .cpu() copies taken at
# capture; the demo MLP trained on the GPU and checked by `inspect --check`;
# the run that blows up, caught by the flight recorder on the GPU.
run_e2e() {
  local work rc=0
  work=$(mktemp -d)
  export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
  {
    "$PYTHON" "$ROOT/tests/python/torch_reference.py" make "$work/ref" &&
      bounded "$BIN/torch_reference" "$work/ref" "$work/ref/run" --cuda &&
      "$PYTHON" "$ROOT/tests/python/torch_reference.py" check "$work/ref" "$work/ref/run" ref-cuda
  } 2>&1 | tee "$RESULTS/e2e.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  {
    TENSORTAP_DEMO_DEVICE=cuda bounded "$BIN/train_mlp" "$work/demo" 300 10 &&
      "$PYTHON" "$ROOT/examples/summarize_run.py" "$work/demo" &&
      "$PYTHON" -m tensortap inspect "$work/demo" --check | tail -3
  } 2>&1 | tee -a "$RESULTS/e2e.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  {
    TENSORTAP_DEMO_DEVICE=cuda bounded "$BIN/train_blowup" "$work/blowup" 100 10 | tail -4 &&
      "$PYTHON" "$ROOT/tests/python/check_flight.py" "$work/blowup" 10
  } 2>&1 | tee -a "$RESULTS/e2e.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  rm -rf "$work"
  echo "== e2e exit $rc" | tee -a "$RESULTS/e2e.txt"
  return $rc
}

# One step profiled with PyTorch's profiler: the streams the copies ran on,
# their overlap with the training's kernels, the kernels per statistics
# vector, and the timeline's picture.
run_profile() {
  local dir
  dir=$(mktemp -d /dev/shm/tensortap-profile-XXXXXX 2>/dev/null || mktemp -d)
  export TENSORTAP_BENCH_DIR=$dir
  {
    bounded "$BIN/bench_cuda" --profile "$dir" &&
      "$PYTHON" "$ROOT/bench/gpu_timeline.py" "$dir" "$RESULTS/timeline.png"
  } 2>&1 | tee "$RESULTS/profile.txt"
  local rc=${PIPESTATUS[0]}
  for f in step_trace stats_trace capture_trace; do
    gzip -c "$dir/$f.json" >"$RESULTS/$f.json.gz" 2>/dev/null || true
  done
  rm -rf "$dir"
  return "$rc"
}

stage() {
  echo "== $1 ($(date -u +%T), $(left)s left)"
  "run_$1" || {
    echo "== $1 FAILED"
    return 1
  }
}

case $WHAT in
  pack) pack ;;
  build) build ;;
  tests | sanitize | bench | e2e | profile)
    use_programs
    machine >/dev/null
    stage "$WHAT"
    ;;
  all)
    use_programs
    machine
    rc=0
    # The quick and telling first; the sanitizers, slowest, take what is left.
    for s in ${TENSORTAP_GPU_STAGES:-tests e2e profile bench sanitize}; do stage "$s" || rc=1; done
    exit $rc
    ;;
  *)
    echo "usage: $0 [pack|build|tests|sanitize|bench|e2e|profile|all]" >&2
    exit 2
    ;;
esac
