#!/usr/bin/env bash
# Configures and builds mcprun with warnings as errors. BUILD_DIR (default build) and any extra
# CMake arguments can be given: scripts/build.sh -DMCPRUN_SANITIZE=ON
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DMCPRUN_WERROR=ON "$@" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
