#!/usr/bin/env bash
# The agent's rooms (agent/src/README.md) include only rooms above them: host, containment,
# observe, workers, control, metrics, in that order. Every include of "room/file.hpp" in a room's
# file is checked, and every file of agent/src must be in a room (agent.cpp excepted).
# Usage: tests/layering_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/lib.sh"
src=$1/agent/src
rooms=(host containment observe workers control metrics)
rank() { local i; for i in "${!rooms[@]}"; do [ "${rooms[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }
[ -d "$src" ] || skip "no agent/src under $1"
upward=0 files=0
for room in "${rooms[@]}"; do
  [ -d "$src/$room" ] || { bad "room $room is missing"; continue; }
  for f in "$src/$room"/*.cpp "$src/$room"/*.hpp; do
    [ -e "$f" ] || continue
    files=$((files + 1))
    while read -r inc; do
      other=${inc%%/*}
      r=$(rank "$other")
      [ "$r" -ge 0 ] || continue  # (ddprun/..., a public header)
      if [ "$r" -gt "$(rank "$room")" ]; then
        bad "$room/$(basename "$f") includes $inc: $other is below $room"
        upward=$((upward + 1))
      fi
    done < <(sed -n 's/^#include "\([a-z_]*\/[a-z_]*\.hpp\)".*/\1/p' "$f")
  done
done
loose=$(find "$src" -maxdepth 1 \( -name '*.cpp' -o -name '*.hpp' \) ! -name agent.cpp)
[ -z "$loose" ] && ok "every file of agent/src is in a room" || bad "files outside the rooms: $loose"
[ "$upward" -eq 0 ] && ok "no upward include among $files files in ${#rooms[@]} rooms"
finish
