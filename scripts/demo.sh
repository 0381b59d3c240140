#!/usr/bin/env bash
# Installs what is missing, builds, trains the demo MLP with tensortap
# watching, then reads the run back with NumPy and prints a summary; then a
# run that blows up, and what the flight recorder caught.
#
#   bash scripts/demo.sh            # against Debian's LibTorch 1.13 (build/)
#   bash scripts/demo.sh --torch2   # against PyPI's LibTorch 2.x with CUDA (build-torch2/; downloads it once)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing $CORE_PACKAGES
install_reader
ARGS=(-DTENSORTAP_BUILD_EXAMPLES=ON -DTENSORTAP_BUILD_TESTS=OFF -DTENSORTAP_BUILD_BENCH=OFF)
if [ "${1:-}" = "--torch2" ]; then
  install_torch2
  BUILD=build-torch2
  configure_and_build_torch2 "$ROOT/$BUILD" "${ARGS[@]}"
else
  BUILD=build
  configure_and_build "$ROOT/$BUILD" "${ARGS[@]}"
fi
cd "$ROOT"
./$BUILD/examples/train_mlp runs/demo 300 10
PYTHONPATH="$ROOT/python" "$(numpy_python)" examples/summarize_run.py runs/demo
PYTHONPATH="$ROOT/python" "$(numpy_python)" examples/plot_run.py runs/demo runs/demo/plots
PYTHONPATH="$ROOT/python" "$(numpy_python)" -m tensortap inspect runs/demo --check | tail -1
# A run that blows up, caught by the flight recorder.
./$BUILD/examples/train_blowup runs/blowup | tail -3
PYTHONPATH="$ROOT/python" "$(numpy_python)" examples/plot_blowup.py runs/blowup runs/blowup/plots
# A loss spike that recovers, caught by the spike trigger.
./$BUILD/examples/train_spike runs/spike | tail -2
PYTHONPATH="$ROOT/python" "$(numpy_python)" examples/plot_spike.py runs/spike runs/spike/plots
# The same run in pandas, and as one page to open in a browser.
PYTHONPATH="$ROOT/python" "$(numpy_python)" examples/analyse_with_pandas.py runs/spike 20
PYTHONPATH="$ROOT/python" "$(numpy_python)" -m tensortap report runs/spike -o runs/spike/report.html
