#!/usr/bin/env bash
# Sets up, builds and runs every test (unit, in-process and multi-process).
# GPU tests skip cleanly on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
cd "${SHARDPS_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
