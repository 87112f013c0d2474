#!/usr/bin/env bash
# The one test command: installs dependencies, builds, runs every test, then builds with
# AddressSanitizer + UndefinedBehaviorSanitizer and runs every test there too, then fuzzes. Each
# end-to-end suite that starts torch workers runs once per torch: on 1.13 against the plain
# build, on 2.13 against the sanitizer build. Prints each phase's time at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
phases=()
phase() {  # phase NAME COMMAND...: runs it and records how long it took.
  local name=$1 start=$SECONDS
  shift
  echo "== $name"
  "$@"
  phases+=("$(printf '%5d s  %s' $((SECONDS - start)) "$name")")
}
in_dir() { (cd "$1" && shift && "$@"); }

phase "install" scripts/install-deps.sh

phase "build (RelWithDebInfo, -Werror)" env BUILD_DIR=build scripts/build.sh
# Unit tests and the end-to-end suites on torch 1.13; their torch 2.13 twins run under the
# sanitizers below, so every suite still meets both torches, and mcprun's code, which is the same
# for both, is not run twice more than that.
phase "tests (torch 1.13)" in_dir build ctest --output-on-failure -j 2 -E 'torch2\.13$'

phase "build (ASan + UBSan)" env BUILD_DIR=build-asan BUILD_TYPE=Debug scripts/build.sh -DMCPRUN_SANITIZE=ON
# The sanitizers check mcprun's own memory on every suite; 2.13 drives more of the job store (its
# dialect's handshake, PING, queues) than 1.13, whose dialect the unit tests replay here too.
phase "tests under ASan + UBSan (torch 2.13)" in_dir build-asan \
  env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j 2 -E 'torch1\.13$'

# 10 s a target in CI finds what a short run finds; crashes found before are replayed every run by
# fuzz_regression_test (both builds above), and FUZZ_SECONDS=600 scripts/fuzz.sh digs deeper.
phase "fuzzing (libFuzzer + ASan + UBSan, bounded)" env FUZZ_SECONDS="${FUZZ_SECONDS:-10}" scripts/fuzz.sh

echo "== phase times"
printf '%s\n' "${phases[@]}"
