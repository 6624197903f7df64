#!/usr/bin/env bash
# A real Prometheus scrapes a local ShardPS cluster and reads the push rates
# back through its HTTP API: `shardps bench` runs S servers with
# --metrics-listen (server i on BASE_PORT + i); Prometheus (Debian's package)
# scrapes them every second; while the bench pushes, the script queries
#   rate(shardps_server_requests_total{op=~"push|push_pull"}[5s])
# and passes when every server shows a non-zero push rate and a partition
# version (shardps_server_partition_version) above 0; then that every metric
# the Grafana dashboard names is exported by a scheduler, a server or a
# worker, and that each of its queries evaluates. Not a ctest test:
# it needs the optional Prometheus package (tools/setup.sh --metrics).
# Usage: deploy/metrics_check.sh [--servers S] [--base-port P] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
servers=2 base=19100 keep=0
while (($#)); do
  case $1 in
    --servers) servers=$2; shift 2 ;;
    --base-port) base=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: deploy/metrics_check.sh [--servers S] [--base-port P] [--keep]" >&2; exit 2 ;;
  esac
done
tools/setup.sh --metrics >/dev/null
tools/build.sh >/dev/null
shardps=${SHARDPS_BUILD_DIR:-build}/tools/shardps
prom_port=$((base + 90))
work=$(mktemp -d /tmp/shardps-metrics-check.XXXXXX)
pids=()
bench=
cleanup() {
  local rc=$?
  # The bench in a process group of its own, with the servers it started.
  if [[ -n $bench ]]; then
    kill -TERM -- "-$bench" 2>/dev/null || true
    wait "$bench" 2>/dev/null || true
    # Servers drain (up to a few seconds) before they exit.
    for _ in $(seq 50); do kill -0 -- "-$bench" 2>/dev/null || break; sleep 0.2; done
  fi
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if ((keep)); then echo "work directory kept: $work"; else rm -rf "$work"; fi
  exit $rc
}
trap cleanup EXIT

targets=$(for ((i = 0; i < servers; i++)); do printf '"127.0.0.1:%d",' $((base + i)); done)
cat >"$work/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: shardps-server
    static_configs: [{targets: [${targets%,}]}]
YAML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$prom_port/-/ready" >/dev/null && break; sleep 0.2; done
curl -sf "http://127.0.0.1:$prom_port/-/ready" >/dev/null || { tail "$work/prometheus.log"; echo "FAIL: Prometheus did not start"; exit 1; }
echo "prometheus on 127.0.0.1:$prom_port scraping ${targets%,}"

# About half a minute of 1 MiB push-pulls spread over every server.
setsid "$shardps" bench --servers "$servers" --bytes 1048576 --partition-bytes $((1048576 / (2 * servers))) \
  --iters 20000 --warmup 10 --metrics-listen "127.0.0.1:$base" >"$work/bench.log" 2>&1 &
bench=$!

query='rate(shardps_server_requests_total{op=~"push|push_pull"}[5s])'
result=
for _ in $(seq 60); do
  sleep 1
  kill -0 $bench 2>/dev/null || { cat "$work/bench.log"; echo "FAIL: the bench ended before every server showed a push rate"; exit 1; }
  json=$(curl -sf "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$query") || continue
  # One line per server: "SERVER RATE"; the sum of its push and push_pull series.
  result=$(python3 -c '
import json, sys, collections
rates = collections.defaultdict(float)
for r in json.loads(sys.argv[1])["data"]["result"]:
    rates[r["metric"]["server"]] += float(r["value"][1])
for s in sorted(rates, key=int): print(s, rates[s])' "$json")
  positive=$(awk '$2 > 0' <<<"$result" | wc -l)
  ((positive == servers)) && break
done
echo "push requests per second, by server (Prometheus: $query):"
sed 's/^/  server /' <<<"$result"
positive=$(awk '$2 > 0' <<<"$result" | wc -l)
if ((positive != servers)); then echo "FAIL: $positive of $servers servers show a non-zero push rate"; exit 1; fi
echo "PASS: every server ($servers) shows a non-zero push rate"

# Per-partition series: every server is the primary of a partition whose
# version Prometheus has seen advance.
query='max by (server) (shardps_server_partition_version{role="primary"})'
json=$(curl -sf "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$query")
result=$(python3 -c '
import json, sys
for r in sorted(json.loads(sys.argv[1])["data"]["result"], key=lambda r: int(r["metric"]["server"])):
    print(r["metric"]["server"], r["value"][1])' "$json")
echo "highest partition version on each server's primaries (Prometheus: $query):"
sed 's/^/  server /' <<<"$result"
positive=$(awk '$2 > 0' <<<"$result" | wc -l)
if ((positive != servers)); then echo "FAIL: $positive of $servers servers show a partition version"; exit 1; fi
echo "PASS: every server ($servers) shows its partitions' versions"

# Every metric the dashboard names is one some node exports: a scheduler, a
# server and a training worker, each with --metrics-listen, scraped with curl
# once the worker has taken steps (a misspelled name evaluates to nothing and
# would pass the check below).
# Two servers: the per-partition replication lag exists only where a
# partition has a backup.
node_ports=($((base + 60)) $((base + 61)) $((base + 62)) $((base + 63)))
"$shardps" scheduler --listen 127.0.0.1:0 --port-file "$work/scheduler.port" --set num_servers=2 \
  --set num_workers=1 --metrics-listen "127.0.0.1:${node_ports[0]}" >"$work/scheduler.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s $work/scheduler.port ]] && break; sleep 0.2; done
[[ -s $work/scheduler.port ]] || { cat "$work/scheduler.log"; echo "FAIL: the scheduler did not start"; exit 1; }
scheduler=$(cat "$work/scheduler.port")
for i in 1 2; do
  "$shardps" server --scheduler "$scheduler" --listen tcp://127.0.0.1:0 \
    --metrics-listen "127.0.0.1:${node_ports[i + 1]}" >"$work/server$i.log" 2>&1 &
  pids+=($!)
done
"$shardps" train --scheduler "$scheduler" --rank 0 --epochs 1 --max-steps 100000 --log-every 0 \
  --progress-file "$work/steps" --metrics-listen "127.0.0.1:${node_ports[1]}" >"$work/train.log" 2>&1 &
pids+=($!)
steps() { awk '{n = $1 + 0} END {print n + 0}' "$work/steps" 2>/dev/null || echo 0; }  # zero-padded
for _ in $(seq 300); do (($(steps) >= 50)) && break; sleep 0.2; done
(($(steps) >= 50)) || { tail "$work/train.log"; echo "FAIL: the worker took no steps"; exit 1; }
for p in "${node_ports[@]}"; do curl -sf "http://127.0.0.1:$p/metrics"; done >"$work/exported.txt"
python3 - deploy/grafana/shardps.json "$work/exported.txt" <<'PY'
import json, re, sys
names = {m for p in json.load(open(sys.argv[1]))["panels"] for t in p["targets"]
         for m in re.findall(r"\bshardps_[a-z_]+", t["expr"])}
exported = {re.split(r"[{ ]", line, 1)[0] for line in open(sys.argv[2]) if line.startswith("shardps_")}
missing = sorted(names - exported)
if missing:
    sys.exit("FAIL: the dashboard names metrics no node exports: " + ", ".join(missing))
print(f"PASS: the {len(names)} metrics the dashboard names are exported (a scheduler, two servers, a worker)")
PY

# Every query of the Grafana dashboard is one Prometheus accepts.
python3 - "http://127.0.0.1:$prom_port" deploy/grafana/shardps.json <<'PY'
import json, sys, urllib.parse, urllib.request
url, path = sys.argv[1], sys.argv[2]
exprs = [t["expr"] for p in json.load(open(path))["panels"] for t in p["targets"]]
for e in exprs:
    q = urllib.parse.urlencode({"query": e.replace("$__rate_interval", "5s")})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}") as r:
        assert json.load(r)["status"] == "success", e
print(f"PASS: the {len(exprs)} queries of {path} evaluate")
PY
