#!/usr/bin/env bash
# Sets everything up, builds colossal and its tests, and runs the whole suite with ctest.
# Extra arguments go to ctest (e.g. -L unit, -R Recipe).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_TESTING=ON bash scripts/build.sh
cd "${COLOSSAL_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 "$@"
