#!/usr/bin/env bash
# Installs what is missing, builds the benchmarks (Release, build-bench/), runs
# all of them and prints the tables of bench/README.md with each target met
# or MISSED. About 6 minutes on the project's 2-core machine.
#
#   bash scripts/bench.sh            # everything
#   bash scripts/bench.sh --quick    # one repetition, shorter runs: checks it works, figures not for the README
#
# Files go to /dev/shm (or $TENSORTAP_BENCH_DIR) so the figures are the
# software's, not a disk's; the fsync variants also run on the disk under
# build-bench/. Results: build-bench/results/ (summary.md, the raw JSON and
# CSV), the plot: bench/pictures/scale.png.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
START=$SECONDS

install_missing $CORE_PACKAGES
# The Python peer runs on PyPI's torch (the LibTorch 2.x the suite also
# builds against), installed by install_torch2 into a folder of its own.
install_torch2
PY=$(numpy_python)
"$PY" -c "import matplotlib" || { echo "tensortap: $PY cannot import matplotlib (python3-matplotlib)" >&2; exit 1; }

BUILD="$ROOT/build-bench"
configure_and_build "$BUILD" -DTENSORTAP_BUILD_BENCH=ON -DTENSORTAP_BUILD_TESTS=OFF -DTENSORTAP_BUILD_EXAMPLES=OFF
OUT="$BUILD/results"
rm -rf "$OUT" && mkdir -p "$OUT"
BUILT=$SECONDS

if [ $QUICK -eq 1 ]; then
  GB=(--benchmark_repetitions=1); TRAIN=(--reps 1 --scale 0.2); SCALE=(--reps 1 --quick)
  ANALYSIS=(--reps 1 --names 200 --steps 200); READER=(--reps 1 --names 200 --steps 200); TB=(--reps 1 --steps 50)
  DIFF=(--reps 1 --mib 64 --records 32)
else
  GB=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=true); TRAIN=(--reps 7); SCALE=(--reps 2)
  ANALYSIS=(--reps 3); READER=(--reps 3); TB=(--reps 5 --steps 300); DIFF=(--reps 3)
fi
gbench() {  # gbench NAME BINARY [args...]: Google Benchmark, JSON to $OUT/NAME.json
  local name=$1 bin=$2
  shift 2
  echo "== $name"
  "$BUILD/bench/$bin" "${GB[@]}" --benchmark_out="$OUT/$name.json" --benchmark_out_format=json "$@" >"$OUT/$name.txt"
  grep -E '^BM_' "$OUT/$name.txt" || true
}

gbench hot_path bench_hot_path
gbench writers bench_writers
DISK="$BUILD/bench-disk"
mkdir -p "$DISK"
TENSORTAP_BENCH_DIR="$DISK" gbench writers_disk bench_writers --benchmark_filter=Fsync
echo "== training (tensortap, naive C++ peer)"
"$BUILD/bench/bench_training" "${TRAIN[@]}" --json "$OUT/training.json"
echo "== training (Python peer, torch $TORCH2_VERSION from PyPI)"
torch2_python "$ROOT/bench/peer_python.py" "${TRAIN[@]}" --json "$OUT/python.json"
echo "== scale"
"$BUILD/bench/bench_scale" "${SCALE[@]}" --csv "$OUT/scale.csv"
mkdir -p "$ROOT/bench/pictures"
"$PY" "$ROOT/bench/plot_scale.py" "$OUT/scale.csv" "$ROOT/bench/pictures/scale.png"
if [ -x "$BUILD/bench/bench_tensorboard" ]; then
  echo "== TensorBoard events against statistics alone"
  "$BUILD/bench/bench_tensorboard" "${TB[@]}" --json "$OUT/tensorboard.json" | tee "$OUT/tensorboard.md"
fi
echo "== analysis views (reader)"
"$PY" "$ROOT/bench/bench_analysis.py" "${ANALYSIS[@]}" --json "$OUT/analysis.json" | tee "$OUT/analysis.md"
echo "== the reader at a million index lines"
"$PY" "$ROOT/bench/bench_reader_scale.py" "${READER[@]}" --json "$OUT/reader_scale.json" | tee "$OUT/reader_scale.md"
echo "== tensortap diff against reading both runs"
"$PY" "$ROOT/bench/bench_diff.py" "${DIFF[@]}" --json "$OUT/diff.json" | tee "$OUT/diff.md"

echo
echo "## tensortap benchmarks: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
  "$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1048576)) GiB, $(uname -r)," \
  "LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null), $(date -u +%F)$([ $QUICK -eq 1 ] && echo ', QUICK run')"
echo
"$PY" "$ROOT/bench/summarize.py" "$OUT"
echo "bench: build $((BUILT - START)) s, benchmarks $((SECONDS - BUILT)) s; results in $OUT, plot in bench/pictures/scale.png"
