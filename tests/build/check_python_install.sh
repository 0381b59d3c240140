#!/bin/sh
# The reader's install path, as README's "Reading a run" gives it: into a
# fresh virtual environment that sees the system's NumPy, from a copy of
# python/ (pip writes build files beside the sources), without the network.
# Then the `tensortap` command runs from the environment, the package
# imports from there (not from the source tree) and says the version the C++
# library was built as (one source: python/tensortap/_version.py).
#   check_python_install.sh PYTHON SOURCE_DIR WORK_DIR VERSION
set -eu
py=$1 src=$2 work=$3 want=$4
rm -rf "$work"
mkdir -p "$work"
cp -r "$src/python" "$work/python"
rm -rf "$work/python/build" "$work/python/"*.egg-info
"$py" -m venv --system-site-packages "$work/venv"
PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$work/venv/bin/python" -m pip install -q --no-deps \
  --no-build-isolation "$work/python"
cd "$work"
"$work/venv/bin/tensortap" --help >/dev/null
got=$(env -u PYTHONPATH "$work/venv/bin/python" -c '
import os, sys, tensortap
where = os.path.realpath(tensortap.__file__)
assert where.startswith(os.path.realpath(sys.prefix)), where
print(tensortap.__version__)')
if [ "$got" != "$want" ]; then
  echo "FAIL: the installed reader says version $got, the library $want"
  exit 1
fi
echo "OK: tensortap $got installed in a fresh virtual environment, its command runs"
rm -rf "$work"
