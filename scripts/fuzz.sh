#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz/ and runs each for
# FUZZ_SECONDS (default 40) on its seeds: about 4 minutes on 2 cores once built. A crash stops the
# script; libFuzzer writes its input to tests/fuzz/regressions/<target>/, which
# fuzz_regression_test replays once committed. FUZZ_BUILD_DIR names a build already configured
# with -DMCPRUN_FUZZ=ON to build the targets in instead (scripts/test.sh's sanitizer build).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-40}
targets=(frames store_protocol timer_lines job_file command_line)
build=${FUZZ_BUILD_DIR:-build-fuzz}
if [ -z "${FUZZ_BUILD_DIR:-}" ]; then
  CC=${FUZZ_CC:-clang-14} CXX=${FUZZ_CXX:-clang++-14} cmake -S . -B build-fuzz \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMCPRUN_FUZZ=ON -DMCPRUN_WERROR=OFF >/dev/null
elif ! grep -q '^MCPRUN_FUZZ:BOOL=ON$' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "fuzz: FUZZ_BUILD_DIR=$build is not configured with -DMCPRUN_FUZZ=ON" >&2
  exit 2
fi
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
for target in "${targets[@]}"; do
  work=$build/corpus/$target  # What this run learns; the committed seeds stay as they are.
  mkdir -p "$work" "tests/fuzz/regressions/$target"
  echo "== fuzz $target (${seconds} s)"
  log=$build/fuzz_$target.log
  if ! "$build/tests/fuzz/fuzz_$target" -max_total_time="$seconds" -max_len=8192 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="tests/fuzz/regressions/$target/" \
      "$work" "tests/fuzz/corpus/$target" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "fuzz $target: crashed; the input is in tests/fuzz/regressions/$target/"
    exit 1
  fi
  grep -E "DONE|stat::number_of_executed_units" "$log"
done
