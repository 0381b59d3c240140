#!/usr/bin/env bash
# Installs what is missing, builds everything twice and runs the whole test
# suite against each build:
#   build/         Debian's LibTorch 1.13 (CPU), C++17
#   build-torch2/  PyTorch's LibTorch 2.x with CUDA (the torch wheel from
#                  PyPI), C++17; [gpu] cases skip without a device
# Both consumer.cxx20 tests compile all of tensortap in C++20 as well.
#
#   bash scripts/test.sh          # everything (CI runs this)
#   bash scripts/test.sh --fast   # the developer's loop: build/ only, without
#                                 # the tests labelled slow (README)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
FAST=0
case "${1:-}" in
  "") ;;
  --fast) FAST=1 ;;
  *) echo "usage: bash scripts/test.sh [--fast]" >&2; exit 2 ;;
esac
# Each phase's time, and each suite's slowest tests, printed last
# (tests/README.md, "Time").
TENSORTAP_TIMES=$(mktemp)
CTEST_SLOWEST=$(mktemp)
export TENSORTAP_TIMES
START=$SECONDS
timed "packages (apt), the reader, TensorBoard (PyPI)" eval 'install_missing $CORE_PACKAGES $TEST_PACKAGES && install_reader && install_tensorboard'
ARGS=(-DTENSORTAP_BUILD_TESTS=ON -DTENSORTAP_BUILD_EXAMPLES=ON -DTENSORTAP_BUILD_BENCH=ON
  "-DTENSORTAP_TENSORBOARD_DIR=$(tensorboard_dir)")
# The Python twin's tests, and the twin against 1.13 within a tolerance,
# take the wheel's torch (any Python with torch would do).
twin_args() {
  torch2_python -c "import torch" >/dev/null 2>&1 || return 0
  echo "-DTENSORTAP_TWIN_PYTHON=$(torch2_wrapper "$ROOT/build")"
}
times() {
  echo
  cat "$CTEST_SLOWEST"
  echo "time:"
  cat "$TENSORTAP_TIMES"
  printf '  %-58s %5d s\n' "total" $((SECONDS - START))
  rm -f "$TENSORTAP_TIMES" "$CTEST_SLOWEST"
}
if [ $FAST -eq 1 ]; then
  # shellcheck disable=SC2046
  configure_and_build "$ROOT/build" "${ARGS[@]}" $(twin_args)
  CTEST_SUMMARY=$(mktemp)
  rc=0
  timed "build/: ctest -LE slow" run_ctest "$ROOT/build" \
    "LibTorch 1.13 (Debian, CPU), fast loop: without the tests labelled slow" -LE slow || rc=1
  times
  echo
  cat "$CTEST_SUMMARY"
  rm -f "$CTEST_SUMMARY"
  exit $rc
fi
timed "torch $TORCH2_VERSION (PyPI)" install_torch2
# shellcheck disable=SC2046
configure_and_build "$ROOT/build" "${ARGS[@]}" $(twin_args)
configure_and_build_torch2 "$ROOT/build-torch2" "${ARGS[@]}"

CTEST_SUMMARY=$(mktemp)
rc=0
timed "build/: ctest" run_ctest "$ROOT/build" "LibTorch 1.13 (Debian, CPU)" || rc=1
timed "build-torch2/: ctest" run_ctest "$ROOT/build-torch2" "LibTorch $TORCH2_VERSION (PyPI, CUDA)" || rc=1
times
echo
cat "$CTEST_SUMMARY"
# One closing line for both builds.
awk '{ for (i = 1; i <= NF; i++) if ($i == "failed" && $(i+1) == "out") { failed += $(i-2); total += $(i+3) } }
     END { printf "tensortap: %d passed, %d failed\n", total - failed, failed }' "$CTEST_SUMMARY"
rm -f "$CTEST_SUMMARY"
exit $rc
