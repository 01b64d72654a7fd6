#!/usr/bin/env bash
# Installs what ddprun needs (Debian packages; skips those already installed), then configures
# and builds it in ./build. Safe to run again: it only does what is missing.
# Usage: scripts/setup.sh              every package and every target (scripts/test.sh)
#        scripts/setup.sh TARGET...    only the packages a build needs, and only these targets
#                                      and what they depend on (scripts/run_main_job.sh)
#        scripts/setup.sh --packages   prints every package it installs, one a line, and does
#                                      nothing else (tests/setup_packages_test.sh)
# As root, or with sudo available.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
targets=("$@")

# What configuring and building any target needs (the build's features included: hwloc for
# --numa_binding, libdw for ddprun-stack), so that a build of a few targets is the same build
# that the test command later completes.
build_packages=(
  build-essential cmake pkg-config
  libboost1.81-dev libboost-program-options1.81-dev
  libboost-context1.81-dev     # the round simulator's fibers (tests/rounds/sim_fiber.hpp)
  libspdlog-dev libfmt-dev catch2 libgloo-dev nlohmann-json3-dev
  libssl-dev                   # OpenSSL: HMAC-SHA256 for the store handshake, TLS to etcd
  zlib1g-dev                   # zlib's CRC-32: the in-memory state's checks (ddprun::runtime::MemoryState)
  libdw-dev                    # ddprun-stack: native stacks of hung workers without eu-stack or gdb
  libbz2-dev                   # libbz2.a: libdw's static link (libdw-dev brings libelf's, zlib's and
                               # liblzma's archives, not this one); without it ddprun-stack loads libdw
                               # and the C++ runtime, and the wheel's tag falls to linux_x86_64
  libhwloc-dev                 # --numa_binding: the machine's topology
)
# What the tests, the benchmarks and the packages (man pages, .deb, wheel) need besides.
test_packages=(
  openssl                      # the command line: certificates for the etcd TLS tests
  util-linux                   # setpriv (another user), unshare (a host name per test host)
  help2man man-db dpkg-dev     # man pages from --help, man -w, dpkg-shlibdeps for the .deb
  file                         # cpack's Debian generator reads binaries with it
  python3-torch                # PyTorch 1.13: compatibility tests, benchmarks, example jobs
  python3-venv python3-setuptools python3-wheel python3-build  # the wheel (scripts/build_wheel.sh) and its test
  clang libclang-rt-14-dev     # libFuzzer for the protocol fuzzer
  iproute2 procps
  curl                         # HTTP requests to the metrics endpoint (metrics_dual_stack_test.sh)
  elfutils gdb                 # eu-stack (else gdb): stacks of hung native workers when ddprun-stack is missing
  etcd-server                  # tests of the etcd client and backend (3-member clusters)
  etcd-client                  # etcdctl: turns authentication on in the auth tests
  universal-ctags git          # scripts/size_report.py (the functions over ~60 lines), the price patch's check
)
if [ "${targets[0]:-}" = --packages ]; then
  printf '%s\n' "${build_packages[@]}" "${test_packages[@]}"
  exit 0
fi
packages=("${build_packages[@]}")
((${#targets[@]})) || packages+=("${test_packages[@]}")
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Runs a command as root: directly, or through sudo.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo "$@"
  else
    echo "setup: run as root, or with sudo, for: $*" >&2
    exit 1
  fi
}
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all Debian packages present"
fi
# The tests reach etcd and the store by the name localhost too (etcd over TLS checks that name
# in its certificate). A minimal Debian 12 (debootstrap) has no /etc/hosts, and its resolver then
# asks DNS, which need not know the name: setup writes the first line Debian's installer writes.
if ! ((${#targets[@]})) && ! getent hosts localhost >/dev/null; then
  echo "setup: localhost does not resolve: adding '127.0.0.1 localhost' to /etc/hosts"
  printf '127.0.0.1\tlocalhost\n' | as_root tee -a /etc/hosts >/dev/null
fi

build=${DDPRUN_BUILD_DIR:-$root/build}
# Unity batches: the libraries, programs and test drivers compile in about half the CPU time.
# -g1: functions and line tables (backtraces, ddprun-stack's file:line), no variables' types and
# locations: a third less compile time than -g (etcd_transport.cpp: 44 s of CPU with -g, 29 s with -g1).
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DCMAKE_UNITY_BUILD=ON >/dev/null
if ((${#targets[@]})); then
  cmake --build "$build" -j"${DDPRUN_JOBS:-2}" --target "${targets[@]}"
  echo "setup: built ${targets[*]} in $build"
else
  cmake --build "$build" -j"${DDPRUN_JOBS:-2}"
  echo "setup: built in $build"
fi
