# Sourced by scripts/fuzz.sh and scripts/test.sh --sanitize: builds with AddressSanitizer and
# UndefinedBehaviorSanitizer, and the runtime options both use. LibTorch and the other prebuilt
# libraries are not instrumented: what the sanitizers report inside them is suppressed by
# tests/sanitizer/*.supp, where each entry says why.
#
# Two builds, because libFuzzer is clang's while the product is built with GCC:
# - the fuzz targets: clang + libFuzzer into build-fuzz/;
# - the whole test suite: GCC, the compiler colossal ships with, into build-sanitize/, so the code the
#   sanitizers check is the code users run. (Built with clang too, the suite raised no sanitizer
#   report; its three floating-point failures there were a real bug in decoding attention, the
#   GEMV's batch bit-identity resting on the compiler's contraction, and a LayerNorm tolerance too
#   tight for the RelWithDebInfo build: all fixed.)

# sanitizer_build DIR CC CXX [cmake -D options...] -- [targets...]: sets up, configures and builds.
sanitizer_build() {
  local dir="$1" cc="$2" cxx="$3"
  shift 3
  local options=() targets=()
  while (($#)) && [ "$1" != -- ]; do options+=("$1"); shift; done
  (($#)) && shift
  targets=("$@")
  bash scripts/setup.sh
  if [ "$cc" = clang ] && ! command -v clang++ >/dev/null; then
    echo "sanitizers: installing clang (libFuzzer ships with it)" >&2
    apt-get install -y -q clang >/dev/null
  fi
  export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime" CCACHE_BASEDIR="$PWD"
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
  local flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  CC="$cc" CXX="$cxx" cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    "${options[@]}" >/dev/null
  echo "sanitizers: building $dir (the first build takes several minutes)" >&2
  cmake --build "$dir" -j "$(nproc)" ${targets[0]:+--target "${targets[@]}"}
}

# Exports the sanitizers' runtime options: stop at the first report, leaks included.
sanitizer_env() {
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
  export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizer/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="suppressions=$PWD/tests/sanitizer/ubsan.supp:print_stacktrace=1:halt_on_error=1"
}
