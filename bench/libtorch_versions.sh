#!/usr/bin/env bash
# The same benchmarks against both LibTorch builds of scripts/test.sh, in one
# run: Debian's 1.13 (build/) and PyPI's 2.11 with CUDA (build-torch2/).
#
#   bash scripts/test.sh                 # builds both (or an earlier run did)
#   bash bench/libtorch_versions.sh      # about 6 minutes on 2 cores
#
# 1. Instructions on the training thread for step() + one sampled 1 KiB
#    capture (callgrind: the same count whatever the machine's noise), the
#    command of bench/README.md's "Profile of the sampled hot path".
# 2. Training overhead of the demo MLP and the CNN, every mode, as ratios to
#    the same build's own "off" in the same process (bench_training).
# Results: build-torch2/libtorch_versions/ (raw outputs) and the table printed.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
OUT=$ROOT/build-torch2/libtorch_versions
rm -rf "$OUT" && mkdir -p "$OUT"
export TENSORTAP_BENCH_DIR=${TENSORTAP_BENCH_DIR:-$(mktemp -d /dev/shm/tensortap-bench-XXXXXX 2>/dev/null || mktemp -d)}
for b in build build-torch2; do
  [ -x "$ROOT/$b/bench/bench_hot_path" ] || { echo "no $b/bench/bench_hot_path: run scripts/test.sh first" >&2; exit 1; }
done

echo "| LibTorch | instructions, step() + 1 KiB capture |"
echo "| --- | --- |"
for b in build build-torch2; do
  (cd "$OUT" && valgrind --tool=callgrind --callgrind-out-file="$OUT/$b.callgrind" \
    --toggle-collect='tensortap::detail::FrontEnd::capture*' --toggle-collect='tensortap::detail::FrontEnd::step*' \
    "$ROOT/$b/bench/bench_hot_path" --benchmark_filter='BM_CaptureSampled/1024/' >"$OUT/$b.hot_path.txt" 2>&1)
  total=$(callgrind_annotate "$OUT/$b.callgrind" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  # The benchmark runs a known number of iterations; it prints them.
  iters=$(awk '/^BM_CaptureSampled\/1024\// {print $6; exit}' "$OUT/$b.hot_path.txt")
  echo "| $b | $((total / iters)) ($total over $iters iterations) |"
done

echo
for b in build build-torch2; do
  echo "== $b: bench_training"
  "$ROOT/$b/bench/bench_training" --reps 3 --json "$OUT/$b.training.json" | tee "$OUT/$b.training.txt"
done
rm -rf "$TENSORTAP_BENCH_DIR"
