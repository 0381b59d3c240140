# Shared by scripts/demo.sh, scripts/test.sh and scripts/bench.sh. Sourced, not run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Debian packages tensortap builds, tests and demos with.
CORE_PACKAGES="cmake g++ make ninja-build libtorch-dev libfmt-dev catch2 libbenchmark-dev
  libhdf5-dev python3 python3-numpy python3-h5py python3-matplotlib python3-pip python3-setuptools libgloo-dev
  python3-pandas python3-xarray python3-dask python3-tqdm"

# What only the tests need: a real browser that renders `tensortap report`'s
# page (tests/test_analysis.py).
TEST_PACKAGES="chromium chromium-driver python3-selenium"

# Debian packages the GPU machine (no network, PyTorch's LibTorch) needs to
# build tensortap's tests and benchmarks: scripts/fetch_debs.sh downloads
# them into .deb/, scripts/gpu.sh unpacks them there. Runtime libraries
# (libfmt9, libbenchmark1debian) come with their -dev packages.
GPU_DEB_PACKAGES="catch2 libfmt-dev libfmt9 libbenchmark-dev libbenchmark1debian"

# Installs the packages of $* that are missing; asks apt only if one is.
install_missing() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "tensortap: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The Python that sees Debian's numpy. `python3` on PATH may be a pyenv
# interpreter without it, so /usr/bin/python3 comes first.
numpy_python() {
  for py in /usr/bin/python3 python3; do
    if "$py" -c "import numpy" >/dev/null 2>&1; then
      echo "$py"
      return 0
    fi
  done
  echo "tensortap: no python3 with numpy found" >&2
  return 1
}

# Installs the reader for the Python that sees Debian's NumPy, so that
# `tensortap inspect RUN` works as a command whatever `python3` on PATH is.
# Offline: no index, no build isolation (Debian's setuptools builds it).
install_reader() {
  local py
  py=$(numpy_python)
  PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip install -q --no-deps --no-build-isolation \
    --break-system-packages "$ROOT/python" 2>&1 | grep -v "Running pip as the 'root' user" || true
  rm -rf "$ROOT/python/build" "$ROOT"/python/*.egg-info
  "$py" -c "import tensortap" || { echo "tensortap: the reader did not install for $py" >&2; return 1; }
}

# configure_and_build BUILD_DIR [cmake args...]
configure_and_build() {
  local dir=$1
  shift
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTENSORTAP_PYTHON="$(numpy_python)" "$@"
  cmake --build "$dir" --parallel "$(nproc)"
}
