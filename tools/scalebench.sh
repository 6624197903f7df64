#!/usr/bin/env bash
# Scaling across (fake) hosts: push-pull of one model by workers on their own
# hosts against 1, 2, 4, 8 servers, each server behind its own slow link, so the
# servers' links are the limit and aggregate goodput should grow linearly with
# them. Prints goodput and efficiency against linear, writes a PNG plot. Run as
# root. See --help and docs/performance.md ("Scaling across hosts").
#
#   h0            scheduler   10.79.0.1:7000   (--worker-rate link)
#   h1 .. hS      servers     10.79.0.2 ..     (--server-rate links, tcp port 7001)
#   hS+1 ..       workers                      (--worker-rate links), one
#                 `shardps bench --scheduler` client each
#
# The hosts for the largest server count are made once; a configuration with S
# servers uses h1..hS. Everything created is removed on exit (tools/fakehosts.sh).
#
# --train: the same hosts and links, but the workers run the demo model's
# training (`shardps train`) for sync, SSP and async, one worker a straggler,
# and the script reports the time to a target test accuracy
# (tools/scalebench_train.sh).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tools/scalebench.sh [flags]

flags:
  --servers LIST      server counts, comma-separated (default 1,2,4,8)
  --workers N         worker hosts (default 2)
  --bytes N           model size in bytes (default 67108864 = 64 MiB)
  --hot-servers S     also run one configuration with S servers whose model is one
                      tensor of 3/4 of --bytes and 16 small ones (the shard map must
                      still spread it evenly); 0: no such row (default 4)
  --server-rate R     tbf rate of each server's link, each direction (default 200mbit)
  --worker-rate R     tbf rate of each worker's and the scheduler's link (default 1gbit)
  --burst B           tbf burst (default 256kb)
  --partition-bytes N partition size (default 262144: in sync a partition's weights go back
                      only once every worker's push of it is in, so each round trip
                      has a partition's worth of head and tail the links cannot overlap;
                      1 MiB partitions cost about 5% at 4 servers)
  --consistency C     sync or async (default sync: a partition's new weights go back
                      only once every worker's push of it has arrived)
  --replication N     copies of each partition (default 1: every byte crosses a server
                      link once each way; with 2, each update also goes to a backup
                      over the servers' links, which 1 server cannot do)
  --iters N           measured round trips per worker (default 3)
  --warmup N          round trips per worker before measuring (default 1)
  --timeout S         limit of one configuration in seconds (default 300)
  --plot FILE         PNG plot of goodput against servers (default WORKDIR/scalebench.png;
                      --train: accuracy against seconds, WORKDIR/scalebench_train.png;
                      "none": no plot)
  --shardps PATH      the shardps binary (default: $SHARDPS, build/tools/shardps)
  --subnet A.B.C      /24 of the fake hosts (default 10.79.0)
  --prefix P          prefix of namespace and link names (default sb)
  --workdir DIR       where logs and results go (default: a new temp dir, kept)
  --json              one JSON object per configuration instead of the table
  -h, --help          this text

goodput_gbps: bytes pushed per second by all workers together, in Gbit/s (as
many are pulled back); efficiency: goodput / (servers x goodput at 1 server).

training mode (--train): the demo model (Fashion-MNIST MLP, Adam) trained by one
`shardps train` per worker host, once per consistency mode; rank 0 evaluates the
test set every --eval-every steps. Reports, per mode, the seconds (and epochs) to
--target test accuracy, or null and the best accuracy when it is not reached
within --epochs. Flags above that apply: --servers (one count, default 2),
--workers (default 4), --partition-bytes, --replication, the rates, --timeout
(of one run, default 1800), --plot (accuracy against seconds), --json.
  --train             training mode
  --modes LIST        consistency modes, comma-separated (default sync,ssp,async)
  --staleness S       SSP's bound (default 2)
  --slow worker:R=F   worker R computes F times slower (shardps local --slow); "none":
                      no straggler (default worker:1=3)
  --target A          test accuracy to reach (default 0.85)
  --epochs N          epochs at most (async: the pushes of N sync epochs; default 5)
  --eval-every N      rank 0 evaluates every N of its steps and at its end (default 100)
  --train-limit N     first N training images only (default 0: all 60000)
  --test-limit N      first N test images only (default 0: all 10000)
  --data-dir DIR      Fashion-MNIST files (default /usr/share/datasets/fashion-mnist)

--json rows of --train: consistency, staleness, servers, workers, straggler,
target, seconds_to_target and epochs_to_target (the first evaluation at or above
the target; null: not reached), seconds_to_stay (from there on every evaluation
was), best_accuracy, final_accuracy (the final weights), epochs (trained),
train_seconds and eval_seconds (rank 0's time to the end of the job without,
and in, its evaluations), samples_per_s (all workers' samples / train_seconds).
EOF
}

TOOL=scalebench
source "$(dirname "$0")/fakehosts.sh"

SERVERS_LIST=1,2,4,8 WORKERS=2 BYTES=67108864 HOT_SERVERS=4 SERVER_RATE=200mbit WORKER_RATE=1gbit BURST=256kb
PARTITION_BYTES=262144 CONSISTENCY=sync REPLICATION=1 ITERS=3 WARMUP=1 RUN_TIMEOUT=300 PLOT="" SHARDPS_BIN=${SHARDPS:-} SUBNET=10.79.0
PREFIX=sb WORKDIR="" JSON=0
TRAIN=0 TRAIN_MODES_LIST=sync,ssp,async TRAIN_STALENESS=2 SLOW_SPEC=worker:1=3 TARGET=0.85 TRAIN_EPOCHS=5
TRAIN_EVAL_EVERY=100 TRAIN_LIMIT=0 TEST_LIMIT=0 DATA_DIR=/usr/share/datasets/fashion-mnist
declare -A GIVEN=()   # flags given, for the defaults that differ in --train
while (($#)); do
  GIVEN[$1]=1
  case "$1" in
    --train) TRAIN=1; shift ;;
    --modes) TRAIN_MODES_LIST=$2; shift 2 ;;
    --staleness) TRAIN_STALENESS=$2; shift 2 ;;
    --slow) SLOW_SPEC=$2; shift 2 ;;
    --target) TARGET=$2; shift 2 ;;
    --epochs) TRAIN_EPOCHS=$2; shift 2 ;;
    --eval-every) TRAIN_EVAL_EVERY=$2; shift 2 ;;
    --train-limit) TRAIN_LIMIT=$2; shift 2 ;;
    --test-limit) TEST_LIMIT=$2; shift 2 ;;
    --data-dir) DATA_DIR=$2; shift 2 ;;
    --servers) SERVERS_LIST=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --bytes) BYTES=$2; shift 2 ;;
    --hot-servers) HOT_SERVERS=$2; shift 2 ;;
    --server-rate) SERVER_RATE=$2; shift 2 ;;
    --worker-rate) WORKER_RATE=$2; shift 2 ;;
    --burst) BURST=$2; shift 2 ;;
    --partition-bytes) PARTITION_BYTES=$2; shift 2 ;;
    --replication) REPLICATION=$2; shift 2 ;;
    --consistency) CONSISTENCY=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --timeout) RUN_TIMEOUT=$2; shift 2 ;;
    --plot) PLOT=$2; shift 2 ;;
    --shardps) SHARDPS_BIN=$2; shift 2 ;;
    --subnet) SUBNET=$2; shift 2 ;;
    --prefix) PREFIX=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument $1" ;;
  esac
done
if ((TRAIN)); then
  [[ -n ${GIVEN[--servers]:-} ]] || SERVERS_LIST=2
  [[ -n ${GIVEN[--workers]:-} ]] || WORKERS=4
  [[ -n ${GIVEN[--timeout]:-} ]] || RUN_TIMEOUT=1800
  HOT_SERVERS=0
  source "$(dirname "$0")/scalebench_train.sh"
  validate_train_flags
fi
for v in WORKERS BYTES HOT_SERVERS PARTITION_BYTES REPLICATION ITERS WARMUP RUN_TIMEOUT; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--${v,,} must be a non-negative integer, got '${!v}'"
done
((WORKERS > 0 && ITERS > 0 && REPLICATION > 0)) || die "--workers, --iters and --replication must be > 0"
((BYTES >= 256 && BYTES % 256 == 0)) || die "--bytes must be a positive multiple of 256, got $BYTES"
[[ $CONSISTENCY == sync || $CONSISTENCY == async ]] || die "--consistency must be sync or async, got '$CONSISTENCY'"
[[ $SERVERS_LIST =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--servers must be a comma-separated list of counts, got '$SERVERS_LIST'"
IFS=, read -r -a SERVER_COUNTS <<<"$SERVERS_LIST"
MAX_SERVERS=$HOT_SERVERS
for s in "${SERVER_COUNTS[@]}"; do
  ((s > 0)) || die "--servers: counts must be > 0"
  ((s >= REPLICATION)) || die "--servers: $s servers cannot hold --replication $REPLICATION copies"
  ((s > MAX_SERVERS)) && MAX_SERVERS=$s
done
((HOT_SERVERS == 0 || HOT_SERVERS >= REPLICATION)) ||
  die "--hot-servers: $HOT_SERVERS servers cannot hold --replication $REPLICATION copies"
NHOSTS=$((1 + MAX_SERVERS + WORKERS))
((NHOSTS <= FAKEHOSTS_MAX)) || die "1 scheduler + $MAX_SERVERS servers + $WORKERS workers is $NHOSTS hosts; at most $FAKEHOSTS_MAX"
fakehosts_preflight

SCHED_ADDR="$(ip_of 0):7000"
worker_host() { echo $((1 + MAX_SERVERS + $1)); }
host_setup() {
  if (($1 >= 1 && $1 <= MAX_SERVERS)); then shape_host "$1" "$SERVER_RATE" "$BURST"
  else shape_host "$1" "$WORKER_RATE" "$BURST"; fi
}
fakehosts_begin

# The tensors of the hot row: one of 3/4 of the model, 16 sharing the rest.
hot_tensor_bytes() {
  local big=$((BYTES / 4 * 3)) small=$((BYTES / 4 / 16)) list i
  list=$big
  for ((i = 0; i < 16; i++)); do list+=",$small"; done
  echo "$list"
}

# cluster_config CONSISTENCY SERVERS: the config lines both modes share.
cluster_config() {
  cat <<EOF
consistency: ${1^^}
num_servers: $2
num_workers: $WORKERS
partition_bytes: $PARTITION_BYTES
replication: $REPLICATION
rendezvous_timeout_ms: 60000
request_timeout_ms: 120000
EOF
}

# start_daemons DIR SERVERS: the scheduler on h0 with DIR/cluster.pbtxt, then
# servers on h1..hSERVERS, logging into DIR.
start_daemons() {
  local dir=$1 h
  start 0 scheduler "$dir/h0.scheduler.log" "$SHARDPS_BIN" scheduler --listen "$SCHED_ADDR" --config "$dir/cluster.pbtxt"
  for ((h = 1; h <= $2; h++)); do
    start "$h" server "$dir/h$h.server.log" "$SHARDPS_BIN" server --scheduler "$SCHED_ADDR" \
      --listen "tcp://$(ip_of "$h"):7001" --advertise-host "$(ip_of "$h")"
  done
}

# await_run ND WHAT DIR: waits for the clients started after the ND daemons
# (wait_clients), stops everything, and dies naming WHAT and the logs in DIR
# if any process failed or the run timed out.
await_run() {
  local failed=0
  wait_clients "$1" || failed=1
  kill_started
  ((failed == 0)) || die "$2 failed (logs in $3)"
}

# run_config NAME SERVERS TENSOR_BYTES: scheduler, SERVERS servers, one bench
# client per worker host; writes WORKDIR/NAME/result.R (the clients' JSON lines).
run_config() {
  local name=$1 servers=$2 tensors=$3 dir=$WORKDIR/$1 h r
  mkdir -p "$dir"
  { cluster_config "$CONSISTENCY" "$servers"; echo 'optimizer { kind: SGD learning_rate: 0.001 }'; } >"$dir/cluster.pbtxt"
  start_daemons "$dir" "$servers"
  local nd=${#PIDS[@]}
  for ((r = 0; r < WORKERS; r++)); do
    h=$(worker_host "$r")
    start "$h" "worker rank $r" "$dir/h$h.worker.log" "$SHARDPS_BIN" bench --scheduler "$SCHED_ADDR" \
      --rank "$r" --workers 1 --tensor-bytes "$tensors" --iters "$ITERS" --warmup "$WARMUP" --json
  done
  await_run "$nd" "configuration $name" "$dir"
  for ((r = 0; r < WORKERS; r++)); do
    h=$(worker_host "$r")
    grep '^{' "$dir/h$h.worker.log" | tail -1 >"$dir/result.$r"
    [[ -s $dir/result.$r ]] || die "worker rank $r printed no JSON result ($dir/h$h.worker.log)"
  done
}

json_field() { sed -E "s/.*\"$2\": ([0-9.e+-]+).*/\1/" "$1"; }

# Aggregate goodput of configuration NAME in Gbit/s: the sum of every worker's
# pushed bits per second over its measured round trips.
goodput_of() {
  local r f total=0
  for ((r = 0; r < WORKERS; r++)); do
    f=$WORKDIR/$1/result.$r
    total=$(awk -v t="$total" -v b="$(json_field "$f" bytes)" -v n="$(json_field "$f" iters)" \
      -v s="$(json_field "$f" seconds)" 'BEGIN { printf "%.6f", t + b * n * 8 / s / 1e9 }')
  done
  echo "$total"
}

# The plot needs Debian's python3-matplotlib; installs it with a message if missing.
ensure_matplotlib() {
  /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && return 0
  log "the plot needs python3-matplotlib; installing it (apt-get install python3-matplotlib)"
  apt-get install -y --no-install-recommends python3-matplotlib >&2 ||
    die "could not install python3-matplotlib; install it, or pass --plot none (results: $WORKDIR/results.jsonl)"
}

if [[ -z $WORKDIR ]]; then
  WORKDIR=$(mktemp -d /tmp/scalebench.XXXXXX)
else
  mkdir -p "$WORKDIR"
  WORKDIR=$(readlink -f "$WORKDIR")
fi
cp "$SHARDPS_BIN" "$WORKDIR/shardps"   # a rebuild during the run changes nothing
SHARDPS_BIN=$WORKDIR/shardps
if [[ -z $PLOT ]]; then
  PLOT=$WORKDIR/scalebench.png
  ((TRAIN)) && PLOT=$WORKDIR/scalebench_train.png
fi
setup_net
check_net "servers h1..h$MAX_SERVERS at $SERVER_RATE, scheduler and workers at $WORKER_RATE, each way"
if ((TRAIN)); then
  run_training_modes
  exit 0
fi

NAMES=() NSERVERS=() declare -A GOODPUT=()
for s in "${SERVER_COUNTS[@]}"; do NAMES+=("$s"); NSERVERS+=("$s"); done
((HOT_SERVERS > 0)) && { NAMES+=("$HOT_SERVERS-hot"); NSERVERS+=("$HOT_SERVERS"); }
for k in "${!NAMES[@]}"; do
  name=${NAMES[$k]} tensors=$BYTES
  [[ $name == *-hot ]] && tensors=$(hot_tensor_bytes)
  log "[$name] ${NSERVERS[$k]} servers, $WORKERS workers, $ITERS round trips of $BYTES bytes"
  run_config "$name" "${NSERVERS[$k]}" "$tensors"
  GOODPUT[$name]=$(goodput_of "$name")
  log "[$name] goodput ${GOODPUT[$name]} Gbit/s"
done

efficiency() {   # efficiency NAME SERVERS: goodput against SERVERS x the 1-server goodput
  [[ -n ${GOODPUT[1]:-} ]] || return 0
  awk -v g="${GOODPUT[$1]}" -v one="${GOODPUT[1]}" -v s="$2" 'BEGIN { printf "%.3f", g / (s * one) }'
}

{
  for k in "${!NAMES[@]}"; do
    name=${NAMES[$k]} hot=false
    [[ $name == *-hot ]] && hot=true
    e=$(efficiency "$name" "${NSERVERS[$k]}")
    printf '{"config":"%s","servers":%d,"workers":%d,"bytes":%d,"hot_partition":%s,"consistency":"%s","replication":%d,' \
      "$name" "${NSERVERS[$k]}" "$WORKERS" "$BYTES" "$hot" "$CONSISTENCY" "$REPLICATION"
    printf '"server_rate":"%s",' "$SERVER_RATE"
    printf '"goodput_gbps":%s,"efficiency":%s}\n' "${GOODPUT[$name]}" "${e:-null}"
  done
} >"$WORKDIR/results.jsonl"

if ((JSON)); then
  cat "$WORKDIR/results.jsonl"
else
  echo
  echo "$WORKERS workers at $WORKER_RATE, each server at $SERVER_RATE, push-pull of $BYTES bytes, $ITERS round trips"
  printf '%-8s %8s %14s %14s %11s\n' config servers "goodput Gb/s" "linear Gb/s" efficiency
  for k in "${!NAMES[@]}"; do
    name=${NAMES[$k]}
    lin=-; [[ -n ${GOODPUT[1]:-} ]] && lin=$(awk -v o="${GOODPUT[1]}" -v s="${NSERVERS[$k]}" 'BEGIN { printf "%.3f", o * s }')
    e=$(efficiency "$name" "${NSERVERS[$k]}")
    printf '%-8s %8d %14.3f %14s %11s\n' "$name" "${NSERVERS[$k]}" "${GOODPUT[$name]}" "$lin" "${e:--}"
  done
fi

if [[ $PLOT != none ]]; then
  ensure_matplotlib
  /usr/bin/python3 "$ROOT/tools/scalebench_plot.py" "$WORKDIR/results.jsonl" "$PLOT" ||
    die "plotting $WORKDIR/results.jsonl into $PLOT failed"
  log "plot: $PLOT"
fi
