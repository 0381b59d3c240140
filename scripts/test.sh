#!/usr/bin/env bash
# Installs what is missing, builds everything and runs the whole test suite.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing $CORE_PACKAGES $TEST_PACKAGES
install_reader
configure_and_build "$ROOT/build" -DTENSORTAP_BUILD_TESTS=ON -DTENSORTAP_BUILD_EXAMPLES=ON -DTENSORTAP_BUILD_BENCH=ON
cd "$ROOT/build"
ctest --output-on-failure --parallel 2 --timeout 900
