#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds a C consumer with
# pkg-config and a C++ consumer with find_package(ShardPS) against it, and runs
# them as the two workers of one job on a live local cluster (the installed
# `shardps` binary as scheduler and 2 servers on loopback). Also checks that
# the installed library exports nothing but the C ABI.
# Usage (from ctest): install_test.sh BUILD_DIR CONSUMER_SOURCE_DIR VERSION
set -euo pipefail
build=$1 src=$2 version=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/shardps-install-XXXXXX")
prefix=$tmp/prefix
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "install_test: $*" >&2
  for log in "$tmp"/*.log; do [ -f "$log" ] && { echo "--- $log" >&2; tail -20 "$log" >&2; }; done
  exit 1
}

cmake --install "$build" --prefix "$prefix" >/dev/null
lib=$(find "$prefix" -name "libshardps.so.$version" -type f)
[ -n "$lib" ] || fail "libshardps.so.$version not installed"
[ -x "$prefix/bin/shardps" ] || fail "bin/shardps not installed"
soname=$(objdump -p "$lib" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libshardps.so.${version%.*}" ] || fail "SONAME is '$soname'"
exported=$(nm -D --defined-only "$lib" | awk '{print $3}')
foreign=$(grep -v '^shardps_' <<<"$exported" || true)
[ -z "$foreign" ] || fail "exports more than shardps_*: $(head -5 <<<"$foreign")"
grep -qx shardps_version <<<"$exported" || fail "shardps_version is not exported"

export PKG_CONFIG_PATH=$(dirname "$(find "$prefix" -name shardps.pc)")
[ "$(pkg-config --modversion shardps)" = "$version" ] || fail "pkg-config version"
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/c_consumer" "$src/consumer.c" $(pkg-config --cflags --libs shardps) \
  -Wl,-rpath,"$(pkg-config --variable=libdir shardps)"
cmake -S "$src" -B "$tmp/cxx" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DSHARDPS_EXPECTED_VERSION="$version" \
  >"$tmp/cmake.log" 2>&1 || fail "configuring the find_package consumer failed"
cmake --build "$tmp/cxx" >>"$tmp/cmake.log" 2>&1 || fail "building the find_package consumer failed"

cat >"$tmp/cluster.pbtxt" <<'CONFIG'
consistency: SYNC
num_servers: 2
num_workers: 2
partition_bytes: 8
optimizer { kind: SGD learning_rate: 0.5 }
rendezvous_timeout_ms: 30000
CONFIG
"$prefix/bin/shardps" scheduler --listen 127.0.0.1:0 --config "$tmp/cluster.pbtxt" \
  --port-file "$tmp/scheduler.addr" >"$tmp/scheduler.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [ -s "$tmp/scheduler.addr" ] && break; sleep 0.1; done
[ -s "$tmp/scheduler.addr" ] || fail "the scheduler wrote no address"
scheduler=$(cat "$tmp/scheduler.addr")
for i in 0 1; do
  "$prefix/bin/shardps" server --scheduler "$scheduler" --listen tcp://127.0.0.1:0 >"$tmp/server$i.log" 2>&1 &
  pids+=($!)
done

"$tmp/c_consumer" "$scheduler" 0 >"$tmp/c_consumer.log" 2>&1 &
c_pid=$!
pids+=($c_pid)
"$tmp/cxx/consumer" "$scheduler" 1 >"$tmp/cxx_consumer.log" 2>&1 &
cxx_pid=$!
pids+=($cxx_pid)
wait "$c_pid" || fail "the C consumer failed"
wait "$cxx_pid" || fail "the C++ consumer failed"
grep -q "libshardps $version" "$tmp/c_consumer.log" || fail "the C consumer did not report version $version"
echo "install_test: C (pkg-config) and C++ (find_package) consumers trained a step on the installed libshardps $version"
