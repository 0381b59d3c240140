#!/usr/bin/env bash
# Installs what is missing, builds, trains the demo MLP with tensortap
# watching, then reads the run back with NumPy and prints a summary; then a
# run that blows up, and what the flight recorder caught.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing $CORE_PACKAGES
install_reader
configure_and_build "$ROOT/build" -DTENSORTAP_BUILD_EXAMPLES=ON -DTENSORTAP_BUILD_TESTS=OFF -DTENSORTAP_BUILD_BENCH=OFF
cd "$ROOT"
./build/examples/train_mlp runs/demo 300 10
PYTHONPATH="$ROOT/python" "$(numpy_python)" examples/summarize_run.py runs/demo
PYTHONPATH="$ROOT/python" "$(numpy_python)" examples/plot_run.py runs/demo runs/demo/plots
PYTHONPATH="$ROOT/python" "$(numpy_python)" -m tensortap inspect runs/demo --check | tail -1
# A run that blows up, caught by the flight recorder.
./build/examples/train_blowup runs/blowup | tail -3
PYTHONPATH="$ROOT/python" "$(numpy_python)" examples/plot_blowup.py runs/blowup runs/blowup/plots
# A loss spike that recovers, caught by the spike trigger.
./build/examples/train_spike runs/spike | tail -2
PYTHONPATH="$ROOT/python" "$(numpy_python)" examples/plot_spike.py runs/spike runs/spike/plots
# The same run in pandas, and as one page to open in a browser.
PYTHONPATH="$ROOT/python" "$(numpy_python)" examples/analyse_with_pandas.py runs/spike 20
PYTHONPATH="$ROOT/python" "$(numpy_python)" -m tensortap report runs/spike -o runs/spike/report.html
