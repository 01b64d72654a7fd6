# Sourced by the tests that could kill or delete (README: Tests): runs the calling script again
# inside private mount and pid namespaces (unshare -m -p -f --mount-proc) with its own tmpfs on
# /tmp and on /dev/shm (where ddprun's temporary directories go: what one leaves is seen), and
# puts a copy of the ddprun under test in /tmp/bin (the tmpfs hides the original's directory
# when it lives below /tmp). Skips visibly (exit 77) where that cannot be done, and
# fails instead under CI=true.
# Usage: source private_ns.sh DDPRUN "$0" "$@"
# (skip: tests/lib.sh, sourced first)
if [ "${DDPRUN_IN_PRIVATE_NS:-}" != 1 ]; then
  [ "$(id -u)" -eq 0 ] || skip "this needs root (unshare -m -p, setpriv)"
  unshare -m -p -f --mount-proc true 2>/dev/null || skip "unshare -m -p -f --mount-proc is not allowed here"
  script=$2
  shift 2
  exec env DDPRUN_IN_PRIVATE_NS=1 unshare -m -p -f --mount-proc --propagation private bash "$script" "$@"
fi
exec 9<"$1"
mount -t tmpfs -o size=512m,mode=1777 tmpfs /tmp || skip "cannot mount a tmpfs on /tmp"
mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm || skip "cannot mount a tmpfs on /dev/shm"
mkdir -p /tmp/bin && cp "/proc/$$/fd/9" /tmp/bin/ddprun && chmod 755 /tmp/bin/ddprun
exec 9<&-
