#!/usr/bin/env bash
# Configures and builds a clang tree with sanitizers (CMake SHARDPS_SANITIZE):
#   tools/sanitize_build.sh address|thread [ninja targets...]
# address -> build-asan (ASan + UBSan, and libFuzzer coverage: the fuzz
# harnesses are built here), thread -> build-tsan (TSan). Both check the lock
# annotations (-Wthread-safety -Werror=thread-safety). Prints the tree's path
# last. SHARDPS_SANITIZE_BUILD_DIR overrides the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
case $kind in
  address) build=${SHARDPS_SANITIZE_BUILD_DIR:-build-asan} ;;
  thread) build=${SHARDPS_SANITIZE_BUILD_DIR:-build-tsan} ;;
  *) echo "sanitize_build: the sanitizer must be 'address' or 'thread', not '$kind'" >&2; exit 2 ;;
esac
shift
tools/setup.sh --clang >&2
# -O1: sanitizer reports keep useful stacks and the tree builds faster than -O2.
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DSHARDPS_SANITIZE="$kind" >&2
cmake --build "$build" -j "$(nproc)" ${1:+--target "$@"} >&2
echo "$build"
