#!/usr/bin/env bash
# Cost of Prometheus metrics on the data path: RUNS runs of
#   shardps bench --bytes 4096 --iters ITERS --metrics-compare --json
# (4 KiB push-pull round trips against a cluster whose servers serve metrics
# and one whose servers do not, in alternating blocks of the same run), then
# the median of the runs' on/off ratios. On a shared machine single runs
# scatter by more than the cost measured: read the medians.
# Usage: tools/metrics_overhead.sh [RUNS] [ITERS]   (defaults 5 and 50000)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
iters=${2:-50000}
shardps=${SHARDPS_BINARY:-${SHARDPS_BUILD_DIR:-build}/tools/shardps}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((i = 0; i < runs; i++)); do
  "$shardps" bench --bytes 4096 --iters "$iters" --warmup 1000 --metrics-compare --json 2>/dev/null | tail -1 >>"$out"
done
python3 - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
for r in runs:
    print(f"off {r['metrics_off_round_trips_per_s']:9.1f} rt/s p50 {r['metrics_off_p50_us']:6.1f} us | "
          f"on {r['metrics_on_round_trips_per_s']:9.1f} rt/s p50 {r['metrics_on_p50_us']:6.1f} us | "
          f"round trips {r['metrics_goodput_ratio']:.3f}, latency {r['metrics_latency_ratio']:.3f}")
print(f"median of {len(runs)} runs, metrics on / off: round trips "
      f"{statistics.median(r['metrics_goodput_ratio'] for r in runs):.3f}, p50 latency "
      f"{statistics.median(r['metrics_latency_ratio'] for r in runs):.3f}")
PY
