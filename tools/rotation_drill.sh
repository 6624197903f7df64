#!/usr/bin/env bash
# Rotation drill: a secured job on loopback whose cluster token is rotated
# while it trains, by the steps deploy/README.md ("Rotating credentials")
# gives an operator: the scheduler restarted accepting the new token too,
# every server and worker restarted on it one at a time, the scheduler
# restarted with the new token only. Passes when every worker finishes (exit 0)
# and a node still on the old token is refused at the end. Needs no root.
#
# Every process it starts is ended on exit, on failure and on Ctrl-C.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tools/rotation_drill.sh [flags]

flags:
  --servers N        server processes (default 2)
  --workers N        worker processes (default 2)
  --epochs N         epochs each worker trains (default 6)
  --pause S          seconds between two restarts (default 4)
  --cipher C         the servers' data_cipher: AES_256_GCM (default) or CURVE
  --shardps PATH     the shardps binary (default: $SHARDPS, build/tools/shardps)
  --workdir DIR      credentials and logs (default: a new temp dir, kept; printed)
  -h, --help         this text
EOF
}

TOOL=rotation_drill
source "$(dirname "$0")/fakehosts.sh"   # for die, kill_started and find_shardps; no namespaces here

SERVERS=2 WORKERS=2 EPOCHS=6 PAUSE=4 CIPHER=AES_256_GCM SHARDPS_BIN=${SHARDPS:-} WORKDIR=""
while (($#)); do
  case "$1" in
    --servers) SERVERS=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --pause) PAUSE=$2; shift 2 ;;
    --cipher) CIPHER=$2; shift 2 ;;
    --shardps) SHARDPS_BIN=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument $1" ;;
  esac
done
for v in SERVERS WORKERS EPOCHS PAUSE; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
[[ $CIPHER == AES_256_GCM || $CIPHER == CURVE ]] || die "--cipher must be AES_256_GCM or CURVE, got '$CIPHER'"
((SERVERS >= 2 && WORKERS >= 1 && EPOCHS >= 1)) || die "--servers must be >= 2 (replication 2), --workers and --epochs >= 1"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
find_shardps
T0=$(date +%s.%N)
log() { printf '%s: [%5.1fs] %s\n' "$TOOL" "$(echo "$(date +%s.%N) - $T0" | bc)" "$*" >&2; }
loopback_begin "credentials and logs"
cd "$WORKDIR"
rm -rf certs state ./*.log ./*.result
"$SHARDPS_BIN" certs --out certs >/dev/null
sed -i "s|security {|security {\n  data_cipher: $CIPHER|" certs/node.conf
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >token.next
# The three security blocks of the drill: the scheduler accepting both
# tokens, then only the new one; nodes on the new one.
sed "s|security {|security {\n  accepted_token_files: \"$WORKDIR/token.next\"|" certs/scheduler.conf >scheduler-accepting.conf
sed "s|token_file: \"[^\"]*\"|token_file: \"$WORKDIR/token.next\"|" certs/scheduler.conf >scheduler-new.conf
sed "s|token_file: \"[^\"]*\"|token_file: \"$WORKDIR/token.next\"|" certs/node.conf >node-new.conf

PORT=$((17000 + RANDOM % 20000))
SCHED=127.0.0.1:$PORT
declare -A PID_OF   # role -> pid of its current process
run() {   # run ROLE LOG CMD...: starts CMD, remembered as ROLE
  local role=$1 logf=$2; shift 2
  "$@" >>"$logf" 2>&1 &
  PID_OF[$role]=$!
  PIDS+=("$!") PNAMES+=("$role") PLOGS+=("$logf")
}
scheduler() {
  run scheduler scheduler.log "$SHARDPS_BIN" scheduler --listen "$SCHED" --state-dir state --security-config "$1" \
    --set num_servers="$SERVERS" --set num_workers="$WORKERS"
}
server() {
  run "server$1" "server$1.log" "$SHARDPS_BIN" server --scheduler "$SCHED" --listen "tcp://127.0.0.1:$((PORT + 1 + $1))" \
    --security-config "$2"
}
worker() {
  run "worker$1" "worker$1.log" "$SHARDPS_BIN" train --scheduler "$SCHED" --rank "$1" --epochs "$EPOCHS" --log-every 0 \
    --security-config "$2" --result-file "worker$1.$3.result"
}
stop() {   # stop ROLE: SIGTERM, and wait for it (a server drains, a worker leaves)
  local pid=${PID_OF[$1]}
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

log "starting a secured job: $SERVERS servers ($CIPHER), $WORKERS workers, $EPOCHS epochs (workdir $WORKDIR)"
scheduler certs/scheduler.conf
sleep 0.5
for ((i = 0; i < SERVERS; i++)); do server "$i" certs/node.conf; done
for ((i = 0; i < WORKERS; i++)); do worker "$i" certs/node.conf first; done
sleep "$PAUSE"
log "step 1: scheduler restarted accepting the new token beside the old"
stop scheduler; scheduler scheduler-accepting.conf; sleep "$PAUSE"
for ((i = 0; i < SERVERS; i++)); do
  log "step 2: server $i restarted on the new token"
  stop "server$i"; server "$i" node-new.conf; sleep "$PAUSE"
done
for ((i = 0; i < WORKERS; i++)); do
  # A worker that already finished has a job past its last round to rejoin:
  # its new process would exit "nothing to train", which says nothing of
  # the rotation.
  kill -0 "${PID_OF[worker$i]}" 2>/dev/null ||
    die "worker $i finished its $EPOCHS epochs before the drill restarted it: give the job more --epochs (or a shorter --pause)"
  log "step 2: worker $i restarted on the new token"
  stop "worker$i"; worker "$i" node-new.conf second; sleep "$PAUSE"
done
log "step 3: scheduler restarted with the new token only"
stop scheduler; scheduler scheduler-new.conf; sleep 2
old=$("$SHARDPS_BIN" status --scheduler "$SCHED" --security-config certs/node.conf 2>&1 || true)
grep -q "wrong cluster token" <<<"$old" || die "a node on the old token was not refused: $old"
log "a node on the old token is refused: ${old##*: }"
failed=0
for ((i = 0; i < WORKERS; i++)); do
  if wait "${PID_OF[worker$i]}"; then
    log "worker $i finished: $(tr '\n' ' ' <"worker$i.second.result" | cut -c1-60)"
  else
    log "worker $i FAILED (exit $?): $(tail -2 "worker$i.log" | tr '\n' ' ')"
    failed=1
  fi
done
grep -h "accepting .* cluster tokens\|joins the running job\|rejoins the running job" scheduler.log | cut -c1-160 >&2 || true
((failed == 0)) || die "the job did not survive the rotation"
log "PASS: the token was rotated while the job trained"
