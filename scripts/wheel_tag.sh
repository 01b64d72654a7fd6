#!/usr/bin/env bash
# Prints the platform tag that the programs given earn for a wheel, read from the binaries
# themselves (readelf), and on stderr why:
#   manylinux_2_X_ARCH  when every library a program loads at start-up (NEEDED) is glibc's or its
#                       loader, all on manylinux's allowed list, and X is the newest glibc any of
#                       them needs: the highest GLIBC_2.X symbol version, or 36 where the programs'
#                       relocations are packed (GLIBC_ABI_DT_RELR: glibc 2.36 brought DT_RELR);
#   linux_ARCH          otherwise (another library, a GLIBC_PRIVATE symbol), which pip installs
#                       only where it was built: the reason is printed.
# libstdc++ and libgcc_s are on manylinux's list too, but with limits on their own symbol
# versions that this does not check: ddprun links them statically, and a program that loads them
# gets linux_ARCH.
# Usage: scripts/wheel_tag.sh PROGRAM...
set -euo pipefail
(($#)) || { echo "usage: wheel_tag.sh PROGRAM..." >&2; exit 2; }
allowed=' libc.so.6 libm.so.6 libdl.so.2 librt.so.1 libpthread.so.0 libresolv.so.2 libutil.so.1 libnsl.so.1 ld-linux-x86-64.so.2 ld-linux-aarch64.so.1 '

arch=
minor=0
why=
for f in "$@"; do
  machine=$(readelf -h "$f" | sed -n 's/^ *Machine: *//p')
  case $machine in
    *X86-64*) a=x86_64 ;;
    AArch64) a=aarch64 ;;
    *) echo "wheel_tag: $f: not an x86-64 or AArch64 ELF program (Machine: ${machine:-none})" >&2; exit 1 ;;
  esac
  [ -z "$arch" ] || [ "$arch" = "$a" ] || { echo "wheel_tag: $f is $a, the others $arch" >&2; exit 1; }
  arch=$a
  for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    [[ $allowed == *" $lib "* ]] || why+="$(basename "$f") loads $lib, not on manylinux's list; "
  done
  for v in $(readelf -V --wide "$f" | grep -o 'Name: GLIBC_[A-Z0-9_.]*' | sed 's/Name: //' | sort -u); do
    case $v in
      GLIBC_ABI_DT_RELR) m=36 ;;
      GLIBC_2.*) m=${v#GLIBC_2.}; m=${m%%.*} ;;
      *) why+="$(basename "$f") needs $v; "; continue ;;
    esac
    ((m > minor)) && minor=$m
  done
done
if [ -n "$why" ]; then
  echo "wheel_tag: linux_$arch: ${why%; }" >&2
  echo "linux_$arch"
else
  echo "wheel_tag: manylinux_2_${minor}_$arch: the programs load glibc alone and need glibc 2.$minor" >&2
  echo "manylinux_2_${minor}_$arch"
fi
