# Fake hosts for the root scripts (tools/netbench.sh, tools/chaos.sh,
# tools/scalebench.sh): network
# namespaces joined by a bridge, processes started in them, and the cleanup
# that removes all of it on every exit. Sourced, not run.
#
# The sourcing script sets, before calling anything here:
#   TOOL         its name, for messages and the lock file (/run/TOOL-PREFIX.lock)
#   PREFIX       namespaces PREFIX-h0.., bridge PREFIX-br0, veths PREFIX-hN (bridge side)
#   SUBNET       the /24 of the hosts: host i is SUBNET.(i+1)
#   NHOSTS       how many hosts setup_net makes
#   RUN_TIMEOUT  seconds of one run (the backstop `timeout` of started processes)
# and may define, for its own additions:
#   host_setup I NS   called by setup_net once host I's eth0 is up (qdiscs, iptables)
#   before_cleanup    called first by the exit handler (e.g. to heal faults)
# then calls fakehosts_begin (traps and the one-run-at-a-time lock).

die() { echo "$TOOL: $*" >&2; exit 1; }
log() { echo "$TOOL: $*" >&2; }

ns() { echo "$PREFIX-h$1"; }          # namespace of host i
brlink() { echo "$PREFIX-h$1"; }      # bridge-side veth of host i (root namespace)
ip_of() { echo "$SUBNET.$(($1 + 1))"; }
in_ns() { local h=$1; shift; nsenter --net="/run/netns/$(ns "$h")" -- "$@"; }
FAKEHOSTS_MAX=16   # teardown looks for leftovers of up to this many hosts

PIDS=() PNAMES=() PLOGS=()   # processes this script started (PIDs are shared across namespaces)

kill_started() {
  local i
  for i in "${!PIDS[@]}"; do kill -TERM "${PIDS[$i]}" 2>/dev/null || true; done
  for _ in $(seq 20); do
    local alive=0
    for i in "${!PIDS[@]}"; do kill -0 "${PIDS[$i]}" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for i in "${!PIDS[@]}"; do kill -KILL "${PIDS[$i]}" 2>/dev/null || true; done
  for i in "${!PIDS[@]}"; do wait "${PIDS[$i]}" 2>/dev/null || true; done
  PIDS=() PNAMES=() PLOGS=()
}

teardown_net() {
  local i pids
  for ((i = 0; i < FAKEHOSTS_MAX; i++)); do
    if [[ -e /run/netns/$(ns "$i") ]]; then
      # Leftovers of an earlier run killed with SIGKILL: processes still in our namespace.
      pids=$(ip netns pids "$(ns "$i")" 2>/dev/null || true)
      for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
      ip netns del "$(ns "$i")" 2>/dev/null || true
    fi
    ip link show "$(brlink "$i")" &>/dev/null && ip link del "$(brlink "$i")" 2>/dev/null || true
  done
  ip link show "$PREFIX-br0" &>/dev/null && ip link del "$PREFIX-br0" 2>/dev/null || true
}

CLEANED=1   # nothing to clean until this run holds the lock (fakehosts_begin)
cleanup() {
  ((CLEANED)) && return
  CLEANED=1
  declare -F before_cleanup >/dev/null && before_cleanup
  kill_started
  teardown_net
  [[ -n ${WORKDIR:-} ]] && log "logs and results: $WORKDIR"
}
on_signal() {
  log "interrupted ($1); cleaning up"
  cleanup
  trap - "$1"
  exit 130
}

# The loopback scripts (soak, rotation_drill: no namespaces, no lock): every
# process they started (PIDS) ends on exit and on INT, TERM or HUP, and
# WORKDIR, once set, is named as holding `$1` ("logs and samples"); then
# WORKDIR is made: the one given (absolute), or a new /tmp/$TOOL.XXXXXX.
loopback_begin() {
  LOOPBACK_KEPT=$1
  trap loopback_cleanup EXIT
  trap 'loopback_on_signal INT' INT
  trap 'loopback_on_signal TERM' TERM
  trap 'loopback_on_signal HUP' HUP
  if [[ -z ${WORKDIR:-} ]]; then
    WORKDIR=$(mktemp -d "/tmp/$TOOL.XXXXXX")
  else
    mkdir -p "$WORKDIR"
    WORKDIR=$(readlink -f "$WORKDIR")
  fi
}
loopback_cleanup() {
  ((${LOOPBACK_CLEANED:-0})) && return
  LOOPBACK_CLEANED=1
  kill_started
  [[ -z ${WORKDIR:-} ]] || echo "$TOOL: $LOOPBACK_KEPT: $WORKDIR" >&2
}
loopback_on_signal() { echo "$TOOL: interrupted ($1); cleaning up" >&2; loopback_cleanup; trap - "$1"; exit 130; }

# Installs the exit and signal handlers and takes the lock: one run per prefix,
# since the names are fixed.
fakehosts_begin() {
  trap cleanup EXIT
  trap 'on_signal INT' INT
  trap 'on_signal TERM' TERM
  trap 'on_signal HUP' HUP
  exec {LOCKFD}>"/run/$TOOL-$PREFIX.lock"
  flock -n "$LOCKFD" || die "another $TOOL with prefix '$PREFIX' is running (lock /run/$TOOL-$PREFIX.lock)"
  CLEANED=0
}

setup_net() {
  teardown_net   # leftovers of a killed run
  ip link add "$PREFIX-br0" type bridge
  ip link set "$PREFIX-br0" up
  local i n
  for ((i = 0; i < NHOSTS; i++)); do
    n=$(ns "$i")
    ip netns add "$n"
    ip link add "$(brlink "$i")" type veth peer name "$PREFIX-p$i"
    ip link set "$PREFIX-p$i" netns "$n"
    ip -n "$n" link set "$PREFIX-p$i" name eth0
    ip -n "$n" addr add "$(ip_of "$i")/24" dev eth0
    ip -n "$n" link set lo up
    ip -n "$n" link set eth0 up
    ip link set "$(brlink "$i")" master "$PREFIX-br0"
    ip link set "$(brlink "$i")" up
    if declare -F host_setup >/dev/null; then host_setup "$i" "$n"; fi
  done
}

# tbf on host $1's eth0 (its egress) and on the bridge side of its veth (its ingress).
shape_host() {
  tc -n "$(ns "$1")" qdisc add dev eth0 root tbf rate "$2" burst "$3" latency 50ms
  tc qdisc add dev "$(brlink "$1")" root tbf rate "$2" burst "$3" latency 50ms
}

# Reachability from host $1 to address $2: ping where installed; otherwise a TCP
# connect to a closed port (a quick "refused" proves the path, a timeout does not).
reachable() {
  if command -v ping >/dev/null; then
    in_ns "$1" ping -c 1 -W 2 "$2" >/dev/null 2>&1
  else
    local out rc=0
    out=$(in_ns "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) || rc=$?
    ((rc == 0)) || [[ $out == *"refused"* ]]
  fi
}

check_net() {   # check_net WHAT: every pair of hosts reachable; WHAT describes the links
  local i j
  for ((i = 0; i < NHOSTS; i++)); do
    for ((j = 0; j < NHOSTS; j++)); do
      ((i == j)) && continue
      reachable "$i" "$(ip_of "$j")" || die "host h$i ($(ns "$i")) cannot reach h$j at $(ip_of "$j")"
    done
  done
  log "fake hosts up: h0..h$((NHOSTS - 1)) at $SUBNET.1-$NHOSTS, $1; all pairs reachable"
}

# start HOST NAME LOG CMD...: runs CMD in HOST's namespace in the background. The
# `timeout` wrapper is a backstop that ends the process even if the script is
# killed with SIGKILL.
start() {
  local h=$1 name=$2 logf=$3; shift 3
  nsenter --net="/run/netns/$(ns "$h")" -- \
    timeout --kill-after=5 $((RUN_TIMEOUT + 30)) "$@" >"$logf" 2>&1 {LOCKFD}>&- &
  PIDS+=($!) PNAMES+=("h$h $name") PLOGS+=("$logf")
}

report_failure() {   # report_failure INDEX WHY [LABEL]
  local i=$1
  echo "$TOOL: ${3:-FAILED}: ${PNAMES[$i]} (pid ${PIDS[$i]}) $2; last lines of ${PLOGS[$i]}:" >&2
  tail -n 20 "${PLOGS[$i]}" | sed 's/^/    | /' >&2
}

# wait_clients ND: waits until every process started at an index >= ND (the
# clients; those below ND are daemons) has exited. Returns 1, after reporting
# which process and why, as soon as a client exits non-zero, a daemon exits, or
# RUN_TIMEOUT seconds pass. Kills nothing (kill_started does).
wait_clients() {
  local nd=$1 deadline=$((SECONDS + RUN_TIMEOUT)) i rc done_clients
  declare -A finished=()
  while :; do
    done_clients=0
    for ((i = nd; i < ${#PIDS[@]}; i++)); do
      if [[ -n ${finished[$i]:-} ]]; then done_clients=$((done_clients + 1)); continue; fi
      if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
        rc=0; wait "${PIDS[$i]}" || rc=$?
        finished[$i]=1
        done_clients=$((done_clients + 1))
        if ((rc != 0)); then report_failure "$i" "exited with status $rc"; return 1; fi
      fi
    done
    ((done_clients == ${#PIDS[@]} - nd)) && return 0
    for ((i = 0; i < nd; i++)); do
      if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
        rc=0; wait "${PIDS[$i]}" || rc=$?
        report_failure "$i" "exited (status $rc) while the clients were still running"
        return 1
      fi
    done
    if ((SECONDS >= deadline)); then
      echo "$TOOL: TIMEOUT: the run exceeded its ${RUN_TIMEOUT}s limit (--timeout); killing every process" >&2
      for ((i = nd; i < ${#PIDS[@]}; i++)); do
        [[ -n ${finished[$i]:-} ]] || report_failure "$i" "had not finished after ${RUN_TIMEOUT}s"
      done
      for ((i = 0; i < nd; i++)); do report_failure "$i" "was still running (daemon)" "also"; done
      return 1
    fi
    sleep 0.2
  done
}

# The checks of a fake-host script before it creates anything (PREFIX and
# SUBNET well formed, root, the tools), then ROOT and the shardps binary
# (find_shardps).
fakehosts_preflight() {
  [[ $PREFIX =~ ^[a-z0-9]{1,6}$ ]] || die "--prefix must be 1-6 lower-case letters/digits"
  [[ $SUBNET =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet must be the first three numbers of a /24, e.g. 10.77.0; got '$SUBNET'"
  if [[ $(id -u) -ne 0 ]]; then
    die "must run as root (it creates network namespaces, veths, a bridge and tbf qdiscs); try: sudo $0 with the same flags"
  fi
  local tool
  for tool in ip tc nsenter timeout awk flock; do
    command -v "$tool" >/dev/null || die "needs '$tool' (Debian: iproute2, util-linux, coreutils, gawk/mawk)"
  done
  ROOT=$(cd "$(dirname "$0")/.." && pwd)
  find_shardps
}

# Finds the shardps binary (SHARDPS_BIN if set, else the build tree's) and checks
# that it runs; sets SHARDPS_BIN to its absolute path. Needs ROOT.
find_shardps() {
  if [[ -z $SHARDPS_BIN ]]; then
    for c in "$ROOT/build/tools/shardps" /work/build-ci/tools/shardps; do
      [[ -x $c ]] && { SHARDPS_BIN=$c; break; }
    done
  fi
  [[ -n $SHARDPS_BIN && -x $SHARDPS_BIN ]] ||
    die "no shardps binary (build it with tools/build.sh, or pass --shardps PATH)"
  SHARDPS_BIN=$(readlink -f "$SHARDPS_BIN")
  "$SHARDPS_BIN" train --help >/dev/null 2>&1 || die "$SHARDPS_BIN does not run ('shardps train --help' failed)"
}
