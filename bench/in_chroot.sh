#!/usr/bin/env bash
# Runs CMD inside a chroot (as root), to bench or test ddprun against another distribution's
# PyTorch: ../shared/tools/torch2-chroot.sh makes a Debian trixie one with python3-torch 2.6.
# ddprun's programs load only libc, so the build runs there as it is. The chroot sees /proc, /sys,
# /dev and /dev/shm, this host's /etc/hosts, and each DIR given with --bind at the same path (the source tree, the build
# directory). The mounts live in a private mount namespace of their own: they vanish when CMD
# exits, however it exits.
# Usage: bench/in_chroot.sh ROOT [--bind DIR]... -- CMD [ARG]...
# Example: bench/in_chroot.sh /var/tmp/trixie --bind "$PWD" --bind "$PWD/build" -- \
#            /usr/bin/python3 "$PWD/bench/recovery_bench.py" --torchrun torch.distributed.run
set -euo pipefail
if [ "${1:-}" != --in-namespace ]; then
  [ "$(id -u)" = 0 ] || { echo "in_chroot.sh: run it as root (it mounts and chroots)" >&2; exit 2; }
  exec unshare -m --propagation private "$0" --in-namespace "$@"
fi
shift
root=$(realpath "${1:?usage: in_chroot.sh ROOT [--bind DIR]... -- CMD [ARG]...}")
shift
[ -x "$root/usr/bin/python3" ] || { echo "in_chroot.sh: $root holds no /usr/bin/python3; make it with torch2-chroot.sh" >&2; exit 2; }
binds=()
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
  [ "$1" = --bind ] || { echo "in_chroot.sh: unknown option $1" >&2; exit 2; }
  binds+=("$(realpath "$2")")
  shift 2
done
shift
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount --bind /etc/hosts "$root/etc/hosts"  # this host's own name resolves as outside (torchrun's store needs it)
for d in "${binds[@]}"; do
  mkdir -p "$root$d"
  mount --bind "$d" "$root$d"
done
exec chroot "$root" "$@"
