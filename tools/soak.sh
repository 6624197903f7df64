#!/usr/bin/env bash
# Soak: a long async training job on loopback while a server is killed with
# SIGKILL every few minutes and a replacement is started at its address.
# Samples every server's RSS (VmRSS from /proc) and the workers' steps, and
# prints RSS over time per server, steps/s per interval, what the scheduler
# declared (failovers, lost partitions) and whether each replacement joined.
# Needs no root: every process listens on 127.0.0.1 only. See --help and
# docs/performance.md ("Soak").
#
# Every process it starts is ended on exit, on failure and on Ctrl-C.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tools/soak.sh [flags]

flags:
  --duration S       total seconds of training (default 1800)
  --kill-every S     SIGKILL one server this often (default 300); the first kill
                     comes S seconds after training starts
  --servers N        server processes (default 5)
  --replication R    copies of every partition (default 2)
  --workers N        worker processes (default 2)
  --sample-every S   RSS and step samples this often (default 10)
  --no-replace       only kill; do not start a replacement server
  --heartbeat-timeout-ms N   cluster heartbeat_timeout_ms (default 10000)
  --hidden H         hidden widths of the model (default 256,128)
  --shardps PATH     the shardps binary (default: $SHARDPS, build/tools/shardps)
  --data-dir DIR     Fashion-MNIST directory (default: shardps's default)
  --workdir DIR      logs and samples (default: a new temp dir, kept; printed)
  --json             also print one JSON object with every figure (last line)
  -h, --help         this text

Servers are killed in index order (0, 1, ...), one per --kill-every, each the
next live one. After a kill the replacement is started at the dead server's
address; whether the scheduler accepted or refused it is reported with the
replacement's own message. The job "keeps training" while the workers' step
counts grow in every sample interval; the run fails (exit 1) when a worker
exits or stops making progress for 3 sample intervals.
EOF
}

TOOL=soak
source "$(dirname "$0")/fakehosts.sh"   # for die, kill_started and find_shardps; no namespaces here
log() { echo "soak: [$(elapsed)s] $*" >&2; }

DURATION=1800 KILL_EVERY=300 SERVERS=5 REPLICATION=2 WORKERS=2 SAMPLE_EVERY=10 REPLACE=1 HB_MS=10000
HIDDEN=256,128 SHARDPS_BIN=${SHARDPS:-} DATA_DIR="" WORKDIR="" JSON=0
while (($#)); do
  case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --kill-every) KILL_EVERY=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    --replication) REPLICATION=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --sample-every) SAMPLE_EVERY=$2; shift 2 ;;
    --no-replace) REPLACE=0; shift ;;
    --heartbeat-timeout-ms) HB_MS=$2; shift 2 ;;
    --hidden) HIDDEN=$2; shift 2 ;;
    --shardps) SHARDPS_BIN=$2; shift 2 ;;
    --data-dir) DATA_DIR=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument $1" ;;
  esac
done
for v in DURATION KILL_EVERY SERVERS REPLICATION WORKERS SAMPLE_EVERY HB_MS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
((DURATION > 0 && KILL_EVERY > 0 && SAMPLE_EVERY > 0 && WORKERS > 0)) || die "durations and --workers must be > 0"
((SERVERS >= 2)) || die "--servers must be >= 2 (a kill needs a backup to fail over to)"
((REPLICATION >= 1 && REPLICATION <= SERVERS)) || die "--replication must be in [1, --servers]"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
find_shardps

T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }

# Every process it starts is in PIDS (kill_started ends them all).
loopback_begin "logs and samples"
cp "$SHARDPS_BIN" "$WORKDIR/shardps"
SHARDPS_BIN=$WORKDIR/shardps
rm -f "$WORKDIR"/*.log "$WORKDIR"/info.* "$WORKDIR"/progress.* "$WORKDIR"/sched.port
LIMIT=$((DURATION + 600))   # backstop: `timeout` ends every process even if this script is SIGKILLed

start_local() {   # start_local LOG CMD...: LAST_PID is the `timeout` wrapper, LAST_CHILD the command itself
  local logf=$1; shift
  timeout --kill-after=5 "$LIMIT" "$@" >"$logf" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
  LAST_CHILD=""
  for _ in $(seq 50); do
    LAST_CHILD=$(ps --ppid "$LAST_PID" -o pid= 2>/dev/null | tr -d ' ' | head -n 1 || true)
    [[ -n $LAST_CHILD ]] && break
    sleep 0.02
  done
}

# ---------------------------------------------------------------- cluster
start_local "$WORKDIR/scheduler.log" "$SHARDPS_BIN" scheduler --listen 127.0.0.1:0 --port-file "$WORKDIR/sched.port" \
  --set consistency=async --set "num_servers=$SERVERS" --set "num_workers=$WORKERS" \
  --set "replication=$REPLICATION" --set "heartbeat_timeout_ms=$HB_MS" --set rendezvous_timeout_ms=60000
SCHED_PID=$LAST_PID
for _ in $(seq 100); do [[ -s $WORKDIR/sched.port ]] && break; sleep 0.1; done
[[ -s $WORKDIR/sched.port ]] || die "the scheduler wrote no port file; $(tail -n 5 "$WORKDIR/scheduler.log")"
SCHED=$(cat "$WORKDIR/sched.port")

declare -A SPID=() SWRAP=() SADDR=() SLOG=()   # by server index: pid, its timeout wrapper, data address, log
STARTING=()
for ((s = 0; s < SERVERS; s++)); do
  start_local "$WORKDIR/server.start$s.log" "$SHARDPS_BIN" server --scheduler "$SCHED" --listen 'tcp://127.0.0.1:0' \
    --advertise-host 127.0.0.1 --info-file "$WORKDIR/info.start$s"
  STARTING+=("$s:$LAST_PID:$LAST_CHILD")
done
data=(); [[ -n $DATA_DIR ]] && data=(--data-dir "$DATA_DIR")
declare -A WPID=()
for ((r = 0; r < WORKERS; r++)); do
  start_local "$WORKDIR/worker$r.log" "$SHARDPS_BIN" train --scheduler "$SCHED" --rank "$r" --epochs 100000 \
    --hidden "$HIDDEN" --log-every 2000 --progress-file "$WORKDIR/progress.$r" --rendezvous-timeout 60 "${data[@]}"
  WPID[$r]=$LAST_PID
done
# Index of each server, from its info file ("INDEX DATA_ADDRESS").
for e in "${STARTING[@]}"; do
  IFS=: read -r k wrap pid <<<"$e"
  for _ in $(seq 300); do [[ -s $WORKDIR/info.start$k ]] && break; sleep 0.1; done
  [[ -s $WORKDIR/info.start$k ]] || die "server started $k did not register: $(tail -n 5 "$WORKDIR/server.start$k.log")"
  read -r idx addr <"$WORKDIR/info.start$k"
  SPID[$idx]=$pid SWRAP[$idx]=$wrap SADDR[$idx]=$addr SLOG[$idx]=$WORKDIR/server.start$k.log
done
steps_of() { local x; x=$(cat "$WORKDIR/progress.$1" 2>/dev/null || true); x=${x//[^0-9]/}; echo $((10#${x:-0})); }
for _ in $(seq 600); do (($(steps_of 0) > 0)) && break; sleep 0.1; done
(($(steps_of 0) > 0)) || die "worker 0 took no step within 60 s: $(tail -n 5 "$WORKDIR/worker0.log")"
T0=$(date +%s)   # times from here on: seconds since the first step
log "training: async, $SERVERS servers (replication $REPLICATION), $WORKERS workers, scheduler $SCHED;" \
  "a server killed every $KILL_EVERY s for $DURATION s"

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || true; }
total_steps() { local t=0 r; for ((r = 0; r < WORKERS; r++)); do t=$((t + $(steps_of "$r"))); done; echo "$t"; }

SAMPLES=$WORKDIR/samples.tsv   # t, total steps, steps/s, then RSS MiB of server 0..N-1 ("-": not running)
{ printf 't\tsteps\tsteps_per_s'; for ((s = 0; s < SERVERS; s++)); do printf '\trss_mib_s%d' "$s"; done; echo; } >"$SAMPLES"
EVENTS=$WORKDIR/events.txt
: >"$EVENTS"
event() { echo "$(elapsed)s $*" >>"$EVENTS"; log "$*"; }

KILLS=0 REFUSED=0 JOINED=0 STALLED=0 FAILED="" next_victim=0
declare -A RSS_FIRST=() RSS_MAX=() RSS_LAST=()
last_t=0 last_steps=$(total_steps) next_kill=$KILL_EVERY next_sample=$SAMPLE_EVERY

# The replacement of a killed server is started REPLACE_AFTER seconds after the
# kill (so the scheduler has declared the old one dead: a live one is refused
# outright) at the dead server's address, and watched without blocking the
# sampling: R_VICTIM is the server it replaces, R_AT when it starts, R_WRAP/R_PID
# its processes once started, R_DEADLINE when it must have registered.
REPLACE_AFTER=$(((HB_MS + 999) / 1000 + 3))
R_VICTIM=-1 R_AT=0 R_WRAP="" R_PID="" R_DEADLINE=0 R_LOG="" R_INFO=""

kill_one() {
  local v=-1 k
  for ((k = 0; k < SERVERS; k++)); do
    local c=$(((next_victim + k) % SERVERS))
    if [[ -n ${SPID[$c]:-} ]] && kill -0 "${SPID[$c]}" 2>/dev/null; then v=$c; break; fi
  done
  ((v >= 0)) || { event "no live server left to kill"; return; }
  next_victim=$((v + 1))
  kill -KILL "${SPID[$v]}"
  wait "${SWRAP[$v]}" 2>/dev/null || true
  KILLS=$((KILLS + 1))
  event "SIGKILL server $v (pid ${SPID[$v]}, ${SADDR[$v]}); RSS before ${RSS_LAST[$v]:-?} MiB"
  SPID[$v]=""
  if ((REPLACE)); then R_VICTIM=$v R_AT=$(($(elapsed) + REPLACE_AFTER)) R_WRAP=""; fi
}

follow_replacement() {
  ((R_VICTIM >= 0)) || return 0
  if [[ -z $R_WRAP ]]; then
    (($(elapsed) >= R_AT)) || return 0
    R_LOG=$WORKDIR/server.replace$KILLS.log R_INFO=$WORKDIR/info.replace$KILLS
    start_local "$R_LOG" "$SHARDPS_BIN" server --scheduler "$SCHED" --listen "${SADDR[$R_VICTIM]}" \
      --advertise-host 127.0.0.1 --info-file "$R_INFO" --register-timeout 20
    R_WRAP=$LAST_PID R_PID=$LAST_CHILD R_DEADLINE=$(($(elapsed) + 25))
    return 0
  fi
  if [[ -s $R_INFO ]]; then
    local idx addr
    read -r idx addr <"$R_INFO"
    SPID[$idx]=$R_PID SWRAP[$idx]=$R_WRAP SADDR[$idx]=$addr SLOG[$idx]=$R_LOG
    JOINED=$((JOINED + 1))
    event "replacement for server $R_VICTIM joined as server $idx at $addr"
    R_VICTIM=-1
  elif ! kill -0 "$R_WRAP" 2>/dev/null || (($(elapsed) >= R_DEADLINE)); then
    local rc=0
    kill -TERM "$R_WRAP" 2>/dev/null || true
    wait "$R_WRAP" 2>/dev/null || rc=$?
    REFUSED=$((REFUSED + 1))
    event "replacement for server $R_VICTIM at ${SADDR[$R_VICTIM]} did not join (exit $rc): $(grep -v '^\s*$' "$R_LOG" | tail -n 1)"
    R_VICTIM=-1
  fi
}

while (($(elapsed) < DURATION)); do
  sleep 1
  t=$(elapsed)
  # Workers must keep running.
  for ((r = 0; r < WORKERS; r++)); do
    if [[ -n ${WPID[$r]} ]] && ! kill -0 "${WPID[$r]}" 2>/dev/null; then
      rc=0; wait "${WPID[$r]}" || rc=$?
      event "worker $r exited (status $rc): $(grep -v '^\s*$' "$WORKDIR/worker$r.log" | tail -n 1)"
      FAILED="${FAILED:+$FAILED; }worker $r exited $rc at ${t}s"
      WPID[$r]=""
    fi
  done
  if ((t >= next_sample)); then
    steps=$(total_steps)
    rate=$(awk -v a="$steps" -v b="$last_steps" -v t="$((t - last_t))" 'BEGIN { printf "%.1f", (a - b) / t }')
    if ((steps == last_steps)); then STALLED=$((STALLED + 1)); else STALLED=0; fi
    line="$t	$steps	$rate"
    for ((s = 0; s < SERVERS; s++)); do
      kb=""
      [[ -n ${SPID[$s]:-} ]] && kb=$(rss_kb "${SPID[$s]}")
      if [[ -n $kb ]]; then
        mib=$(awk -v k="$kb" 'BEGIN { printf "%.1f", k / 1024 }')
        RSS_FIRST[$s]=${RSS_FIRST[$s]:-$mib}
        RSS_LAST[$s]=$mib
        awk -v a="$mib" -v b="${RSS_MAX[$s]:-0}" 'BEGIN { exit !(a > b) }' && RSS_MAX[$s]=$mib
      else
        mib=-
      fi
      line+="	$mib"
    done
    echo "$line" >>"$SAMPLES"
    last_t=$t last_steps=$steps next_sample=$((next_sample + SAMPLE_EVERY))
    if ((STALLED >= 3)); then
      event "no worker step for $((3 * SAMPLE_EVERY)) s"
      FAILED="${FAILED:+$FAILED; }stalled at ${t}s"
      break
    fi
  fi
  [[ -n $FAILED ]] && break
  follow_replacement
  if ((t >= next_kill && t < DURATION)); then
    kill_one
    next_kill=$((next_kill + KILL_EVERY))
  fi
done
END_T=$(elapsed)

# What the scheduler declared, in its own words.
grep -hE "declared dead|fail over|lost|refus" "$WORKDIR/scheduler.log" >"$WORKDIR/scheduler.events" || true
FAILOVERS=$(grep -c "declared dead" "$WORKDIR/scheduler.events" || true)
count_partitions() {   # sum of the counts in the scheduler's lines matching "N $1"
  { grep -oE "[0-9]+ $1" "$WORKDIR/scheduler.events" || true; } | awk '{ s += $1 } END { print s + 0 }'
}
PROMOTED=$(count_partitions "partitions? fails? over")
LOST=$(count_partitions "partitions? had no live replica")
STEPS=$(total_steps)

echo
echo "async, $SERVERS servers (replication $REPLICATION), $WORKERS workers, --hidden $HIDDEN;" \
  "SIGKILL a server every $KILL_EVERY s; ran ${END_T} s of the $DURATION s asked"
echo
echo "RSS (MiB) and steps/s over time (every sample: $SAMPLES):"
ROWS=$(($(wc -l <"$SAMPLES") - 1))
awk -F'\t' -v k="$(((ROWS + 23) / 24))" -v n="$((ROWS + 1))" '
  NR == 1 { printf "%6s %9s %8s", "t s", "steps", "steps/s"; for (i = 4; i <= NF; i++) printf " %8s", "s" (i - 4) " MiB"; print ""; next }
  (NR - 2) % k == 0 || NR == n { printf "%6s %9s %8s", $1, $2, $3; for (i = 4; i <= NF; i++) printf " %8s", $i; print "" }' "$SAMPLES"
echo
printf '%-8s %10s %10s %10s\n' server "first MiB" "max MiB" "last MiB"
for ((s = 0; s < SERVERS; s++)); do
  printf '%-8s %10s %10s %10s\n' "$s" "${RSS_FIRST[$s]:--}" "${RSS_MAX[$s]:--}" "${RSS_LAST[$s]:--}"
done
echo
echo "kills $KILLS, replacements joined $JOINED, refused $REFUSED; scheduler: $FAILOVERS servers declared dead," \
  "$PROMOTED partitions failed over, $LOST partitions lost; total worker steps $STEPS" \
  "($(awk -v s="$STEPS" -v t="$END_T" 'BEGIN { printf "%.1f", s / (t > 0 ? t : 1) }') steps/s overall)"
echo "events ($EVENTS):"
sed 's/^/  /' "$EVENTS"
if [[ -s $WORKDIR/scheduler.events ]]; then
  echo "scheduler said:"
  sed 's/^/  /' "$WORKDIR/scheduler.events"
fi
echo "training kept going: $([[ -z $FAILED ]] && echo yes || echo "NO ($FAILED)")"
if ((JSON)); then
  printf '{"duration_s":%d,"ran_s":%d,"kill_every_s":%d,"servers":%d,"replication":%d,"workers":%d,' \
    "$DURATION" "$END_T" "$KILL_EVERY" "$SERVERS" "$REPLICATION" "$WORKERS"
  printf '"kills":%d,"replacements_joined":%d,"replacements_refused":%d,"declared_dead":%d,' \
    "$KILLS" "$JOINED" "$REFUSED" "$FAILOVERS"
  printf '"partitions_failed_over":%d,"partitions_lost":%d,"steps":%d,"kept_training":%s,"rss_mib":{' \
    "$PROMOTED" "$LOST" "$STEPS" "$([[ -z $FAILED ]] && echo true || echo false)"
  for ((s = 0; s < SERVERS; s++)); do
    ((s)) && printf ','
    printf '"%d":{"first":%s,"max":%s,"last":%s}' "$s" "${RSS_FIRST[$s]:-null}" "${RSS_MAX[$s]:-null}" \
      "${RSS_LAST[$s]:-null}"
  done
  printf '}}\n'
fi
[[ -z $FAILED ]]
