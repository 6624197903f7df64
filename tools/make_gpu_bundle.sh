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
# `strip --strip-debug`; every shared library they load except glibc's own
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

declare -A libs=()
for f in "$bundle"/bin/*; do
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
exit $status
CHECKS
chmod +x "$bundle/run.sh" "$bundle/run-gpu-checks.sh"

echo "bundle $bundle: $(size_mib) MiB, $(ls "$bundle/bin" | wc -l) binaries, $(ls "$bundle/lib" | wc -l) libraries"
if [[ $(size_mib) -gt $limit_mib ]]; then
  echo "warning: bundle exceeds $limit_mib MiB; largest files:" >&2
  du -a "$bundle" | sort -rn | sed -n '2,8p' >&2
  exit 1
fi
