#!/usr/bin/env bash
# Issue 33's measure of the front end: instructions on the training thread
# per sampled record of 1 KiB, copy and the step's share included, counted by
# callgrind (which the machine's noise does not move): BM_Capture64x1K, 2,000
# steps of 64 captures each from its own tensor under its own name, with a
# recorder sampling every step minus one sampling none, in FrontEnd::step and
# FrontEnd::capture and all they call.
#
#   bash bench/hot_path_64x1k.sh [BUILD_DIR=build]
set -euo pipefail
BUILD=${1:-build}
BIN=$BUILD/bench/bench_hot_path
[ -x "$BIN" ] || { echo "no $BIN: build the benchmarks first" >&2; exit 1; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
work=$(mktemp -d /dev/shm/tt-hot-XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$work"' EXIT
count() {
  local arg=$1 what=${2:-both}
  local toggles=(--toggle-collect='tensortap::detail::FrontEnd::step*')
  [ "$what" = both ] && toggles+=(--toggle-collect='tensortap::detail::FrontEnd::capture*')
  (cd "$work" && rm -f callgrind.out.* &&
    TENSORTAP_BENCH_DIR=$work valgrind --tool=callgrind --separate-threads=yes "${toggles[@]}" \
      "$BIN" --benchmark_filter="BM_Capture64x1K/$arg/" >/dev/null 2>&1)
  # Thread 1 is the training thread (the benchmark's).
  awk '/^(summary|totals):/ {print $2; exit}' "$work"/callgrind.out.*-01
}
off=$(count 0)
on=$(count 1)
records=$((2000 * 64))
echo "instructions in step() and capture(), training thread, 2,000 steps of 64 captures of 1 KiB:"
echo "  sampling none:  $off"
echo "  sampling every: $on"
echo "  per sampled record (on - off) / $records: $(( (on - off) / records ))"
step=$(count 0 step)
echo "instructions in step() alone, sampling none: $step, $(( step / 2000 )) a step"
