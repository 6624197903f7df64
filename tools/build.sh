#!/usr/bin/env bash
# Installs what the build needs (tools/setup.sh), then configures and builds
# ShardPS into ${SHARDPS_BUILD_DIR:-build}. Re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
build=${SHARDPS_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${SHARDPS_BUILD_TYPE:-RelWithDebInfo} >/dev/null
cmake --build "$build" -j "$(nproc)"
