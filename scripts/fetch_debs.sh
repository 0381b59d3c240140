#!/usr/bin/env bash
# Downloads the Debian packages scripts/gpu.sh needs into .deb/ (ignored by
# git), on a machine with a network. The GPU machine has none: name .deb in
# the device tool's `carry` and gpu.sh unpacks them there (dpkg -x, no root).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mkdir -p "$ROOT/.deb"
cd "$ROOT/.deb"
# Replace older versions rather than pile them up.
for p in $GPU_DEB_PACKAGES; do rm -f "${p}"_*.deb; done
apt-get download $GPU_DEB_PACKAGES
ls -l "$ROOT/.deb"/*.deb
