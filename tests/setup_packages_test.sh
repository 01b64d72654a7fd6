#!/usr/bin/env bash
# scripts/setup.sh installs what the tests and the wheel use, on a minimal Debian 12 too
# (debootstrap --variant=minbase: the packages of priority required, and apt): on a machine that
# has more installed, a test must not pass only because something else brought its tool. With
# dpkg's and apt's view of this machine, every one of these comes from a package that setup.sh
# lists, one they depend on (Depends, Pre-Depends), a required package or apt:
#  - each command a shell test asks for with `need` (tests/ and its folders);
#  - each static archive of libdw's static link (pkg-config --static libdw: libdw.a, libelf.a,
#    libz.a, liblzma.a, libbz2.a), without which ddprun-stack loads libdw and the C++ runtime
#    and the wheel's tag falls to linux_x86_64 (cmake/static_pkg.cmake, scripts/build_wheel.sh).
# Usage: tests/setup_packages_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/lib.sh"
src=$1
need dpkg-query apt-cache pkg-config
mapfile -t listed < <("$src/scripts/setup.sh" --packages)
[ ${#listed[@]} -gt 0 ] || { bad "scripts/setup.sh --packages lists nothing"; finish; }
# What setup.sh brings: its packages and, recursively, what they depend on (installed: this
# runs after setup.sh), then what a minimal Debian 12 has.
declare -A have
while read -r p; do have[$p]=1; done < <(apt-cache depends --installed --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances "${listed[@]}" 2>/dev/null | grep -v '^ ' | sed 's/:.*//')
while read -r p prio; do [ "$prio" = required ] && have[$p]=1; done < <(dpkg-query -W -f='${Package} ${Priority}\n')
have[apt]=1
for p in "${listed[@]}"; do have[$p]=1; done

# What to look up: (what, path) pairs, then one dpkg-query for every path (each call reads
# dpkg's whole file list: one per path was most of this test's time).
whats=() paths=()
want() { whats+=("$1"); paths+=("$2"); }

# `need` lines in the shell tests: their words, less variables.
commands=$(grep -rhE '^\s*need\s' "$src/tests" --include=*.sh | sed -E 's/^\s*need\s+//; s/[;#|&].*//' |
  tr ' ' '\n' | grep -vE '^\s*$|\$' | sort -u)
[ -n "$commands" ] || bad "no \`need\` line found under $src/tests"
# Looked up where Debian's packages put programs, not on this PATH (a pyenv's python3 first).
for c in $commands; do
  path=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v "$c") || { bad "a test needs $c, which no Debian package put here"; continue; }
  want "command $c" "$path"
done

for l in $(pkg-config --static --libs-only-l libdw | tr ' ' '\n' | sort -u); do
  name=${l#-l}
  case $name in pthread | dl | rt | m | c) continue ;; esac  # glibc's own, always loaded shared
  archive=$(gcc -print-file-name="lib$name.a")
  [ -f "$archive" ] || { bad "lib$name.a (libdw's static link) is not installed"; continue; }
  want "lib$name.a" "$(readlink -f "$archive")"
done

# The package that installed each path (merged /usr: dpkg may know it as /bin/X or /usr/bin/X; an
# alternative or other link: its target), the first of those forms dpkg knows.
candidates() { echo "$1" "${1#/usr}" "/usr$1" "$(readlink -f "$1")"; }
declare -A pkg_of
all=()
for p in "${paths[@]}"; do all+=($(candidates "$p")); done
while IFS= read -r line; do
  case $line in diversion*) continue ;; esac
  path=${line#*: }
  [ -z "${pkg_of[$path]:-}" ] && pkg_of[$path]=${line%%[:,]*}
done < <([ ${#all[@]} -gt 0 ] && dpkg-query -S "${all[@]}" 2>/dev/null)
for i in "${!paths[@]}"; do
  what=${whats[$i]} path=${paths[$i]} pkg=
  for c in $(candidates "$path"); do
    pkg=${pkg_of[$c]:-}
    [ -n "$pkg" ] && break
  done
  if [ -z "$pkg" ]; then
    bad "$what: $path belongs to no Debian package (installed by hand?)"
  elif [ -n "${have[$pkg]:-}" ]; then
    ok "$what: $path comes from $pkg"
  else
    bad "$what: $path comes from $pkg, which scripts/setup.sh does not install (add it to its lists)"
  fi
done
finish
