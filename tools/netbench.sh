#!/usr/bin/env bash
# When the network is the bottleneck: runs the training demo on fake hosts
# (network namespaces joined by a bridge, every host link limited by tbf in
# both directions) once per compression configuration, and prints step time,
# bytes on the wire and test accuracy. Run as root. See --help and
# docs/performance.md ("When the network is the bottleneck").
#
#   h0 scheduler  10.77.0.1:7000
#   h1 h2 servers 10.77.0.2 / .3 (tcp port 7001)
#   h3 h4 workers 10.77.0.4 / .5 (ranks 0, 1)
#
# Everything it creates (processes, namespaces, veths, bridge, qdiscs) is removed
# on exit, on failure and on Ctrl-C; leftovers of a run killed with SIGKILL are
# removed at the start of the next run.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tools/netbench.sh [flags] [CONFIG ...]

CONFIG is a built-in name or NAME=FILE (FILE: protobuf text, ClusterConfig fields
such as compression {...} and update_mode; num_servers/num_workers are forced
to 2/2; replication is the cluster's default, 2 copies with 2 servers, so each
server also sends every update to the other (a raw round as its fp32 sum, a
compressed one as the workers' pushes): put replication: 1 in a FILE to time
one copy). Default: none 2bit. Built-in configurations:
  none         no compression
  2bit         2bit:scale=1 pushes, onebit aggregate pulls (SUM_ONLY), 150 uncompressed
               rounds, then Adam's variance frozen (optimizer epsilon 1e-4)
  2bit-delta   2bit:scale=2 pushes, onebit weight-delta pulls (optimizer on the servers)
  2bit-push    compression { codec: "2bit:scale=2" error_feedback: true }   (push only)
  fp16         compression { codec: "fp16" pull_codec: "fp16" }
  onebit       update_mode: SUM_ONLY  compression { codec: "onebit" pull_codec: "onebit" error_feedback: true }
  topk         update_mode: SUM_ONLY  compression { codec: "topk:ratio=0.01" pull_codec: "topk:ratio=0.01" error_feedback: true }

A configuration with compression.uncompressed_rounds R is timed without them (its
compressed steady state); "with warm-up" then counts R of the accuracy run's n rounds
at none's step time: none / ((R * none + (n - R) * config) / n).

flags:
  --rate R            tbf rate of every host link, each direction (default 200mbit)
  --burst B           tbf burst (default 256kb)
  --hidden H          hidden widths of the timing model (default 2048,2048)
  --batch-size N      images per worker step (default 32)
  --steps N           steps of each timing run (default 40)
  --epochs N          also run an accuracy run of N epochs per configuration on the
                      normal-width model (default 0 = no accuracy run)
  --accuracy-hidden H hidden widths of the accuracy model (default 256,128)
  --timeout S         limit of one run in seconds; past it every process is killed
                      and the ones still running are reported (default 900; the
                      accuracy run of none at --epochs 3 takes about 7 minutes)
  --shardps PATH      the shardps binary (default: $SHARDPS, build/tools/shardps,
                      /work/build-ci/tools/shardps, first that exists)
  --data-dir DIR      Fashion-MNIST directory (default: shardps's default)
  --subnet A.B.C      /24 of the fake hosts (default 10.77.0)
  --prefix P          prefix of namespace and link names (default nb; namespaces
                      P-h0..P-h4, bridge P-br0, veths P-h0..P-h4 on the bridge side)
  --workdir DIR       where logs, configs and results go (default: a new temp dir;
                      kept after the run, its path is printed)
  --compare-overlap   also time every configuration with the workers' --no-overlap
                      (each gradient pushed after the whole backward, every answer
                      awaited before the next step) and print both step times and
                      their ratio (no-overlap / overlap)
  --json              one JSON object per configuration instead of the table
  --verbose           pass --verbose to the daemons
  -h, --help          this text
EOF
}

TOOL=netbench
source "$(dirname "$0")/fakehosts.sh"

# ---------------------------------------------------------------- flags
RATE=200mbit BURST=256kb HIDDEN=2048,2048 BATCH=32 STEPS=40 EPOCHS=0 ACC_HIDDEN=256,128
RUN_TIMEOUT=900 SHARDPS_BIN=${SHARDPS:-} DATA_DIR="" SUBNET=10.77.0 PREFIX=nb WORKDIR="" JSON=0 VERBOSE=0
COMPARE_OVERLAP=0 CONFIGS=()
while (($#)); do
  case "$1" in
    --rate) RATE=$2; shift 2 ;;
    --burst) BURST=$2; shift 2 ;;
    --hidden) HIDDEN=$2; shift 2 ;;
    --batch-size) BATCH=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --accuracy-hidden) ACC_HIDDEN=$2; shift 2 ;;
    --timeout) RUN_TIMEOUT=$2; shift 2 ;;
    --shardps) SHARDPS_BIN=$2; shift 2 ;;
    --data-dir) DATA_DIR=$2; shift 2 ;;
    --subnet) SUBNET=$2; shift 2 ;;
    --prefix) PREFIX=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    --compare-overlap) COMPARE_OVERLAP=1; shift ;;
    --verbose) VERBOSE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --*) usage >&2; die "unknown flag $1" ;;
    *) CONFIGS+=("$1"); shift ;;
  esac
done
((${#CONFIGS[@]})) || CONFIGS=(none 2bit)
for v in BATCH STEPS EPOCHS RUN_TIMEOUT; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
((STEPS > 0)) || die "--steps must be > 0"
fakehosts_preflight

# 2bit pushes with Adam (1-bit Adam's recipe): 150 rounds uncompressed, then
# Adam's variance frozen and each worker compresses its own momentum in units
# of the frozen divisor; the servers sum the momenta and send the sum back as
# onebit (with their own residual).
ADAM_2BIT='update_mode: SUM_ONLY
optimizer { epsilon: 1e-4 freeze_variance_after: 150 }
compression { codec: "2bit:scale=1" pull_codec: "onebit" error_feedback: true uncompressed_rounds: 150 }'

# Built-in configurations: protobuf text appended to the base config (which
# leaves the optimizer at its default, Adam with learning rate 0.001).
config_snippet() {
  case "$1" in
    none) echo '' ;;
    2bit) echo "$ADAM_2BIT" ;;
    2bit-delta) echo 'update_mode: UPDATE_ON_SERVER
compression { codec: "2bit:scale=2" pull_codec: "onebit" error_feedback: true }' ;;
    2bit-push) echo 'update_mode: UPDATE_ON_SERVER
compression { codec: "2bit:scale=2" error_feedback: true }' ;;
    fp16) echo 'compression { codec: "fp16" pull_codec: "fp16" }' ;;
    onebit) echo 'update_mode: SUM_ONLY
compression { codec: "onebit" pull_codec: "onebit" error_feedback: true uncompressed_rounds: 0 }' ;;
    topk) echo 'update_mode: SUM_ONLY
compression { codec: "topk:ratio=0.01" pull_codec: "topk:ratio=0.01" error_feedback: true uncompressed_rounds: 0 }' ;;
    *) return 1 ;;
  esac
}
BASE_CONFIG='consistency: SYNC
num_servers: 2
num_workers: 2
partition_bytes: 1048576
rendezvous_timeout_ms: 60000
request_timeout_ms: 60000'
CONFIG_NAMES=() CONFIG_FILES=()
for c in "${CONFIGS[@]}"; do
  if [[ $c == *=* ]]; then
    name=${c%%=*} file=${c#*=}
    [[ -r $file ]] || die "config '$name': cannot read $file"
    CONFIG_NAMES+=("$name") CONFIG_FILES+=("$(readlink -f "$file")")
  else
    config_snippet "$c" >/dev/null || die "unknown configuration '$c' (built-in: none 2bit 2bit-delta 2bit-push fp16 onebit topk; or NAME=FILE)"
    CONFIG_NAMES+=("$c") CONFIG_FILES+=("")
  fi
done

# ---------------------------------------------------------------- fake hosts
NHOSTS=5
SCHED_ADDR="$(ip_of 0):7000"
host_setup() { shape_host "$1" "$RATE" "$BURST"; }
fakehosts_begin

iface_bytes() {   # bytes the worker hosts sent + received, by the bridge-side veth counters
  local total=0 i
  for i in 3 4; do
    total=$((total + $(cat "/sys/class/net/$(brlink "$i")/statistics/rx_bytes") +
      $(cat "/sys/class/net/$(brlink "$i")/statistics/tx_bytes")))
  done
  echo "$total"
}

result_value() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }

# wait_per_step DIR: the workers' mean wait_seconds (blocked on the data plane) per step.
wait_per_step() {
  awk '$1 == "wait_seconds" { w += $2 } $1 == "steps" { s += $2 } END { printf "%.4f", s ? w / s : 0 }' "$1"/result.*
}

# run_cluster DIR CONFIGFILE TRAIN_ARGS...: scheduler, 2 servers, 2 workers; waits
# for both workers; on timeout or on any process failing, kills everything and
# reports which. Writes DIR/result.{0,1} and DIR/iface_bytes.
run_cluster() {
  local dir=$1 cfg=$2; shift 2
  mkdir -p "$dir"
  rm -f "$dir"/result.*
  local v=(); ((VERBOSE)) && v=(--verbose)
  local data=(); [[ -n $DATA_DIR ]] && data=(--data-dir "$DATA_DIR")
  local before after
  before=$(iface_bytes)
  start 0 scheduler "$dir/h0.scheduler.log" "$SHARDPS_BIN" scheduler --listen "$SCHED_ADDR" --config "$cfg" \
    --set num_servers=2 --set num_workers=2 "${SCHED_SET[@]}" "${v[@]}"
  local h
  for h in 1 2; do
    start "$h" server "$dir/h$h.server.log" "$SHARDPS_BIN" server --scheduler "$SCHED_ADDR" \
      --listen "tcp://$(ip_of "$h"):7001" --advertise-host "$(ip_of "$h")" "${v[@]}"
  done
  local nd=${#PIDS[@]}   # indices < nd are daemons
  for h in 3 4; do
    start "$h" "worker rank $((h - 3))" "$dir/h$h.worker.log" "$SHARDPS_BIN" train --scheduler "$SCHED_ADDR" \
      --rank $((h - 3)) --result-file "$dir/result.$((h - 3))" "${data[@]}" "${v[@]}" "$@"
  done
  local failed=0 i
  wait_clients "$nd" || failed=1
  after=$(iface_bytes)
  echo $((after - before)) >"$dir/iface_bytes"
  kill_started
  ((failed == 0)) || die "run in $dir failed (see above)"
  for i in 0 1; do
    [[ -s $dir/result.$i ]] || die "worker rank $i wrote no result file $dir/result.$i"
  done
}

# ---------------------------------------------------------------- main
if [[ -z $WORKDIR ]]; then
  WORKDIR=$(mktemp -d /tmp/netbench.XXXXXX)
else
  mkdir -p "$WORKDIR"
  WORKDIR=$(readlink -f "$WORKDIR")
fi
# A private copy of the binary, so a rebuild during the run changes nothing.
cp "$SHARDPS_BIN" "$WORKDIR/shardps"
log "binary: $SHARDPS_BIN (copied to $WORKDIR/shardps)"
SHARDPS_BIN=$WORKDIR/shardps
setup_net
check_net "$RATE each way per link"

declare -A STEP_S STEP_S_SEQ WAIT_S WAIT_S_SEQ WIRE_RESULT WIRE_IFACE ACC STEPS_DONE WARMUP ACC_STEPS
SCHED_SET=()
for k in "${!CONFIG_NAMES[@]}"; do
  name=${CONFIG_NAMES[$k]}
  cfg=$WORKDIR/$name.pbtxt
  {
    echo "$BASE_CONFIG"
    if [[ -n ${CONFIG_FILES[$k]} ]]; then cat "${CONFIG_FILES[$k]}"; else config_snippet "$name"; fi
  } >"$cfg"

  # Rounds sent raw at the start (compression.uncompressed_rounds): the timing
  # run leaves them out to time the compressed steady state; the accuracy run
  # keeps them and the amortised step time below counts them at none's cost.
  WARMUP[$name]=$(sed 's/#.*//' "$cfg" | grep -oE 'uncompressed_rounds[[:space:]]*:[[:space:]]*[0-9]+' |
    grep -oE '[0-9]+$' | tail -1 || true)
  WARMUP[$name]=${WARMUP[$name]:-0}
  SCHED_SET=()
  ((WARMUP[$name] > 0)) && SCHED_SET=(--set compression.uncompressed_rounds=0 --set optimizer.freeze_variance_after=0)
  log "[$name] timing run: --hidden $HIDDEN --batch-size $BATCH --max-steps $STEPS over $RATE links"
  d=$WORKDIR/$name/timing
  run_cluster "$d" "$cfg" --hidden "$HIDDEN" --batch-size "$BATCH" --max-steps "$STEPS" --epochs 1 \
    --log-every 10 --test-limit 1000
  steps=$(result_value "$d/result.0" steps)
  wall=$(awk '$1 == "wall_seconds" { if ($2 > m) m = $2 } END { print m }' "$d"/result.*)
  bytes=$(awk '$1 == "bytes_pushed" || $1 == "bytes_pulled" { s += $2 } END { printf "%.0f", s }' "$d"/result.*)
  STEPS_DONE[$name]=$steps
  STEP_S[$name]=$(awk -v w="$wall" -v s="$steps" 'BEGIN { printf "%.4f", w / s }')
  WIRE_RESULT[$name]=$(awk -v b="$bytes" -v s="$steps" 'BEGIN { printf "%.0f", b / s }')
  WIRE_IFACE[$name]=$(awk -v b="$(cat "$d/iface_bytes")" -v s="$steps" 'BEGIN { printf "%.0f", b / s }')
  log "[$name] step ${STEP_S[$name]} s, $(awk -v b="${WIRE_RESULT[$name]}" 'BEGIN { printf "%.1f", b / 1e6 }') MB/step pushed+pulled"
  STEP_S_SEQ[$name]="" WAIT_S[$name]=$(wait_per_step "$d")
  if ((COMPARE_OVERLAP)); then
    log "[$name] timing run with the workers' --no-overlap"
    d=$WORKDIR/$name/timing-no-overlap
    run_cluster "$d" "$cfg" --hidden "$HIDDEN" --batch-size "$BATCH" --max-steps "$STEPS" --epochs 1 \
      --log-every 10 --test-limit 1000 --no-overlap
    wall=$(awk '$1 == "wall_seconds" { if ($2 > m) m = $2 } END { print m }' "$d"/result.*)
    STEP_S_SEQ[$name]=$(awk -v w="$wall" -v s="$(result_value "$d/result.0" steps)" 'BEGIN { printf "%.4f", w / s }')
    WAIT_S_SEQ[$name]=$(wait_per_step "$d")
    log "[$name] step ${STEP_S_SEQ[$name]} s without overlap, ${STEP_S[$name]} s with"
  fi

  ACC[$name]=""
  if ((EPOCHS > 0)); then
    log "[$name] accuracy run: --hidden $ACC_HIDDEN --epochs $EPOCHS"
    d=$WORKDIR/$name/accuracy
    SCHED_SET=()
    run_cluster "$d" "$cfg" --hidden "$ACC_HIDDEN" --batch-size "$BATCH" --epochs "$EPOCHS" --log-every 200
    ACC[$name]=$(result_value "$d/result.0" test_accuracy)
    ACC_STEPS[$name]=$(result_value "$d/result.0" steps)
    log "[$name] test accuracy ${ACC[$name]}"
  fi
done

overlap_ratio() {   # step time without overlap over step time with, of $1
  awk -v a="${STEP_S_SEQ[$1]}" -v b="${STEP_S[$1]}" 'BEGIN { printf "%.2f", a / b }'
}

ratio() {   # step time of none over step time of $1
  if [[ -n ${STEP_S[none]:-} ]]; then
    awk -v a="${STEP_S[none]}" -v b="${STEP_S[$1]}" 'BEGIN { printf "%.2f", a / b }'
  fi
}

# none's step time over $1's averaged across its accuracy run: its warm-up
# rounds at none's cost, the rest at its own (same as ratio without warm-up).
amortised_ratio() {
  local r=${WARMUP[$1]:-0} n=${ACC_STEPS[$1]:-0}
  ((r > 0 && n == 0)) && return 0   # warm-up, but no accuracy run to count it over
  if [[ -n ${STEP_S[none]:-} ]] && ((r > 0 && n > 0)); then
    awk -v a="${STEP_S[none]}" -v b="${STEP_S[$1]}" -v r="$r" -v n="$n" \
      'BEGIN { if (r > n) r = n; printf "%.2f", a / ((r * a + (n - r) * b) / n) }'
  else
    ratio "$1"
  fi
}

if ((JSON)); then
  for name in "${CONFIG_NAMES[@]}"; do
    r=$(ratio "$name")
    a=$(amortised_ratio "$name")
    printf '{"config":"%s","rate":"%s","hidden":"%s","batch_size":%d,"steps":%d,"step_s":%s,' \
      "$name" "$RATE" "$HIDDEN" "$BATCH" "${STEPS_DONE[$name]}" "${STEP_S[$name]}"
    printf '"result_bytes_per_step":%s,"iface_bytes_per_step":%s,"speedup_vs_none":%s,' \
      "${WIRE_RESULT[$name]}" "${WIRE_IFACE[$name]}" "${r:-null}"
    printf '"warmup_rounds":%d,"amortised_speedup_vs_none":%s,' "${WARMUP[$name]}" "${a:-null}"
    printf '"accuracy_hidden":"%s","accuracy_epochs":%d,"test_accuracy":%s' \
      "$ACC_HIDDEN" "$EPOCHS" "${ACC[$name]:-null}"
    if ((COMPARE_OVERLAP)); then
      printf ',"step_s_no_overlap":%s,"overlap_speedup":%s,"wait_s_per_step":%s,"wait_s_per_step_no_overlap":%s' \
        "${STEP_S_SEQ[$name]}" "$(overlap_ratio "$name")" "${WAIT_S[$name]}" "${WAIT_S_SEQ[$name]}"
    fi
    printf '}\n'
  done
else
  echo
  echo "rate $RATE per link each way; timing: --hidden $HIDDEN --batch-size $BATCH, $STEPS steps;" \
    "accuracy: --hidden $ACC_HIDDEN, $EPOCHS epochs"
  printf '%-13s %10s %18s %18s %14s %12s %16s\n' config "step s" "MB/step (result)" "MB/step (iface)" \
    "test accuracy" "none/config" "with warm-up"
  for name in "${CONFIG_NAMES[@]}"; do
    r=$(ratio "$name")
    a=$(amortised_ratio "$name")
    printf '%-13s %10s %18s %18s %14s %12s %16s\n' "$name" "${STEP_S[$name]}" \
      "$(awk -v b="${WIRE_RESULT[$name]}" 'BEGIN { printf "%.2f", b / 1e6 }')" \
      "$(awk -v b="${WIRE_IFACE[$name]}" 'BEGIN { printf "%.2f", b / 1e6 }')" \
      "${ACC[$name]:--}" "${r:--}" "${a:--}"
  done
  if ((COMPARE_OVERLAP)); then
    echo
    echo "wait s = time a worker's steps were blocked on the data plane (mean of the two workers, per step)"
    printf '%-13s %14s %17s %20s %14s %17s\n' config "step s overlap" "step s no-overlap" "no-overlap/overlap" \
      "wait s overlap" "wait s no-overlap"
    for name in "${CONFIG_NAMES[@]}"; do
      printf '%-13s %14s %17s %20s %14s %17s\n' "$name" "${STEP_S[$name]}" "${STEP_S_SEQ[$name]}" \
        "$(overlap_ratio "$name")" "${WAIT_S[$name]}" "${WAIT_S_SEQ[$name]}"
    done
  fi
fi
