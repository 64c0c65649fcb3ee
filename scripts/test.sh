#!/usr/bin/env bash
# Sets everything up, builds colossal and its tests, and runs the whole suite with ctest.
#   scripts/test.sh [--sanitize] [ctest arguments, e.g. -L unit, -R Recipe]
# --sanitize builds with AddressSanitizer and UndefinedBehaviorSanitizer into build-sanitize/
# (scripts/sanitizers.sh) and runs the same suite there, the fuzz targets' seed and regression
# replays included; any sanitizer report fails the test that made it.
set -euo pipefail
cd "$(dirname "$0")/.."
# One test process per core: each uses one thread, or declares PROCESSORS (tests/CMakeLists.txt).
jobs="${COLOSSAL_TEST_JOBS:-$(nproc)}"
if [ "${1:-}" = --sanitize ]; then
  shift
  source scripts/sanitizers.sh
  sanitizer_build build-sanitize gcc g++
  sanitizer_env
  cd build-sanitize
  # Instrumented code runs 2-3x slower: the per-test limit grows with it.
  ctest --output-on-failure --parallel "$jobs" --timeout 2700 "$@"
  exit
fi
BUILD_TESTING=ON bash scripts/build.sh
cd "${COLOSSAL_BUILD_DIR:-build}"
ctest --output-on-failure --parallel "$jobs" --timeout 900 "$@"
