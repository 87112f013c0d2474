#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz/ at -O2 and runs each for
# FUZZ_SECONDS (default 40) on its seeds, through its ctest entry fuzz.<target>
# (tests/fuzz/CMakeLists.txt): about 2 minutes on 2 cores once built, a target per CPU. A crash
# fails the entry, and libFuzzer's input is left in tests/fuzz/regressions/<target>/, which
# fuzz_regression_test replays once committed. FUZZ_BUILD_DIR names a build already configured
# with -DMCPRUN_FUZZ=ON to run the targets of instead.
set -euo pipefail
cd "$(dirname "$0")/.."
export FUZZ_SECONDS=${FUZZ_SECONDS:-40}
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
cd "$build" && ctest --output-on-failure -j "$(nproc)" -R '^fuzz\.'
