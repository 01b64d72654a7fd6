#!/usr/bin/env bash
# Installs ddprun into a temporary prefix and uses it as a user would: builds examples/ as a
# separate CMake project with find_package(ddprun) and runs it under the installed ddprun on 2
# workers; checks pkg-config, --version, the bash completion and the man pages; then builds the
# Debian packages with CPack, installs them into a scratch root with dpkg, runs the installed
# ddprun --version and man -w there, and asks apt whether their Depends resolve on this machine.
# Usage: tests/install_test.sh BUILD_DIR SOURCE_DIR
set -u
source "$(dirname "$0")/lib.sh"
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
check() { local what=$1; shift; if "$@" >"$work/last.log" 2>&1; then ok "$what"; else bad "$what"; tail -30 "$work/last.log"; fi; }

prefix=$work/prefix
check "cmake --install into a temporary prefix" cmake --install "$build" --prefix "$prefix"
check "the installed ddprun and ddprun-store run" sh -c "'$prefix/bin/ddprun' --version && '$prefix/bin/ddprun-store' --version"
check "ddprun --version names the version and the build's features" \
  sh -c "'$prefix/bin/ddprun' --version | grep -Eq '^ddprun [0-9]+\.[0-9]+\.[0-9]+' && '$prefix/bin/ddprun' --version | grep -Eq 'built with: nccl (on|off), etcd (on|off), hwloc (on|off)'"

check "the installed ddprun gives workers its progress hook (PREFIX/share/ddprun/python first on PYTHONPATH)" sh -c "
  '$prefix/bin/ddprun' --standalone --log_level warn --no_python /bin/sh -c 'echo \$PYTHONPATH' > '$work/pp.txt' &&
  grep -qx '.default0.:$prefix/share/ddprun/python' '$work/pp.txt' && test -f '$prefix/share/ddprun/python/sitecustomize.py'"
# (read once the child is sleep: a stack read while it is still the shell, mid-exec, has no frames)
check "ddprun-stack is installed beside ddprun and reads a process's stack" sh -c "
  sleep 30 & pid=\$!; for i in \$(seq 1000); do [ \"\$(cat /proc/\$pid/comm)\" = sleep ] && break; done
  '$prefix/bin/ddprun-stack' \$pid > '$work/stack.txt'; rc=\$?; kill \$pid; cat '$work/stack.txt'
  [ \$rc -eq 0 ] && grep -q '^#0 ' '$work/stack.txt'"

# An empty RUNPATH entry is the current directory to the loader: a library planted where ddprun
# is started from would be loaded. Neither the build tree's programs nor the installed ones have one.
check "no program searches the current directory for libraries (no empty RUNPATH entry)" sh -c "
  for f in '$build/launcher/ddprun' '$build/rendezvous/ddprun-store' '$prefix/bin/ddprun' '$prefix/bin/ddprun-store'; do
    path=\$(readelf -d \"\$f\" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
    case \":\$path:\" in *::*) [ -n \"\$path\" ] && { echo \"\$f: RUNPATH '\$path'\"; exit 1; } ;; esac
  done; true"

# Start-up cost (README): the static build's ddprun loads libc and libm alone (hwloc when --numa_binding needs it),
# and where the toolchain packs relative relocations (DT_RELR) its 28,000 are packed.
relr=$(sed -n 's/^DDPRUN_LINKER_RELR:INTERNAL=//p' "$build/CMakeCache.txt")
grep -q '^BUILD_SHARED_LIBS:BOOL=ON' "$build/CMakeCache.txt" ||  # (a shared build loads its own libraries too)
check "ddprun starts loading only libc and libm$( [ "$relr" = 1 ] && echo ', its relocations packed (DT_RELR)')" sh -c "
  for f in '$build/launcher/ddprun' '$prefix/bin/ddprun' \$(ls '$prefix/bin/ddprun-full' 2>/dev/null); do
    needed=\$(readelf -d \"\$f\" | sed -n 's/.*NEEDED.*\\[\\(.*\\)\\]/\\1/p' | tr '\\n' ' ')
    case \"\$needed\" in 'libm.so.6 libc.so.6 ld-linux-x86-64.so.2 '|'libm.so.6 libc.so.6 ') ;; *) echo \"\$f loads: \$needed\"; exit 1 ;; esac
    if [ '$relr' = 1 ] && ! readelf -d \"\$f\" | grep -q '(RELR)'; then echo \"\$f: no DT_RELR\"; exit 1; fi
  done; true"

# ddprun holds no OpenSSL and hands the jobs that need it to ddprun-full, installed beside it
# (launcher/include/ddprun/launcher/full_program.hpp).
if [ -x "$build/launcher/ddprun-full" ]; then
  check "ddprun holds no OpenSSL, ddprun-full does (build tree and prefix)" sh -c "
    for d in '$build/launcher' '$prefix/bin'; do
      '$src/tests/no_openssl_test.sh' \"\$d/ddprun\" \"\$d/ddprun-full\" || exit 1
    done; true"
  # An https:// etcd endpoint without a CA is refused by ddprun-full's own checks (exit 2).
  check "the installed ddprun hands an etcd job to ddprun-full" sh -c "
    '$prefix/bin/ddprun' --nnodes=2 --rdzv_backend=etcd --rdzv_endpoint=https://127.0.0.1:1 --no_python /bin/true 2> '$work/full.txt'
    rc=\$?; cat '$work/full.txt'; [ \$rc -eq 2 ] && grep -q 'give --rdzv_conf cacert=PATH' '$work/full.txt'"
  check "ddprun copied without ddprun-full says what is missing for an etcd job (exit 1)" sh -c "
    mkdir -p '$work/alone' && cp '$prefix/bin/ddprun' '$work/alone/' &&
    '$work/alone/ddprun' --nnodes=2 --rdzv_backend=etcd --rdzv_endpoint=127.0.0.1:1 --no_python /bin/true 2> '$work/alone.txt'
    rc=\$?; cat '$work/alone.txt'; [ \$rc -eq 1 ] && grep -q 'needs ddprun-full' '$work/alone.txt'"
  check "a ddprun-full that is ddprun again is refused, not exec'd in a loop (exit 1)" sh -c "
    mkdir -p '$work/twice' && cp '$prefix/bin/ddprun' '$work/twice/ddprun' && cp '$prefix/bin/ddprun' '$work/twice/ddprun-full' &&
    timeout 10 '$work/twice/ddprun' --nnodes=2 --rdzv_backend=etcd --rdzv_endpoint=127.0.0.1:1 --no_python /bin/true 2> '$work/twice.txt'
    rc=\$?; cat '$work/twice.txt'; [ \$rc -eq 1 ] && grep -q 'is not ddprun built with OpenSSL' '$work/twice.txt'"
fi

# A separate project against the prefix: examples/ with find_package(ddprun).
check "examples/ configures and builds against the prefix with find_package(ddprun)" sh -c "
  cmake -S '$src/examples' -B '$work/consumer' -DCMAKE_PREFIX_PATH='$prefix' -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build '$work/consumer' -j2"
check "the consumer's train_mlp runs under the installed ddprun on 2 workers" sh -c "
  '$prefix/bin/ddprun' --standalone --nproc_per_node=2 --log_level warn '$work/consumer/train_mlp' --steps 30 > '$work/run.txt' &&
  grep -q 'RESULT' '$work/run.txt'"
check "public headers need none of Boost, spdlog, CUDA, NCCL" sh -c "
  ! grep -rEl '#include *<(boost|spdlog|fmt|cuda|nccl|openssl|gloo)' '$prefix/include/ddprun'"
check "pkg-config ddprun-runtime compiles and links a program" sh -c "
  printf '#include \"ddprun/runtime/process_group.hpp\"\nint main() { return ddprun::runtime::nccl_available() ? 0 : 0; }\n' > '$work/pc.cpp' &&
  PKG_CONFIG_PATH='$prefix/lib/pkgconfig' c++ '$work/pc.cpp' -o '$work/pc' \$(PKG_CONFIG_PATH='$prefix/lib/pkgconfig' pkg-config --cflags --libs --static ddprun-runtime) &&
  LD_LIBRARY_PATH='$prefix/lib' '$work/pc'"
check "bash completion offers --nproc_per_node for 'ddprun --npr<TAB>'" bash -c "
  source '$prefix/share/bash-completion/completions/ddprun'
  COMP_WORDS=(ddprun --npr); COMP_CWORD=1; _ddprun
  [ \"\${COMPREPLY[*]}\" = '--nproc_per_node' ]"
check "bash completion completes files after the training program" bash -c "
  source '$prefix/share/bash-completion/completions/ddprun'
  cd '$src'; COMP_WORDS=(ddprun --nproc_per_node 2 train.py READ); COMP_CWORD=4; _ddprun
  [ \"\${COMPREPLY[*]}\" = 'README.md' ]"
if command -v help2man >/dev/null; then
  check "man pages are installed (man -w ddprun, ddprun-store)" sh -c "
    MANPATH='$prefix/share/man' man -w ddprun | grep -q '$prefix' && MANPATH='$prefix/share/man' man -w ddprun-store | grep -q '$prefix'"
else
  bad "help2man is not installed (scripts/setup.sh installs it): no man pages"
fi

# Debian packages, installed into a scratch root (its own dpkg database).
need dpkg-shlibdeps cpack  # (the whole test skips without them: no part of it is skipped alone)
if true; then
  check "cpack -G DEB builds ddprun and libddprun-dev" sh -c "cd '$build' && cpack -G DEB -B '$work/pkg' >/dev/null && ls '$work/pkg'/ddprun_*.deb '$work/pkg'/libddprun-dev_*.deb"
  deb=$(ls "$work"/pkg/ddprun_*.deb 2>/dev/null | head -1)
  dev=$(ls "$work"/pkg/libddprun-dev_*.deb 2>/dev/null | head -1)
  if [ -n "$deb" ]; then
    # The static build links Boost, OpenSSL, spdlog, libdw and the C++ runtime into every program
    # (the wheel needs that too: scripts/build_wheel.sh): Depends is libc alone.
    linked_in='libspdlog'
    grep -q '^BUILD_SHARED_LIBS:BOOL=ON' "$build/CMakeCache.txt" || linked_in+='|libdw|libboost|libssl|libstdc|libgcc'
    # The NCCL backend's plugin (a shared library loaded on first use, beside the programs in this
    # package) links the C++ runtime: with it, libstdc++ is the plugin's need, not the programs'
    # (their NEEDED entries are checked above).
    if dpkg-deb -c "$deb" | grep 'libddprun_runtime_nccl' >/dev/null; then linked_in=${linked_in/|libstdc|libgcc/}; fi
    check "the package declares Depends computed from the binaries (libc; not what is linked in)" sh -c "
      d=\$(dpkg-deb -f '$deb' Depends); echo \"\$d\"; echo \"\$d\" | grep -q libc6 && ! echo \"\$d\" | grep -Eq '$linked_in'"
    # hwloc is loaded with dlopen, which dpkg-shlibdeps cannot see: the package names it itself.
    if grep -q '^HWLOC_FOUND:INTERNAL=1' "$build/CMakeCache.txt"; then
      check "the package recommends hwloc's library, which ddprun loads at --numa_binding" sh -c "
        dpkg-deb -f '$deb' Recommends | grep -Eq '(^|, )libhwloc[0-9]+'"
    fi
    root=$work/root
    mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers"
    : > "$root/var/lib/dpkg/status"
    check "dpkg installs both packages into a scratch root" sh -c "
      dpkg --root='$root' --force-depends --force-script-chrootless --log=/dev/null -i '$deb' '$dev' >/dev/null &&
      dpkg --root='$root' -s ddprun | grep -q 'Status: install ok installed'"
    check "the installed ddprun --version runs" "$root/usr/bin/ddprun" --version
    check "man -w ddprun finds the installed page" sh -c "MANPATH='$root/usr/share/man' man -w ddprun | grep -q '$root/usr/share/man/man1/ddprun.1'"
    check "the CMake package is in the scratch root" test -f "$root/usr/lib/cmake/ddprun/ddprunConfig.cmake"
    check "the package holds the progress hook, ddprun-stack and ddprun-full" \
      test -f "$root/usr/share/ddprun/python/sitecustomize.py" -a -x "$root/usr/bin/ddprun-stack" -a -x "$root/usr/bin/ddprun-full"
    # Stripped, as Debian ships programs; the debug information in ddprun-dbgsym, under the build id.
    check "the packaged ddprun is stripped; ddprun-dbgsym holds its debug information by build id" sh -c "
      ! readelf -S '$root/usr/bin/ddprun' | grep -q -e '[.]debug_info' -e '[.]symtab' &&
      id=\$(readelf -n '$root/usr/bin/ddprun' | sed -n 's/.*Build ID: *//p') && test -n \"\$id\" &&
      dbg=\$(ls '$work'/pkg/ddprun-dbgsym_*.ddeb) && dpkg-deb -c \"\$dbg\" |
        grep -q \"usr/lib/debug/.build-id/\$(echo \$id | cut -c1-2)/\$(echo \$id | cut -c3-).debug\""
    check "apt can resolve the packages' Depends on this machine (apt-get install --simulate)" \
      apt-get install --simulate -q "$deb" "$dev"
  fi
else
  bad "dpkg-shlibdeps (dpkg-dev) or cpack missing: no Debian packages"
fi
finish
