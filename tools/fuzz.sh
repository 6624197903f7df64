#!/usr/bin/env bash
# Builds the fuzz harnesses with libFuzzer, ASan and UBSan (the clang tree
# build-asan, see tools/sanitize_build.sh) and runs each for N inputs,
# starting from its seed corpus and regressions (tests/fuzz). What a run
# finds is written to fuzz-out/TARGET/ (crash-*, leak-*, timeout-* files);
# copy such an input into tests/fuzz/regressions/TARGET with its fix.
#   tools/fuzz.sh [--runs N] [--jobs J] [TARGET...]
# TARGETs: data_plane replica codec config scheduler sealed (default: all). --runs defaults
# to 100000 per target; --jobs runs that many targets at once (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=100000
jobs=1
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=${2:?--runs needs a number}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    -*) echo "fuzz: unknown option '$1' (usage: tools/fuzz.sh [--runs N] [--jobs J] [TARGET...])" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(data_plane replica codec config scheduler sealed)
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [ -f "tests/fuzz/${t}_fuzzer.cc" ] || { echo "fuzz: unknown target '$t' (known: ${all[*]})" >&2; exit 2; }
done
build=$(tools/sanitize_build.sh address "${targets[@]/#/fuzz_}")
export GLOG_minloglevel=${GLOG_minloglevel:-3}  # the harnesses' inputs make the daemons log a lot

run_one() {
  local t=$1 out=fuzz-out/$1
  mkdir -p "$out/corpus"
  local inputs=(tests/fuzz/corpus/"$t")
  [ -d tests/fuzz/regressions/"$t" ] && inputs+=(tests/fuzz/regressions/"$t")
  # -timeout: an input running over 10 s is reported as a hang; -rss_limit_mb bounds memory.
  if "$build/tests/fuzz/fuzz_$t" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/" "$out/corpus" "${inputs[@]}" >"$out/log" 2>&1; then
    echo "fuzz: $t: $runs runs, no crash, leak or timeout ($(grep -o 'cov: [0-9]*' "$out/log" | tail -1))"
  else
    echo "fuzz: $t FAILED after $(grep -o '^#[0-9]*' "$out/log" | tail -1 | tr -d '#') runs; see $out/log and $out/" >&2
    tail -30 "$out/log" >&2
    return 1
  fi
}

status=0
pids=()
for t in "${targets[@]}"; do
  run_one "$t" & pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
