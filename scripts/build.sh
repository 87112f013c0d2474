#!/usr/bin/env bash
# Configures and builds mcprun with warnings as errors. BUILD_DIR (default build) and any extra
# CMake arguments can be given: scripts/build.sh -DMCPRUN_SANITIZE=ON. With --programs first, only
# mcprun, rendezvousd and the workers' helper module: what a job needs, none of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
targets=()
# A unity build (a library's sources compiled eight to a file) takes under half the CPU time of one
# file at a time. Not by default: the wheel's build reuses this build's objects through ccache
# only where their compile lines name the same source files (tests/e2e/test_wheel.py).
unity=OFF
if [ "${1:-}" = --programs ]; then
  targets=(--target mcprun rendezvousd mcprun_python)
  unity=ON
  shift
fi
# Through ccache where it is installed, so that the wheel's build (tests/e2e/test_wheel.py), whose
# compile lines are these in another folder, reuses these objects: the folder stays out of the hash.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_NOHASHDIR=1 CCACHE_BASEDIR=
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DMCPRUN_WERROR=ON \
  -DCMAKE_UNITY_BUILD=$unity "${launcher[@]}" "$@" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
