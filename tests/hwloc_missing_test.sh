#!/bin/bash
# hwloc is loaded when --numa_binding first needs it (agent/src/hwloc_lazy.hpp). With the library
# unreadable (a private mount namespace hides it under /dev/null), --numa_binding fails with what
# to install (exit 1), and a launch that binds nothing runs as before: nothing loads it at start.
# Usage: hwloc_missing_test.sh DDPRUN
set -u
ddprun=$1
source "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] || skip "this needs root (unshare -m, mount --bind)"
"$ddprun" --version | grep -q 'hwloc on' || skip "this ddprun was built without hwloc"
lib=$(ldconfig -p | awk '/libhwloc\.so\.[0-9]+ / {print $NF; exit}')  # the versioned name ddprun loads
[ -n "$lib" ] || skip "no libhwloc in the loader's cache (scripts/setup.sh installs libhwloc-dev)"
real=$(readlink -f "$lib")
unshare -m --propagation private true 2>/dev/null || skip "unshare -m is not allowed here"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
unshare -m --propagation private bash -c "
  mount --bind /dev/null '$real' || exit 90
  '$ddprun' --standalone --nproc_per_node=1 --numa_binding=node --no_python /bin/true > '$out/bind.out' 2> '$out/bind.err'
  echo \$? > '$out/bind.rc'
  '$ddprun' --standalone --nproc_per_node=1 --no_python /bin/true > '$out/plain.out' 2> '$out/plain.err'
  echo \$? > '$out/plain.rc'"
[ $? -ne 90 ] || skip "cannot bind-mount over $real"
rc=$(cat "$out/bind.rc")
if [ "$rc" = 1 ] && grep -q "cannot load libhwloc" "$out/bind.err" && grep -q "apt-get install libhwloc" "$out/bind.err"; then
  ok "--numa_binding without $real: exit 1, says what to install"
else
  bad "--numa_binding without hwloc's library: exit $rc"; cat "$out/bind.err"
fi
rc=$(cat "$out/plain.rc")
if [ "$rc" = 0 ]; then
  ok "a launch without --numa_binding runs without hwloc's library (exit 0)"
else
  bad "a launch without --numa_binding, hwloc's library hidden: exit $rc"; cat "$out/plain.err"
fi
finish
