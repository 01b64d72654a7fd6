#!/usr/bin/env bash
# Packages a build made here for a GPU machine that can build nothing (../shared/docs/gpu-machine.md):
# the programs scripts/gpu_check.sh runs, stripped, and the shared libraries they need except the
# C/C++ runtime, the CUDA driver and NCCL (the GPU machine's own libnccl is used), into a folder
# of the checkout that git ignores (build-*), so that it travels with the checkout.
#
# Usage: scripts/gpu_package.sh [BUILD_DIR [OUT_DIR]]
#   BUILD_DIR  a build with the NCCL backend and CUDA kernels (default: build)
#   OUT_DIR    default: build-gpu-pack (in the checkout)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=${2:-$root/build-gpu-pack}

programs=(launcher/ddprun tests/gpu_tests examples/train_linear_cuda bench/runtime_bench)
cmake --build "$build" -j2 --target ddprun gpu_tests train_linear_cuda runtime_bench
for p in "${programs[@]}"; do
  if [[ ! -x $build/$p ]]; then
    echo "gpu_package: $build/$p is missing: configure with the NCCL backend and nvcc found" >&2
    exit 1
  fi
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for p in "${programs[@]}"; do
  strip -o "$out/bin/$(basename "$p")" "$build/$p"
done

# The nccl backend's plugin (the one part of ddprun that links CUDA and NCCL), loaded at run time
# through DDPRUN_NCCL_BACKEND (gpu_check.sh sets it).
plugin=$(ls "$build"/runtime/libddprun_runtime_nccl-*.so | head -n 1)
cp "$plugin" "$out/lib/"

# The libraries ldd resolves, less what every Linux has and what the GPU machine brings.
skip='^(linux-vdso|ld-linux|libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libcuda|libnvidia|libnccl)\.'
for p in "${programs[@]/#/$build/}" "$plugin"; do
  ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ $name =~ $skip ]]; then continue; fi
  cp -L "$path" "$out/lib/$name"
done

{
  echo "commit $(git -C "$root" rev-parse HEAD)"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m) from $build"
  echo "programs: ${programs[*]}"
  echo "libraries: $(find "$out/lib" -type f -printf '%f ')"
} > "$out/MANIFEST"
du -sh "$out"
echo "gpu_package: $out ready; on the GPU machine: scripts/gpu_check.sh $(basename "$out")"
