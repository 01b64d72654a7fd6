#!/usr/bin/env bash
# Installs what ddprun needs (Debian packages; skips those already installed), then configures
# and builds it in ./build. Safe to run again: it only does what is missing.
# Usage: scripts/setup.sh            (as root, or with sudo available)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  build-essential cmake pkg-config
  libboost1.81-dev libboost-program-options1.81-dev
  libspdlog-dev libfmt-dev catch2 libgloo-dev nlohmann-json3-dev
  libssl-dev                   # OpenSSL: HMAC-SHA256 for the store handshake, TLS to etcd
  openssl                      # the command line: certificates for the etcd TLS tests
  util-linux                   # setpriv (another user), unshare (a host name per test host)
  help2man man-db dpkg-dev     # man pages from --help, man -w, dpkg-shlibdeps for the .deb
  file                         # cpack's Debian generator reads binaries with it
  python3-torch                # PyTorch 1.13: compatibility tests, benchmarks, example jobs
  clang libclang-rt-14-dev     # libFuzzer for the protocol fuzzer
  iproute2 procps
  elfutils gdb                 # eu-stack (else gdb): stacks of hung native workers when ddprun-stack is missing
  libdw-dev                    # ddprun-stack: native stacks of hung workers without eu-stack or gdb
  libhwloc-dev                 # --numa_binding: the machine's topology
  etcd-server                  # tests of the etcd client and backend (3-member clusters)
  etcd-client                  # etcdctl: turns authentication on in the auth tests
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: run as root (apt-get needs it) to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all Debian packages present"
fi

build=${DDPRUN_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"${DDPRUN_JOBS:-2}"
echo "setup: built in $build"
