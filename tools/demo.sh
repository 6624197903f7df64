#!/usr/bin/env bash
# Sets up, builds and runs the demo: a scheduler, 2 servers and 2 workers as
# processes on this machine train an MLP on Fashion-MNIST (sync, 3 epochs) and
# report test accuracy. Extra arguments go to `shardps local`
# (e.g. --consistency async, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
exec "${SHARDPS_BUILD_DIR:-build}/tools/shardps" local --servers 2 --workers 2 --consistency sync --epochs 3 "$@"
