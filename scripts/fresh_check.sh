#!/usr/bin/env bash
# Runs the README's test command on a fresh Debian 12 machine: a minbase chroot made by
# debootstrap, with / a mount point and the host's /etc/hosts as a new machine has them, a clone
# of this checkout and ../shared beside it. Only git is installed by hand (to clone); everything
# else must come from scripts/setup.sh. Needs root and debootstrap; takes 20-40 minutes.
# Usage: scripts/fresh_check.sh [CHROOT_DIR]   (default /var/tmp/ddprun-fresh; reused if present)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/var/tmp/ddprun-fresh}
[ "$(id -u)" -eq 0 ] || { echo "fresh_check: run as root (debootstrap, chroot, mounts)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "fresh_check: apt-get install debootstrap" >&2; exit 1; }
if [ ! -x "$dir/bin/bash" ]; then
  debootstrap --variant=minbase bookworm "$dir" http://deb.debian.org/debian
fi
mounts=()
bind() { mount --bind "$1" "$2" && mounts=("$2" "${mounts[@]}"); }
cleanup() { for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
bind "$dir" "$dir"  # / is a mount point inside, as on a real machine
mount -t proc proc "$dir/proc" && mounts=("$dir/proc" "${mounts[@]}")
mount --rbind /sys "$dir/sys" && mounts=("$dir/sys" "${mounts[@]}")  # with /sys/fs/cgroup, as on a machine
bind /dev "$dir/dev"
mount -t devpts devpts "$dir/dev/pts" -o newinstance && mounts=("$dir/dev/pts" "${mounts[@]}")
mount -t tmpfs tmpfs "$dir/run" && mounts=("$dir/run" "${mounts[@]}")
mount -t tmpfs tmpfs "$dir/tmp" -o mode=1777,size=8g && mounts=("$dir/tmp" "${mounts[@]}")
cp /etc/hosts /etc/resolv.conf "$dir/etc/"
mkdir -p "$dir/src/checkout" "$dir/src/shared"
bind "$root" "$dir/src/checkout"
[ -d "$root/../shared" ] && bind "$root/../shared" "$dir/src/shared"
chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root CI=true LANG=C.UTF-8 /bin/bash -c '
  set -e
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends git ca-certificates >/dev/null
  rm -rf /work && mkdir -p /work && cp -a /src/shared /work/shared
  git clone -q /src/checkout /work/main
  cd /work/main && scripts/test.sh'
