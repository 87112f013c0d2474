#!/usr/bin/env bash
# The one test command: installs dependencies, builds, runs every test, then repeats the suite
# on an AddressSanitizer + UndefinedBehaviorSanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

echo "== build (RelWithDebInfo, -Werror)"
BUILD_DIR=build scripts/build.sh
echo "== tests"
(cd build && ctest --output-on-failure -j 2)

echo "== build (ASan + UBSan)"
BUILD_DIR=build-asan BUILD_TYPE=Debug scripts/build.sh -DMCPRUN_SANITIZE=ON
echo "== tests under ASan + UBSan"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j 2)

echo "== fuzzing (libFuzzer + ASan + UBSan, bounded)"
scripts/fuzz.sh
