#!/usr/bin/env bash
# The one test command: installs dependencies, builds the programs with gcc and runs the end-to-end
# suites on torch 1.13 against them while clang builds everything with AddressSanitizer +
# UndefinedBehaviorSanitizer at idle priority, then runs the unit tests, the suites on torch 2.13
# and 10 s of fuzzing a target in that build. Each end-to-end suite that starts torch workers runs
# once per torch. Ends with where the suites' time went and each phase's time, also when one fails.
set -euo pipefail
cd "$(dirname "$0")/.."
phases=()
suite_times() {  # Where the suites' time went, from tests/e2e/run_suite.py's records.
  local dir
  for dir in build/suite-times build-sanitizers/suite-times; do
    [ -d "$dir" ] || continue
    echo "== end-to-end suites in ${dir%/suite-times}: wall s, CPU s (the suite and what it waited for)"
    find "$dir" -type f ! -name '*.tests' -exec cat {} + | sort -k2,2nr |
      awk '{ wall += $1; cpu += $2 } NR <= 15 { printf "%5d %5d  %s\n", $1, $2, $3 }
           END { printf "%5d %5d  all %d suites\n", wall, cpu, NR }'
    echo "== the end-to-end tests in ${dir%/suite-times} that took most CPU: wall s, CPU s"
    find "$dir" -type f -name '*.tests' -exec cat {} + | sort -k2,2nr |
      awk 'NR <= 15 { printf "%5d %5d  %s %s\n", $1, $2, $3, $4 }'
  done
}
# A report that cannot be read never changes the test command's exit status.
clang_build=
finish() {
  # An interrupted run leaves no compiler behind (the build runs in its own process group).
  [ -z "$clang_build" ] || kill -- "-$clang_build" 2>/dev/null || true
  suite_times || true
  echo "== phase times"
  printf "%s\n" "${phases[@]}"
}
trap finish EXIT
phase() {  # phase NAME COMMAND...: runs it and records how long it took, and how it failed.
  local name=$1 start=$SECONDS status=0
  shift
  echo "== $name"
  "$@" || status=$?
  phases+=("$(printf '%5d s  %s' $((SECONDS - start)) "$name")$([ $status -eq 0 ] || echo " (failed: exit $status)")")
  return $status
}
in_dir() { (cd "$1" && shift && "$@"); }

phase "install" scripts/install-deps.sh

# Seconds, before the builds: a file out of .clang-format's style fails here, naming the lines.
phase "format (clang-format --dry-run -Werror)" \
  bash -c 'git ls-files -z "*.cpp" "*.hpp" | xargs -0 clang-format-14 --dry-run -Werror'

# The programs and the scale suite's load generators: what the suites below run. The unit tests are
# built once, in the sanitizer build, where they check more.
phase "build (gcc, RelWithDebInfo, -Werror)" env BUILD_DIR=build scripts/build.sh -DMCPRUN_UNIT_TESTS=OFF

# One clang build serves the unit tests, the sanitizers and the fuzz targets, which need clang: no
# third build. Line tables are all a sanitizer's report needs, and -O0 compiles in less than half the
# time of -O1, which only a long fuzzing run would repay (FUZZ_SECONDS=600 scripts/fuzz.sh builds at
# -O2). At idle priority (SCHED_IDLE), beside the 1.13 suites: it takes only the CPU they leave
# while they wait on their timeouts, and their watchdogs hold beside a build as beside any load.
clang_log=$(mktemp)
setsid -w chrt --idle 0 env BUILD_DIR=build-sanitizers BUILD_TYPE=Debug scripts/build.sh \
  -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only -DMCPRUN_SANITIZE=ON \
  -DMCPRUN_FUZZ=ON -DMCPRUN_BENCHMARKS=OFF >"$clang_log" 2>&1 &
clang_build=$! clang_start=$SECONDS
wait_for_clang_build() {
  local status=0
  wait "$clang_build" || status=$?
  clang_build=
  cat "$clang_log"
  echo "(the clang build took $((SECONDS - clang_start)) s from its start beside the 1.13 suites)"
  return $status
}

# ctest's -j: every test takes the half-CPU slots of cpus.json that its CPU use asks for
# (tests/CMakeLists.txt), so -j only makes room for the few that take none.
jobs=$(($(nproc) * 4))
# The end-to-end suites on torch 1.13; their torch 2.13 twins run under the sanitizers below, so
# every suite still meets both torches, and mcprun's code, which is the same for both, is not run
# twice more than that. A suite with no torch runs once: here what times or draws what a person
# sees (terminal, scale), there what feeds the daemon hostile input or drives the etcd client's
# threads.
rm -rf build/suite-times build-sanitizers/suite-times
phase "tests (torch 1.13)" in_dir build ctest --output-on-failure -j "$jobs" \
  -E 'torch2\.13$|^e2e\.test_(hostile_peers|service|docs|etcd)$'
phase "build (clang, ASan + UBSan, fuzz targets, -Werror): the wait after the 1.13 suites" \
  wait_for_clang_build
# The sanitizers check mcprun's own memory on every suite, and the fuzz targets (fuzz.<target>,
# $FUZZ_SECONDS a target) run beside the suites; crashes found before are replayed every run by
# fuzz_regression_test, and FUZZ_SECONDS=600 scripts/fuzz.sh digs deeper. 2.13 drives more of the
# job store (its dialect's handshake, PING, queues) than 1.13, whose dialect the unit tests replay
# here too. The chaos test ran above, once: it watches the daemon's RSS round to round, which ASan's
# quarantine grows by design; so did the terminal and scale suites, whose load generators this
# build skips.
phase "tests under ASan + UBSan (torch 2.13)" in_dir build-sanitizers \
  env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j "$jobs" -E 'torch1\.13$|^e2e\.test_(chaos|terminal)$'

