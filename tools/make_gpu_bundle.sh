#!/usr/bin/env bash
# make_gpu_bundle.sh: packs this build's executables with their non-system
# shared libraries so they run on the lent GPU machine (CUDA driver present,
# none of this project's Debian libraries).
#
# Usage (here):    tools/make_gpu_bundle.sh [BUILD_DIR (default build)] [BUNDLE_DIR]
#                  BUNDLE_DIR defaults to BUILD_DIR/gpu-bundle; keep it under
#                  the repo (e.g. build/gpu-bundle) and pass it in `carry`.
# Usage (on GPU):  BUNDLE/run.sh shardps bench-local --json   # any bundled command
#                  BUNDLE/run-gpu-checks.sh                   # CUDA tests + GPU benches
#                                                             # (bench-codec, bench-local
#                                                             # with and without --codec);
#                                                             # results under $OUT if set
# What goes in: every executable ELF file under BUILD_DIR (outside CMakeFiles),
# i.e. the `shardps` CLI and the test binaries, copied with
# `strip --strip-debug`; libshardps.so and the Python package (python/); every shared library they load except glibc's own
# (libc, libm, libmvec, libpthread, libdl, librt, libresolv, ld-linux) and the
# CUDA driver (libcuda, libnvidia-*). libstdc++ and libgcc_s are included.
# libnccl (over 200 MiB) is left out when the bundle would pass 64 MiB: run.sh
# then looks for libnccl.so.2 on the GPU machine (SHARDPS_NCCL_DIR, the CUDA
# toolkit, or PyTorch's nvidia/nccl wheel).
set -euo pipefail

build=${1:-build}
bundle=${2:-$build/gpu-bundle}
limit_mib=64
[[ -d "$build" ]] || { echo "no build dir: $build" >&2; exit 1; }
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
bundle_abs=$(cd "$bundle" && pwd)

is_executable_elf() {
  [[ "$1" != *.so && "$1" != *.so.* ]] && readelf -h "$1" 2>/dev/null | grep -qE 'Type:\s+(EXEC|DYN)' &&
    readelf -l "$1" 2>/dev/null | grep -q 'INTERP'
}

system_lib() {
  [[ "$1" =~ ^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libpthread|libdl\.so|librt\.so|libresolv|libcuda\.so|libnvidia-) ]]
}

mapfile -t bins < <(find "$build" \( -name CMakeFiles -o -path "$bundle_abs" -o -path "$bundle" \) -prune \
  -o -type f -perm -u+x -print | sort)
for f in "${bins[@]}"; do
  is_executable_elf "$f" || continue
  strip --strip-debug -o "$bundle/bin/$(basename "$f")" "$f"
  echo "bin  $(basename "$f")"
done

# The C ABI library and the Python package, for the PyTorch check on the GPU.
if [[ -f "$build/worker/libshardps.so" ]]; then
  strip --strip-debug -o "$bundle/lib/libshardps.so" "$(readlink -f "$build/worker/libshardps.so")"
  mkdir -p "$bundle/python"
  repo=$(cd "$(dirname "$0")/.." && pwd)
  cp -r "$repo/python/shardps" "$repo/python/tests" "$repo/python/examples" "$bundle/python/"
  find "$bundle/python" -name __pycache__ -prune -exec rm -rf {} +
  echo "lib  libshardps.so (+ python/)"
fi

declare -A libs=()
for f in "$bundle"/bin/* "$bundle"/lib/libshardps.so; do
  [[ -f "$f" ]] || continue
  while read -r name _ path _; do
    [[ -n "${path:-}" && -f "$path" ]] || continue
    system_lib "$name" || libs[$name]=$path
  done < <(ldd "$f" 2>/dev/null | grep '=>')
done
for name in "${!libs[@]}"; do
  strip --strip-debug -o "$bundle/lib/$name" "${libs[$name]}"
done

size_mib() { du -sm "$bundle" | cut -f1; }
if [[ -f "$bundle/lib/libnccl.so.2" && $(size_mib) -gt $limit_mib ]]; then
  rm "$bundle/lib/libnccl.so.2"
  echo "left out libnccl.so.2 (too large); run.sh finds it on the GPU machine"
fi

cat > "$bundle/run.sh" <<'RUN'
#!/usr/bin/env bash
# run.sh COMMAND [ARGS...]: runs a bundled binary (bin/ is on PATH) with the
# bundle's libraries first on LD_LIBRARY_PATH.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
extra=""
if [[ ! -f "$here/lib/libnccl.so.2" ]]; then
  for d in "${SHARDPS_NCCL_DIR:-}" /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu \
           $(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null); do
    [[ -n "$d" && -f "$d/libnccl.so.2" ]] && { extra=":$d"; break; }
  done
fi
export LD_LIBRARY_PATH="$here/lib$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$here/bin:$PATH"
export GLOG_logtostderr=1
exec "$@"
RUN

cat > "$bundle/run-gpu-checks.sh" <<'CHECKS'
#!/usr/bin/env bash
# run-gpu-checks.sh: runs the CUDA tests (gtest names containing "Cuda") of
# every bundled test binary, then the same tests under compute-sanitizer
# (memcheck, racecheck) when it is installed, then the GPU benchmarks. Writes
# one file per step into a results folder and packs it as one archive,
# $OUT/gpu-results.tgz (or ./gpu-results.tgz); exits non-zero if any step failed.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-$PWD}
out=$(mktemp -d)/gpu-results
mkdir -p "$out"
status=0
pack() { tar czf "$dest/gpu-results.tgz" -C "$(dirname "$out")" gpu-results; }
trap pack EXIT
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
for t in "$here"/bin/*test*; do
  name=$(basename "$t")
  "$here/run.sh" "$name" --gtest_list_tests --gtest_filter='*Cuda*' 2>/dev/null | grep -q '^  ' || continue
  "$here/run.sh" "$name" --gtest_filter='*Cuda*' --gtest_output="json:$out/$name.json" \
    > "$out/$name.txt" 2>&1 || { status=1; echo "FAILED $name"; }
  tail -n 3 "$out/$name.txt"
  [[ -n "$sanitizer" ]] || continue
  for tool in memcheck racecheck; do
    "$here/run.sh" "$sanitizer" --tool "$tool" --error-exitcode 1 "$here/bin/$name" \
      --gtest_filter='*Cuda*' > "$out/$name.$tool.txt" 2>&1 || { status=1; echo "FAILED $tool $name"; }
    echo "== $tool $name: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$name.$tool.txt" | tail -n 1)"
  done
done
[[ -n "$sanitizer" ]] || echo "compute-sanitizer not found: sanitizer runs skipped" | tee "$out/sanitizer.txt"
bench() {  # bench FILE COMMAND...
  local file=$1; shift
  [[ -x "$here/bin/$1" ]] || return 0
  "$here/run.sh" "$@" > "$out/$file" 2>&1 || { status=1; echo "FAILED $*"; }
  echo "== $*"; cat "$out/$file"
}
bench bench-codec.jsonl shardps bench-codec --json
bench bench-local-cpu.jsonl shardps bench-local --kind cpu --json
bench bench-local-cuda.jsonl shardps bench-local --kind cuda --json
# The push path (merge + encode + copy to host) against no codec and a pinned
# device-to-host copy, measured in the same run (bars: encode_vs_raw >= 8,
# host_copy_vs_pinned >= 0.8 for D = 4 at 16 and 64 MiB).
bench bench-local-cuda-2bit.jsonl shardps bench-local --kind cuda --codec 2bit --devices 1,4 --json
bench bench-local-cuda-onebit.jsonl shardps bench-local --kind cuda --codec onebit --devices 4 --json
# PyTorch on the GPU through shardps_push_pull_cuda (needs python3 with CUDA torch): the
# training test (2 workers on one GPU, sync, against the one-process reference), then the
# Fashion-MNIST example when $SHARDPS_FASHION_MNIST names the dataset's directory.
pyenv=(env SHARDPS_BINARY="$here/bin/shardps" SHARDPS_LIBRARY="$here/lib/libshardps.so")
if [[ -d "$here/python" ]] && python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  (cd "$here/python/tests" && "$here/run.sh" "${pyenv[@]}" python3 -m unittest -v \
     test_torch_sync.TorchSyncTest.test_cuda_parameters_train_through_device_pointers) \
    > "$out/python-torch-cuda.txt" 2>&1 || { status=1; echo "FAILED python torch cuda test"; }
  tail -n 3 "$out/python-torch-cuda.txt"
  if [[ -d "${SHARDPS_FASHION_MNIST:-}" ]]; then
    for device in cuda cpu; do
      "$here/run.sh" "${pyenv[@]}" PYTHONPATH="$here/python" shardps launch --servers 2 --workers 2 \
        --set consistency=sync -- python3 "$here/python/examples/train_fashion_mnist.py" --epochs 1 --json \
        --device "$device" --data-dir "$SHARDPS_FASHION_MNIST" > "$out/fashion-mnist-$device.txt" 2>&1 ||
        { status=1; echo "FAILED fashion-mnist $device"; }
      grep '^{' "$out/fashion-mnist-$device.txt" || true
    done
  fi
else
  echo "python3 with CUDA torch not found: PyTorch GPU check skipped" | tee "$out/python-torch-cuda.txt"
fi
exit $status
CHECKS
chmod +x "$bundle/run.sh" "$bundle/run-gpu-checks.sh"

echo "bundle $bundle: $(size_mib) MiB, $(ls "$bundle/bin" | wc -l) binaries, $(ls "$bundle/lib" | wc -l) libraries"
if [[ $(size_mib) -gt $limit_mib ]]; then
  echo "warning: bundle exceeds $limit_mib MiB; largest files:" >&2
  du -a "$bundle" | sort -rn | sed -n '2,8p' >&2
  exit 1
fi
