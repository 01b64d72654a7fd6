#!/usr/bin/env bash
# Makes DIST_DIR/ddprun-VERSION-py3-none-PLATFORM.whl from the CMake install tree, offline, with
# Debian's python3-build, python3-setuptools and python3-wheel (scripts/setup.sh installs them):
#   - every program the install puts in bin/ (cmake/packaging.cmake: DDPRUN_PROGRAMS), stripped,
#     as the environment's scripts: the binaries themselves, no Python wrapper;
#   - PREFIX/share/ddprun (the progress hook) and the man pages, under the environment's prefix,
#     where ddprun finds the hook (bin/../share/ddprun/python);
#   - the `ddprun` package (packaging/wheel): `python -m ddprun ARGS` runs the program.
# The platform tag is what the binaries earn (scripts/wheel_tag.sh reads them).
# Usage: scripts/build_wheel.sh [BUILD_DIR [DIST_DIR]]   (default: build, dist)
#        PYTHON=...  the interpreter with those modules (default: Debian's, /usr/bin/python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
dist=${2:-$root/dist}
[ -f "$build/CMakeCache.txt" ] || { echo "build_wheel: $build is not a CMake build folder: run scripts/setup.sh first" >&2; exit 1; }
if grep -q '^BUILD_SHARED_LIBS:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "build_wheel: $build is a shared-library build: the wheel needs the static one (-DBUILD_SHARED_LIBS=OFF)" >&2
  exit 1
fi
python=${PYTHON:-/usr/bin/python3}
"$python" -c 'import build, setuptools, wheel' 2>/dev/null ||
  { echo "build_wheel: $python lacks build, setuptools or wheel: apt-get install python3-build python3-setuptools python3-wheel (scripts/setup.sh does)" >&2; exit 1; }

# The install of the bin component below also puts in the NCCL backend's plugin where the build
# has one (cmake/packaging.cmake); the wheel leaves it out, but the install needs it built, as in
# a build of a few targets (scripts/setup.sh ddprun_programs).
targets=(ddprun_programs)
grep -q '^DDPRUN_WITH_NCCL:BOOL=ON' "$build/CMakeCache.txt" && targets+=(ddprun_runtime_nccl)
cmake --build "$build" -j"${DDPRUN_JOBS:-2}" --target "${targets[@]}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" --component bin >/dev/null

project=$work/project
cp -r "$root/packaging/wheel" "$project"
mkdir -p "$project/payload/bin" "$project/payload/share"
for f in "$work/prefix/bin/"*; do
  strip -o "$project/payload/bin/$(basename "$f")" "$f"  # debug information: 100 MB -> 4 MB for ddprun
done
cp -r "$work/prefix/share/ddprun" "$project/payload/share/"
[ -d "$work/prefix/share/man" ] && cp -r "$work/prefix/share/man" "$project/payload/share/"

plat=$("$root/scripts/wheel_tag.sh" "$project/payload/bin/"*)
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
mkdir -p "$dist"
DDPRUN_WHEEL_PLAT=$plat DDPRUN_WHEEL_VERSION=$version \
  "$python" -m build --wheel --no-isolation --outdir "$work/out" "$project" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; echo "build_wheel: python3 -m build failed" >&2; exit 1; }
wheel=$(ls "$work/out/"*.whl)
expected=ddprun-$version-py3-none-$plat.whl
[ "$(basename "$wheel")" = "$expected" ] ||
  { echo "build_wheel: made $(basename "$wheel"), expected $expected" >&2; exit 1; }
mv "$wheel" "$dist/"
echo "build_wheel: $dist/$expected ($(du -h "$dist/$expected" | cut -f1))"
