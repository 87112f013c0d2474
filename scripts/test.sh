#!/usr/bin/env bash
# The one test command: installs dependencies, builds, runs every test (each end-to-end suite on
# torch 1.13 and 2.13), then repeats the suite on an AddressSanitizer + UndefinedBehaviorSanitizer
# build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

echo "== build (RelWithDebInfo, -Werror)"
BUILD_DIR=build scripts/build.sh
echo "== tests"
(cd build && ctest --output-on-failure -j 2)

echo "== build (ASan + UBSan)"
BUILD_DIR=build-asan BUILD_TYPE=Debug scripts/build.sh -DMCPRUN_SANITIZE=ON
# The sanitizers check mcprun's own memory: one torch suffices, and 2.13 drives more of the job
# store (its dialect's handshake, PING, queues) than 1.13, whose dialect the unit tests replay.
echo "== tests under ASan + UBSan (end-to-end on torch 2.13)"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j 2 -E 'torch1\.13$')

echo "== fuzzing (libFuzzer + ASan + UBSan, bounded)"
scripts/fuzz.sh
