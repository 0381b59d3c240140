#!/bin/sh
# Builds and runs tests/build/consumer against tensortap, as a user's project would.
#   run.sh find_package|add_subdirectory SOURCE_DIR BUILD_DIR WORK_DIR [CXX_STANDARD]
# With a standard (20), the consumer and, through add_subdirectory, all of
# tensortap are compiled in it.
set -eu
mode=$1 src=$2 build=$3 work=$4 std=${5:-17}
rm -rf "$work"
mkdir -p "$work"
gen=""
command -v ninja >/dev/null 2>&1 && gen="-G Ninja"
# The LibTorch, CUDA toolkit and link flags the parent build used
# (tests/CMakeLists.txt writes them), so the consumer builds against the same.
cache=""
[ -f "$build/tests/consumer-cache.cmake" ] && cache="-C $build/tests/consumer-cache.cmake"
if [ "$mode" = find_package ]; then
  cmake --install "$build" --prefix "$work/prefix" >/dev/null
  cmake $cache -S "$src/tests/build/consumer" -B "$work/build" $gen -DCMAKE_BUILD_TYPE=Release \
        -DTENSORTAP_PREFIX="$work/prefix" -DTENSORTAP_CONSUME=find_package -DCMAKE_CXX_STANDARD="$std"
else
  cmake $cache -S "$src/tests/build/consumer" -B "$work/build" $gen -DCMAKE_BUILD_TYPE=Release \
        -DTENSORTAP_CONSUME=add_subdirectory -DTENSORTAP_SOURCE_DIR="$src" -DCMAKE_CXX_STANDARD="$std"
fi
cmake --build "$work/build" --parallel 2
"$work/build/consumer" "$work/run"
