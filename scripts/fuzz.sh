#!/usr/bin/env bash
# Fuzzes the input boundaries (tests/fuzz) with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer: builds them with clang into build-fuzz/, runs each target for
# --seconds (default 60) starting from its seed corpus and regression inputs, and fails on any finding
# (a crash, a sanitizer report, or an exception other than colossal::Error escaping a parser).
#   scripts/fuzz.sh [--seconds N] [--target NAME]...
# NAME is a directory of tests/fuzz/corpus (every one of them when no --target is given).
# New inputs libFuzzer finds go to build-fuzz/corpus/<target>/ (not the tree); a crashing input is
# left as build-fuzz/crash-<target>-*, to be added to tests/fuzz/regressions/<target>/ once fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60 targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="${2:?--seconds needs a number}"; shift 2 ;;
    --target) targets+=("${2:?--target needs a name}"); shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuzz: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: error: --seconds '$seconds' is not a positive integer" >&2; exit 2; }
all=$(ls tests/fuzz/corpus)
((${#targets[@]})) || mapfile -t targets <<<"$all"
for t in "${targets[@]}"; do
  [ -d "tests/fuzz/corpus/$t" ] || { echo "fuzz: error: --target '$t' is not one of: $(echo $all)" >&2; exit 2; }
done

source scripts/sanitizers.sh
sanitizer_build build-fuzz clang clang++ -DCOLOSSAL_FUZZ=ON -- "${targets[@]/#/fuzz_}"
sanitizer_env
failed=()
for t in "${targets[@]}"; do
  corpus="build-fuzz/corpus/$t"
  mkdir -p "$corpus"
  echo "fuzz: $t for ${seconds}s" >&2
  if ! build-fuzz/tests/fuzz/fuzz_"$t" "$corpus" "tests/fuzz/corpus/$t" "tests/fuzz/regressions/$t" -max_total_time="$seconds" \
      -max_len=65536 -rss_limit_mb=4096 -timeout=10 -artifact_prefix="build-fuzz/crash-$t-" -print_final_stats=1 \
      2>"build-fuzz/$t.log"; then
    failed+=("$t")
    tail -n 30 "build-fuzz/$t.log" >&2
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "build-fuzz/$t.log" | sed "s/^/fuzz: $t: /" >&2 || true
done
((${#failed[@]} == 0)) || { echo "fuzz: findings in: ${failed[*]} (inputs in build-fuzz/crash-*)" >&2; exit 1; }
echo "fuzz: no findings in ${targets[*]} (${seconds}s each)"
