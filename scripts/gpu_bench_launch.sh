#!/usr/bin/env bash
# Start-up at the floor on a machine of many cores (issue 22): bench/launcher_bench.py there, with
# that machine's own torchrun (PyTorch 2.x) and the posix_spawn floor side by side in one run.
# The machine builds nothing (../shared/docs/gpu-machine.md), so the programs travel from here.
#
# Here, where ddprun builds:   scripts/gpu_bench_launch.sh package [BUILD_DIR [PACK_DIR]]
# On the other machine:        scripts/gpu_bench_launch.sh [PACK_DIR] [launcher_bench.py options]
# PACK_DIR (default build-bench-pack in the checkout, which git ignores) holds bin/ddprun
# (stripped, with share/ddprun/python beside it, as installed) and bin/spawn_floor. ddprun needs
# only the C library: no other library is copied.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

package() {
  local build out
  build=$(cd "${1:-$root/build}" && pwd) || exit 2
  out=${2:-$root/build-bench-pack}
  cmake --build "$build" -j2 --target ddprun spawn_floor || exit 1
  rm -rf "$out" && mkdir -p "$out/bin" "$out/share/ddprun"
  strip -o "$out/bin/ddprun" "$build/launcher/ddprun"
  cp "$build/bench/spawn_floor" "$out/bin/"
  cp -r "$build/share/ddprun/python" "$out/share/ddprun/"
  echo "commit $(git -C "$root" rev-parse HEAD)" > "$out/MANIFEST"
  du -sh "$out"
}
if [[ ${1:-} == package ]]; then
  shift
  package "$@"
  exit
fi

pack=$(cd "${1:-$root/build-bench-pack}" && pwd) || exit 2
shift $(($# > 0 ? 1 : 0))
for p in ddprun spawn_floor; do
  [[ -x $pack/bin/$p ]] || { echo "gpu_bench_launch: $pack/bin/$p is missing: run '$0 package' where ddprun builds" >&2; exit 2; }
done
echo "gpu_bench_launch: $(cat "$pack/MANIFEST"); $(nproc) cores; $(uname -r)"
torch=()
if command -v torchrun > /dev/null && python3 -c 'import torch; print("torchrun of PyTorch", torch.__version__)'; then
  torch=(--torchrun "$(command -v torchrun)" --python "$(command -v python3)")
else
  torch=(--no-torchrun)
  echo "no torchrun on PATH: ddprun and the floor only"
fi
exec python3 "$root/bench/launcher_bench.py" --ddprun "$pack/bin/ddprun" --floor "$pack/bin/spawn_floor" \
  "${torch[@]}" "$@"
