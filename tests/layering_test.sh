#!/usr/bin/env bash
# The agent's rooms (agent/src/README.md) include only rooms above them: host, containment,
# observe, workers, control, metrics, in that order. Every file of agent/src must be in a room
# (agent.cpp excepted), and every quoted include of a room's file is checked:
#   "room/file.hpp"         the room's rank, as listed
#   "ddprun/agent/X.hpp"    a public header of the agent, ranked as the room that implements it:
#                           the room of each .cpp whose first include it is, or which is named
#                           X.cpp (agent.cpp: above every room, so no room may include it), and
#                           at least as high as every ddprun/agent header it includes itself; a
#                           header no room implements (declarations only) is below every room
#   "ddprun/other/..."      another library's public header: below every room
# Usage: tests/layering_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/lib.sh"
src=$1/agent/src
pub=$1/agent/include
rooms=(host containment observe workers control metrics)
top=${#rooms[@]}  # agent.cpp's rank
# Pure bash (no subshell per include: on a slow machine the forks were most of the time).
declare -A room_rank
for i in "${!rooms[@]}"; do room_rank[${rooms[$i]}]=$i; done
rank() { r=${room_rank[$1]:--1}; }  # sets r
name() { [ "$1" -eq "$top" ] && echo agent.cpp || echo "${rooms[$1]}"; }
# Sets incs to the quoted includes of a file, in order.
includes() {
  local line re='^#include "([^"]*)"'
  incs=()
  while IFS= read -r line || [ -n "$line" ]; do
    [[ $line =~ $re ]] && incs+=("${BASH_REMATCH[1]}")
  done <"$1"
}
[ -d "$src" ] || skip "no agent/src under $1"
[ -d "$pub/ddprun/agent" ] || skip "no agent/include/ddprun/agent under $1"

# The public headers' ranks: first where they are implemented, then raised to the ranks of the
# public headers they include, until nothing changes.
declare -A hrank hvia
for h in "$pub"/ddprun/agent/*.hpp; do
  [ -e "$h" ] && hrank[ddprun/agent/$(basename "$h")]=-1
done
for f in "$src"/*/*.cpp "$src"/agent.cpp; do
  [ -e "$f" ] || continue
  if [ "$f" = "$src/agent.cpp" ]; then r=$top; else d=${f%/*}; rank "${d##*/}"; fi
  [ "$r" -ge 0 ] || continue
  includes "$f"
  b=${f##*/}
  for h in "${incs[0]:-}" "ddprun/agent/${b%.cpp}.hpp"; do
    [ -n "$h" ] && [ -n "${hrank[$h]+x}" ] && [ "$r" -gt "${hrank[$h]}" ] && hrank[$h]=$r
  done
done
declare -A hincs
for h in "${!hrank[@]}"; do includes "$pub/$h"; hincs[$h]="${incs[*]}"; done
changed=1
while [ "$changed" -eq 1 ]; do
  changed=0
  for h in "${!hrank[@]}"; do
    for inc in ${hincs[$h]}; do
      [ -n "${hrank[$inc]+x}" ] || continue
      if [ "${hrank[$inc]}" -gt "${hrank[$h]}" ]; then
        hrank[$h]=${hrank[$inc]}
        hvia[$h]=" (through $inc)"
        changed=1
      fi
    done
  done
done

upward=0 public=0 files=0
for room in "${rooms[@]}"; do
  [ -d "$src/$room" ] || { bad "room $room is missing"; continue; }
  mine=${room_rank[$room]}
  for f in "$src/$room"/*.cpp "$src/$room"/*.hpp; do
    [ -e "$f" ] || continue
    files=$((files + 1))
    includes "$f"
    for inc in "${incs[@]}"; do
      case $inc in
        ddprun/agent/*)
          [ -n "${hrank[$inc]+x}" ] || continue  # (not a header of agent/include: the compiler says so)
          public=$((public + 1))
          r=${hrank[$inc]} why="implemented in $(name "${hrank[$inc]}")${hvia[$inc]:-}" ;;
        ddprun/*) continue ;;  # another library's public header
        */*)
          rank "${inc%%/*}"; why="${inc%%/*} is a room"
          [ "$r" -ge 0 ] || continue ;;
        *) continue ;;
      esac
      if [ "$r" -gt "$mine" ]; then
        bad "$room/${f##*/} includes $inc: $why, below $room"
        upward=$((upward + 1))
      fi
    done
  done
done
loose=$(find "$src" -maxdepth 1 \( -name '*.cpp' -o -name '*.hpp' \) ! -name agent.cpp)
[ -z "$loose" ] && ok "every file of agent/src is in a room" || bad "files outside the rooms: $loose"
[ "$upward" -eq 0 ] && ok "no upward include among $files files in ${#rooms[@]} rooms ($public includes of public agent headers among them)"
finish
