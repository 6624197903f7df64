#!/usr/bin/env bash
# Installs every Debian package ShardPS needs to build, test and run its demo.
# Idempotent: when everything is present it only checks and returns (a second or two).
# Usage (as root, or with sudo available): tools/setup.sh [--deploy] [--metrics] [--clang]
#   --deploy  also what deploy/check.sh uses: Slurm and munge, buildah and
#             mmdebstrap (the container image), Node.js and npm (manifest
#             validation), systemd-analyze. Not needed to build or test ShardPS.
#   --metrics also Prometheus, for deploy/metrics_check.sh.
#   --clang   also clang and its sanitizer runtimes and libFuzzer
#             (libclang-rt-14-dev), for tools/fuzz.sh and tools/test.sh --sanitize.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgoogle-glog-dev libzmq3-dev cppzmq-dev
  libgtest-dev libgmock-dev libbenchmark-dev prometheus-cpp-dev
  zlib1g-dev libssl-dev iproute2 iptables python3
  # The scheduler's optional etcd backend: its tests start a real etcd.
  etcd-server etcd-client
  dataset-fashion-mnist
  # The Python package's tests and example: torch for Debian's /usr/bin/python3
  # (about 48 MB to download, half a minute to install without recommends).
  python3-torch
  # `pip install ./python` into a venv (README: Python and PyTorch).
  python3-pip python3-venv python3-setuptools
)

for arg in "$@"; do
  case $arg in
    --deploy)
      packages+=(slurm-wlm munge buildah mmdebstrap systemd)
      # Some Node.js builds (NodeSource's nodejs) carry npm and conflict with Debian's npm.
      if ! command -v npm >/dev/null; then packages+=(nodejs npm); fi ;;
    --metrics) packages+=(prometheus curl) ;;
    --clang) packages+=(clang libclang-rt-14-dev) ;;
    *) echo "setup: unknown argument '$arg' (usage: tools/setup.sh [--deploy] [--metrics] [--clang])" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then sudo_cmd=(sudo); else
    echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
