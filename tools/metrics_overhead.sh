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
[[ -x $shardps ]] || { echo "metrics_overhead: no shardps binary at $shardps (build with tools/build.sh, or set SHARDPS_BINARY)" >&2; exit 1; }
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
for ((i = 0; i < runs; i++)); do
  cmd=("$shardps" bench --bytes 4096 --iters "$iters" --warmup 1000 --metrics-compare --json)
  # The bench's own log goes to $err, shown only when a run fails, so the
  # failure names its command and says why.
  if ! line=$("${cmd[@]}" 2>"$err" | tail -1) || [[ $line != "{"* ]]; then
    echo "metrics_overhead: run $((i + 1)) of $runs failed: ${cmd[*]}; its last lines:" >&2
    tail -n 20 "$err" | sed 's/^/    | /' >&2
    exit 1
  fi
  echo "$line" >>"$out"
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
