#!/usr/bin/env bash
# Sets up, builds and runs every test (unit, in-process and multi-process).
# GPU tests skip cleanly on a machine without a GPU.
#   tools/test.sh [--sanitize address|thread] [ctest arguments...]
# --sanitize builds and tests a separate clang tree instead: address = ASan +
# UBSan (build-asan), thread = TSan (build-tsan); any report fails its test.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  build=$(tools/sanitize_build.sh "${2:-}")
  shift 2
  # A report ends the process with an error; leaks are reported at exit.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan/suppressions.txt}
  cd "$build"
  exec ctest --output-on-failure -j "$(nproc)" --timeout 1800 "$@"
fi
tools/build.sh
cd "${SHARDPS_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
