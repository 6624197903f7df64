#!/usr/bin/env bash
# Cost of Prometheus metrics on the data path: `shardps bench` 4 KiB push-pull
# round trips with the servers' metrics off and on, alternating within one
# invocation (PAIRS pairs), and the ratio of the medians (on / off). On a
# shared machine, run it when nothing else is busy: the spread between runs
# is larger than the cost it measures.
# Usage: tools/metrics_overhead.sh [PAIRS] [ITERS]   (defaults 9 and 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-9}
iters=${2:-20000}
shardps=${SHARDPS_BINARY:-${SHARDPS_BUILD_DIR:-build}/tools/shardps}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((i = 0; i < pairs; i++)); do
  for mode in off on; do
    extra=()
    [ "$mode" = on ] && extra=(--metrics-listen 127.0.0.1:0)
    line=$("$shardps" bench --bytes 4096 --iters "$iters" --warmup 1000 --json "${extra[@]}" 2>/dev/null | tail -1)
    echo "$mode $line" >>"$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
runs = {"off": [], "on": []}
for line in open(sys.argv[1]):
    mode, text = line.split(" ", 1)
    runs[mode].append(json.loads(text))
def med(mode, key):
    return statistics.median(r[key] for r in runs[mode])
for key in ("round_trips_per_s", "p50_us"):
    print(f"{key}: metrics off {med('off', key):.1f}, on {med('on', key):.1f}, "
          f"on/off {med('on', key) / med('off', key):.3f}")
# Each run also measures raw ZeroMQ round trips interleaved with its own: the
# ratio to it cancels load that other processes put on the machine.
print(f"round trips per raw ZeroMQ round trip: metrics off {med('off', 'goodput_ratio'):.3f}, "
      f"on {med('on', 'goodput_ratio'):.3f}, on/off {med('on', 'goodput_ratio') / med('off', 'goodput_ratio'):.3f}")
PY
