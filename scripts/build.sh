#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and builds colossal into build/ with CMake + Ninja + ccache.
# BUILD_TESTING=OFF skips the test binaries (scripts/run.sh); anything else builds them too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# ccache can reuse objects compiled against the precompiled header only with these sloppiness flags.
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# Paths relative to the checkout, so a fresh clone elsewhere (CI) hits the cache too.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
BUILD_DIR="${COLOSSAL_BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING="${BUILD_TESTING:-ON}" >/dev/null
echo "build: compiling (the first build takes several minutes: LibTorch headers are large)"
cmake --build "$BUILD_DIR" -j "$(nproc)"
