#!/usr/bin/env bash
# Checks everything under deploy/ on this machine, offline except for package
# installs: renders and validates the Kubernetes manifests, verifies the systemd
# units, builds the container image, resolves the GPU image's CUDA packages
# (not built: no GPU here), runs a job through the Slurm script on a
# private slurmctld + slurmd, and runs a job the way the MXJob starts it (only
# DMLC_* variables, `shardps run`). Jobs run in a private network namespace
# (loopback only). One line per check, a summary at the end; exit 1 on failure.
#
# Usage (as root): deploy/check.sh [--no-image] [--gpu-image] [--keep]
#   --no-image  skip the container image build (the longest step on a fresh machine)
#   --gpu-image also build the GPU image (--build-arg CUDA=1: about 2 GB of Debian's
#               CUDA packages) and check it like the other, CUDA runtime linked
#   --keep      keep the work directory (logs, rendered manifests) for inspection
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=${SHARDPS_BUILD_DIR:-build}
shardps=$repo/$build/tools/shardps

# --inner NAME: one job check, run by the outer script inside `unshare --net`.
if [[ ${1:-} == --inner ]]; then
  ip link set lo up
  # Slurm resolves its listen address with AI_ADDRCONFIG, which finds nothing
  # while the only addresses are loopback ones: one more address on lo (not
  # reachable from outside this namespace) makes it bind.
  ip addr add 10.254.0.1/32 dev lo
  job=$2
  work=$3
  pids=()
  stop_inner() {
    local rc=$? p
    # Jobs of the private Slurm cluster first (their tasks are not slurmd's children).
    if [[ -n ${SLURM_CONF:-} ]]; then timeout 10 scancel --quiet --user=root 2>/dev/null || true; sleep 1; fi
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    return $rc
  }
  trap stop_inner EXIT
  trap 'exit 143' INT TERM
  finite_loss() {  # FILE: prints final_loss, fails unless it is a finite number
    local loss
    loss=$(awk '$1 == "final_loss" { print $2 }' "$1")
    [[ $loss =~ ^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] || { echo "final_loss '$loss' is not finite" >&2; return 1; }
    echo "$loss"
  }

  case $job in
  slurm)
    d=$work/slurm
    mkdir -p "$d/state" "$d/spool" "$d/out"
    host=$(hostname)
    dd if=/dev/urandom of="$d/munge.key" bs=1024 count=1 status=none
    chmod 0600 "$d/munge.key"
    munged --key-file="$d/munge.key" --socket="$d/munge.sock" --pid-file="$d/munged.pid" \
      --log-file="$d/munged.log" --seed-file="$d/munged.seed" --force
    for _ in $(seq 50); do [[ -s $d/munged.pid ]] && break; sleep 0.1; done
    pids+=("$(cat "$d/munged.pid")")
    cat >"$d/slurm.conf" <<EOF
ClusterName=shardpscheck
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=check Nodes=ALL Default=YES MaxTime=30 State=UP
EOF
    export SLURM_CONF=$d/slurm.conf
    slurmctld -i -D >"$d/slurmctld.out" 2>&1 &
    pids+=($!)
    slurmd -D >"$d/slurmd.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 60); do
      timeout 5 sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix)' && break
      sleep 1
    done
    timeout 5 sinfo -h -o '%n %t %c' | grep -qE ' (idle|mix) ' || { cat "$d/slurmctld.log" "$d/slurmd.log" >&2; exit 1; }
    # Submitted from the repository root, as deploy/README.md says; the addresses
    # are set to loopback because this one-node cluster lives on it.
    # In the background: `wait` returns at once when this script is told to stop.
    SHARDPS_BIN_DIR=$(dirname "$shardps") SHARDPS_OUTDIR=$d/out DMLC_PS_ROOT_URI=127.0.0.1 \
      DMLC_PS_ROOT_PORT=7000 DMLC_NODE_HOST=127.0.0.1 \
      timeout 900 sbatch --wait --ntasks=5 --time=15 --output="$d/job.log" deploy/slurm/shardps.sbatch &
    pids+=($!)
    wait $! || { echo "sbatch failed; job log:" >&2; cat "$d/job.log" >&2; exit 1; }
    cat "$d/job.log"
    loss=$(finite_loss "$d/out/result.0")
    steps=$(awk '$1 == "steps" { print $2 }' "$d/out/result.0")
    echo "RESULT slurm job: 2 servers, 2 workers, $steps steps, final loss $loss"
    ;;

  mxjob)
    d=$work/mxjob
    mkdir -p "$d"
    # Each replica's args, exactly as deploy/kubeflow/mxjob.yaml gives them.
    node --input-type=module -e "
      import { pathToFileURL } from 'node:url';
      import fs from 'node:fs';
      const YAML = (await import(pathToFileURL('$work/npm/node_modules/yaml/dist/index.js').href)).default;
      const job = YAML.parse(fs.readFileSync('deploy/kubeflow/mxjob.yaml', 'utf8'));
      for (const [role, r] of Object.entries(job.spec.mxReplicaSpecs)) {
        const c = r.template.spec.containers.find((c) => c.name === 'mxnet');
        const port = (c.ports ?? []).find((p) => p.name === 'mxjob-port');
        console.log([role.toLowerCase(), r.replicas, port ? port.containerPort : '-', ...(c.args ?? [])].join('\t'));
      }" >"$d/replicas.tsv"
    cat "$d/replicas.tsv"
    declare -A count args
    root_port=
    while IFS=$'\t' read -r role n port rest; do
      count[$role]=$n
      args[$role]=$rest
      [[ $role == scheduler ]] && root_port=$port
    done <"$d/replicas.tsv"
    [[ ${count[scheduler]} == 1 && -n $root_port && $root_port != - ]] || { echo "bad Scheduler replica" >&2; exit 1; }
    # What the operator sets in every replica; per pod: DMLC_ROLE, and for
    # workers MX_CONFIG's task index (and the replica-index label the
    # manifest maps to DMLC_WORKER_ID). DMLC_NODE_HOST is the pod IP in the
    # manifest: here every "pod" shares 127.0.0.1, so servers get distinct PORTs.
    common=(DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$root_port
            DMLC_NUM_SERVER=${count[server]} DMLC_NUM_WORKER=${count[worker]} DMLC_USE_KUBERNETES=1)
    start() {  # NAME OUT ENV... -- ARGS...
      local name=$1 out=$2; shift 2
      local envs=()
      while [[ $1 != -- ]]; do envs+=("$1"); shift; done
      shift
      env -i PATH=/usr/bin:/bin "${common[@]}" "${envs[@]}" "$shardps" "$@" >"$out" 2>"$d/$name.err" &
      pids+=($!)
      echo "started $name (pid $!): ${envs[*]} shardps $*"
    }
    read -ra a <<<"${args[scheduler]}"
    start scheduler /dev/null DMLC_ROLE=scheduler -- "${a[@]}"
    daemons=("${pids[@]}")
    read -ra a <<<"${args[server]}"
    for ((i = 0; i < count[server]; i++)); do
      start "server$i" /dev/null DMLC_ROLE=server DMLC_NODE_HOST=127.0.0.1 PORT=$((7001 + i)) -- "${a[@]}"
      daemons+=("${pids[-1]}")
    done
    read -ra a <<<"${args[worker]}"
    workers=()
    for ((i = 0; i < count[worker]; i++)); do
      start "worker$i" "$d/worker$i.out" DMLC_ROLE=worker DMLC_WORKER_ID=$i \
        "MX_CONFIG={\"task\":{\"type\":\"worker\",\"index\":$i}}" -- "${a[@]}"
      workers+=("${pids[-1]}")
    done
    failed=0
    for i in "${!workers[@]}"; do
      if ! wait "${workers[$i]}"; then
        echo "worker $i failed:" >&2; tail -20 "$d/worker$i.err" >&2; failed=1
      fi
    done
    for p in "${daemons[@]}"; do kill -TERM "$p"; done
    for p in "${daemons[@]}"; do wait "$p" || { echo "a daemon exited non-zero after SIGTERM" >&2; failed=1; }; done
    pids=()
    for f in "$d"/*.err; do echo "== $f"; tail -5 "$f"; done
    ((failed == 0)) || exit 1
    loss=$(finite_loss "$d/worker0.out")
    steps=$(awk '$1 == "steps" { print $2 }' "$d/worker0.out")
    acc=$(awk '$1 == "test_accuracy" { print $2 }' "$d/worker0.out")
    echo "RESULT mxjob-env job: ${count[server]} servers, ${count[worker]} workers, $steps steps," \
         "final loss $loss, test accuracy $acc"
    ;;

  image)
    # The image's binary, as its own user, in a chroot of the image's file system
    # (a private mount namespace: /proc for the children `shardps local` starts).
    mnt=$4
    mount -t proc proc "$mnt/proc"
    chroot --userspec=10001:10001 "$mnt" /usr/local/bin/shardps local --servers 1 --workers 1 \
      --max-steps 100 --test-limit 1000 --log-every 0 | tee "$work/image-local.out"
    grep -q 'test accuracy' "$work/image-local.out"
    ;;
  esac
  exit 0
fi

no_image=0 keep=0 gpu_image_build=0
for arg in "$@"; do
  case $arg in
    --no-image) no_image=1 ;;
    --gpu-image) gpu_image_build=1 ;;
    --keep) keep=1 ;;
    *) echo "usage: deploy/check.sh [--no-image] [--gpu-image] [--keep]" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "deploy/check.sh: run as root (Slurm daemons, namespaces, image build)" >&2; exit 2; }

work=$(mktemp -d /tmp/shardps-deploy-check.XXXXXX)
cleanup() {
  local rc=$?
  if [[ -n $current ]]; then kill -TERM "$current" 2>/dev/null || true; wait "$current" 2>/dev/null || true; fi
  # Daemons of an interrupted inner check: their pid files are in the work dir.
  for f in "$work"/slurm/*.pid; do [[ -e $f ]] && kill -TERM "$(cat "$f")" 2>/dev/null || true; done
  if ((keep)); then echo "work directory kept: $work"; else rm -rf "$work"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

summary=()
failures=0
current=
# check NAME COMMAND...: runs the command (a function: with errexit, in a child
# of its own) with its output in NAME.log; PASS with the RESULT lines it
# printed, or FAIL with the log's tail.
check() {
  local name=$1; shift
  local log=$work/$name.log
  local start=$SECONDS
  printf '%-16s ... ' "$name"
  "$@" >"$log" 2>&1 &
  current=$!
  if wait "$current"; then
    local detail
    detail=$(grep '^RESULT ' "$log" | sed 's/^RESULT //' | paste -sd ';' - | sed 's/;/; /g' || true)
    echo "PASS ($((SECONDS - start)) s) $detail"
    summary+=("PASS  $name  $detail")
  else
    echo "FAIL ($((SECONDS - start)) s), last lines of $log:"
    tail -25 "$log" | sed 's/^/    /'
    summary+=("FAIL  $name")
    failures=$((failures + 1))
  fi
  current=
}
skip() {
  printf '%-16s ... SKIP %s\n' "$1" "$2"
  summary+=("SKIP  $1  $2")
}

check setup tools/setup.sh --deploy
check build tools/build.sh

render() {
  command -v kubectl >/dev/null || { echo "kubectl not found: it is not a Debian 12 package, install it from Kubernetes' apt repository"; return 1; }
  local o n
  for o in deploy/k8s/overlays/*/; do
    o=$(basename "$o")
    kubectl kustomize "deploy/k8s/overlays/$o" >"$work/k8s-$o.yaml"
    n=$(grep -c '^kind:' "$work/k8s-$o.yaml")
    echo "RESULT $o: $n objects"
  done
}
check k8s-render render

validate() {
  npm install --silent --no-audit --no-fund --prefix "$work/npm" kubernetes-models@5 yaml@2
  local out
  out=$(node deploy/validate.mjs "$work/npm/node_modules" "$work"/k8s-*.yaml deploy/kubeflow/mxjob.yaml) ||
    { echo "$out"; return 1; }
  echo "$out"
  echo "RESULT $(grep -c '^valid' <<<"$out") objects valid (both overlays and the MXJob)"
}
check k8s-validate validate

# The cluster config each overlay ships: accepted by the scheduler, and sized
# like the overlay's servers (StatefulSet replicas) and workers (Job completions).
k8s_config() {
  local f o servers workers
  for f in "$work"/k8s-*.yaml; do
    o=${f##*/k8s-}; o=${o%.yaml}
    node --input-type=module -e "
      import { pathToFileURL } from 'node:url';
      import fs from 'node:fs';
      const YAML = (await import(pathToFileURL('$work/npm/node_modules/yaml/dist/index.js').href)).default;
      const objs = YAML.parseAllDocuments(fs.readFileSync('$f', 'utf8')).map((d) => d.toJS());
      const cm = objs.find((x) => x.kind === 'ConfigMap' && x.metadata.name.startsWith('shardps-cluster'));
      fs.writeFileSync('$work/$o.pbtxt', cm.data['cluster.pbtxt']);
      const sts = objs.find((x) => x.kind === 'StatefulSet');
      const job = objs.find((x) => x.kind === 'Job');
      console.log(sts.spec.replicas, job.spec.completions);" >"$work/$o.sizes"
    read -r servers workers <"$work/$o.sizes"
    grep -qE "^num_servers: $servers\$" "$work/$o.pbtxt" || { echo "$o: config num_servers is not the $servers server replicas"; return 1; }
    grep -qE "^num_workers: $workers\$" "$work/$o.pbtxt" || { echo "$o: config num_workers is not the $workers worker completions"; return 1; }
    # The scheduler loads and validates it, serves on loopback, and stops.
    "$shardps" scheduler --listen 127.0.0.1:0 --config "$work/$o.pbtxt" --port-file "$work/$o.addr" &
    local pid=$!
    for _ in $(seq 50); do [[ -s $work/$o.addr ]] && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
    kill -TERM $pid 2>/dev/null || true
    wait $pid
    [[ -s $work/$o.addr ]] || { echo "$o: scheduler refused the config"; return 1; }
    echo "RESULT $o: config accepted, $servers servers, $workers workers"
  done
}
check k8s-config k8s_config

# The GPU image (Containerfile --build-arg CUDA=1) as far as it goes without a
# GPU: the gpu overlay runs the image that build tags, and every package of
# cuda-packages.txt resolves, stage by stage, in Debian 12's contrib and
# non-free index (a private apt state; nothing is installed). The image itself
# is built only with --gpu-image (about 2 GB of toolkit), and never run on a GPU.
gpu_image() {
  local name apt stage n
  name=$(awk '$1 == "newName:" {print $2}' deploy/k8s/overlays/gpu/kustomization.yaml)
  grep -q -- "--build-arg CUDA=1 .* -t $name " deploy/container/Containerfile ||
    { echo "the gpu overlay runs image '$name', which the Containerfile's CUDA=1 build does not tag"; return 1; }
  apt=$work/apt-non-free
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
  echo 'deb http://deb.debian.org/debian bookworm main contrib non-free' >"$apt/sources.list"
  local opts=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=/dev/null
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
  apt-get "${opts[@]}" -qq update
  local plan
  for stage in build runtime; do
    plan=$(apt-get "${opts[@]}" -s -qq --no-install-recommends install \
             $(awk -v s=$stage '$1 == s {print $2}' deploy/container/cuda-packages.txt)) ||
      { echo "$plan"; echo "the $stage stage's packages of cuda-packages.txt do not resolve"; return 1; }
    n=$(grep -c '^Inst' <<<"$plan" || true)
    echo "RESULT $stage stage: $(awk -v s=$stage '$1 == s {printf "%s ", $2}' deploy/container/cuda-packages.txt)resolve ($n packages to install here)"
  done
  echo "RESULT overlay image $name, CUDA toolkit $(apt-cache "${opts[@]}" show --no-all-versions nvidia-cuda-toolkit | awk '$1 == "Version:" {print $2}'), not built here (--gpu-image builds it)"
}
check gpu-image gpu_image

units() {
  local d=$work/systemd u
  mkdir -p "$d"
  # The units' binary path, pointed at this build so verify finds an executable.
  for u in deploy/systemd/*.service; do sed "s|/usr/local/bin/shardps|$shardps|" "$u" >"$d/${u##*/}"; done
  cp "$d/shardps-server@.service" "$d/shardps-server@7001.service"
  local out
  out=$(cd "$d" && systemd-analyze verify ./shardps-scheduler.service ./shardps-server@7001.service 2>&1)
  # verify prints some findings without failing: any output counts.
  [[ -z $out ]] || { echo "$out"; return 1; }
  echo "RESULT systemd-analyze verify: scheduler, server@7001"
}
if command -v systemd-analyze >/dev/null; then check systemd-verify units; else skip systemd-verify "systemd-analyze not installed"; fi

# image TAG [BUILD ARGS...]: builds the Containerfile as TAG and checks it.
image() {
  local tag=$1; shift
  # Base image from Debian packages (no registry needed), made once and kept.
  if ! buildah inspect --type image localhost/shardps-base:bookworm >/dev/null 2>&1; then
    mmdebstrap --variant=minbase bookworm "$work/base.tar" http://deb.debian.org/debian
    local base
    base=$(buildah from scratch)
    buildah add "$base" "$work/base.tar" /
    buildah commit --rm "$base" localhost/shardps-base:bookworm
  fi
  # chroot isolation: RUN steps need no OCI runtime (see deploy/README.md).
  buildah bud --isolation chroot --network host --layers -f deploy/container/Containerfile \
    --build-arg BASE_IMAGE=localhost/shardps-base:bookworm "$@" -t "$tag" .
  local mnt user entry c
  container=$(buildah from "$tag")
  trap 'buildah umount "$container" >/dev/null 2>&1; buildah rm "$container" >/dev/null 2>&1' EXIT
  mnt=$(buildah mount "$container")
  user=$(buildah inspect --type image -f '{{.OCIv1.Config.User}}' "$tag")
  entry=$(buildah inspect --type image -f '{{.OCIv1.Config.Entrypoint}}' "$tag")
  [[ $user == 10001:10001 ]] || { echo "image user is '$user'"; return 1; }
  [[ $entry == "[/usr/local/bin/shardps]" ]] || { echo "entry point is '$entry'"; return 1; }
  for c in cc gcc g++ c++ cpp clang ld as; do
    [[ ! -e $mnt/usr/bin/$c ]] || { echo "runtime image holds /usr/bin/$c"; return 1; }
  done
  # Every library the binary needs is in the image.
  if chroot "$mnt" ldd /usr/local/bin/shardps | grep 'not found'; then return 1; fi
  if [[ $* == *CUDA=1* ]] && ! chroot "$mnt" ldd /usr/local/bin/shardps | grep -q libcudart; then
    echo "$tag: the binary does not link the CUDA runtime"; return 1
  fi
  unshare --net --mount --fork -- "$repo/deploy/check.sh" --inner image "$work" "$mnt"
  echo "RESULT $tag $(buildah images --format '{{.Size}}' "$tag" | head -1), user 10001, no compiler, trains in a chroot of it"
}
if ((no_image)); then
  skip image "--no-image"
elif command -v buildah >/dev/null; then
  check image image localhost/shardps:latest
else
  skip image "buildah not installed"
fi
if ((gpu_image_build)) && command -v buildah >/dev/null; then
  check gpu-image-build image localhost/shardps-cuda:latest --build-arg CUDA=1
else
  skip gpu-image-build "without --gpu-image"
fi

check slurm-job unshare --net -- "$repo/deploy/check.sh" --inner slurm "$work"
check mxjob-env-job unshare --net -- "$repo/deploy/check.sh" --inner mxjob "$work"

echo
echo "deploy/check.sh summary:"
printf '  %s\n' "${summary[@]}"
if ((failures)); then
  echo "FAIL: $failures check(s) failed"
  exit 1
fi
echo "PASS"
