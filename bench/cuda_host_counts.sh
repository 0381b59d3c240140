#!/usr/bin/env bash
# What one CUDA capture costs the training thread's host side, counted
# without a GPU (bench/README.md, "The CUDA capture's host side"):
#   1. bench_cuda_host's own counts: heap allocations, mutex acquisitions,
#      condition signals, CUDA runtime calls a capture, and the runtime
#      calls by thread (training, copier, writer) and by call; it ends with
#      the line docs/design.md fixes ("runtime calls, training thread: ...");
#   2. futex system calls a capture on the training thread (strace, between
#      the program's two marker writes to /dev/null);
#   3. instructions a capture (callgrind, measured_capture only).
# None of them moves with the machine's noise.
#
#   bash bench/cuda_host_counts.sh [BUILD_DIR] [BYTES]   # default build, 4096
set -euo pipefail
build=${1:-build}
bytes=${2:-4096}
bench="$build/bench/bench_cuda_host"
if [[ ! -x $bench ]]; then
  echo "cuda_host_counts: no $bench (it is built where LibTorch has no CUDA and the CUDA toolkit is found:" \
       "the 1.13 tree, build/)" >&2
  exit 2
fi
for tool in strace valgrind callgrind_annotate; do
  command -v $tool >/dev/null || { echo "cuda_host_counts: $tool is needed" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
captures=20000

echo "== counts (bench_cuda_host --captures $captures --bytes $bytes)"
"$bench" --captures $captures --bytes "$bytes" | tee "$work/counts"

echo "== futex system calls of the training thread (strace)"
strace -f -qq -e trace=futex,write -o "$work/trace" "$bench" --captures $captures --bytes "$bytes" > "$work/out"
tid=$(sed -n 's/^training thread \([0-9]*\)$/\1/p' "$work/out")
# The training thread's lines between its two markers (strace -f: "TID syscall(...").
# The flushes between steps wait for the copier by design: left out.
futex=$(awk -v tid="$tid" '
  $1 != tid { next }
  /tensortap-bench-begin/ { on = 1; next }
  /tensortap-bench-end/ { on = 0 }
  /tensortap-flush-begin/ { flushing = 1 }
  /tensortap-flush-end/ { flushing = 0 }
  on && !flushing && /futex\(/ { n++ }
  END { print n + 0 }' "$work/trace")
echo "  $futex futex calls in $captures captures: $(awk -v f="$futex" -v n=$captures 'BEGIN { printf "%.3f", f / n }') a capture"

echo "== instructions a capture (callgrind, measured_capture)"
valgrind --tool=callgrind --callgrind-out-file="$work/cg" --toggle-collect='*measured_capture*' \
  "$bench" --captures 2000 --bytes "$bytes" > /dev/null 2> "$work/cg.log"
callgrind_annotate --inclusive=yes "$work/cg" > "$work/cg.txt" 2>/dev/null
total=$(sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' "$work/cg.txt" | tr -d ,)
# The fake runtime's entry points, with what they call: not the real
# runtime's cost, left out (none of them calls another).
runtime=$(awk '/\?\?\?:cuda[A-Z][A-Za-z]* \[/ { gsub(",", "", $1); n += $1 } END { print n + 0 }' "$work/cg.txt")
if [[ -z $total || $total -eq 0 ]]; then
  echo "cuda_host_counts: callgrind counted nothing in measured_capture" >&2
  exit 1
fi
echo "  $total instructions in 2000 captures, $runtime of them in the fake runtime's entry points:" \
     "$(( (total - runtime) / 2000 )) a capture without them ($((total / 2000)) with)"

echo "== counts with one event a step (bench_cuda_host --captures $captures --bytes $bytes --batch on)"
"$bench" --captures $captures --bytes "$bytes" --batch on | tee "$work/counts-on"

# Last, the figures docs/design.md fixes, off then on.
grep -E '^runtime calls, training thread' "$work/counts" "$work/counts-on" | sed 's/^[^:]*://'
