#!/bin/sh
# Builds and runs tests/consumer against tensortap, as a user's project would.
#   run.sh find_package|add_subdirectory SOURCE_DIR BUILD_DIR WORK_DIR [CXX_STANDARD]
# With a standard (20), the consumer and, through add_subdirectory, all of
# tensortap are compiled in it.
set -eu
mode=$1 src=$2 build=$3 work=$4 std=${5:-17}
rm -rf "$work"
mkdir -p "$work"
gen=""
command -v ninja >/dev/null 2>&1 && gen="-G Ninja"
if [ "$mode" = find_package ]; then
  cmake --install "$build" --prefix "$work/prefix" >/dev/null
  cmake -S "$src/tests/consumer" -B "$work/build" $gen -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$work/prefix" -DTENSORTAP_CONSUME=find_package -DCMAKE_CXX_STANDARD="$std"
else
  cmake -S "$src/tests/consumer" -B "$work/build" $gen -DCMAKE_BUILD_TYPE=Release \
        -DTENSORTAP_CONSUME=add_subdirectory -DTENSORTAP_SOURCE_DIR="$src" -DCMAKE_CXX_STANDARD="$std"
fi
cmake --build "$work/build" --parallel 2
"$work/build/consumer" "$work/run"
