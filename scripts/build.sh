#!/usr/bin/env bash
# Configures and builds mcprun with warnings as errors. BUILD_DIR (default build) and any extra
# CMake arguments can be given: scripts/build.sh -DMCPRUN_SANITIZE=ON. With --programs first, only
# mcprun, rendezvousd and the workers' helper module: what a job needs, none of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
targets=()
if [ "${1:-}" = --programs ]; then
  targets=(--target mcprun rendezvousd mcprun_python)
  shift
fi
# Through ccache where it is installed, with the paths under the repository relative to the build
# folder and the folder itself out of the hash: the wheel's build (tests/e2e/test_wheel.py), in
# another folder beside this one, reuses these objects, and so does a build folder made again.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_NOHASHDIR=1 CCACHE_BASEDIR=$PWD
fi
# A unity build (a library's sources compiled eight to a file) takes under half the CPU time of one
# file at a time; -DCMAKE_UNITY_BUILD=OFF after it for a folder where one file changes at a time.
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DMCPRUN_WERROR=ON \
  -DCMAKE_UNITY_BUILD=ON "${launcher[@]}" "$@" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
