#!/usr/bin/env bash
# Heartbeats are timed on the monotonic clock, so the wall clock can neither kill a healthy
# worker nor hide a hung one. A worker's heartbeat file gets mtimes far from "now", as after a
# clock step: (1) a worker that keeps touching it with dates 26 years in the past is healthy
# and must finish (exit 0); (2) a worker that touched it once with a date in the future and then
# hangs must be found hung after --worker_timeout (ddprun exits 124, the heartbeat code).
# Usage: tests/heartbeat_clock_test.sh DDPRUN
set -u
source "$(dirname "$0")/lib.sh"
ddprun=$1
# (ddprun's temporary directory, where the hang's stack dumps are kept, goes with this one)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
past='for i in $(seq 25); do touch -d "2000-01-0$((i % 2 + 1))" "$DDPRUN_HEARTBEAT_FILE"; sleep 0.1; done; exit 0'
out=$(timeout 60 "$ddprun" --standalone --nproc_per_node=2 --worker_timeout=1 --no_python /bin/sh -c "$past" 2>&1)
rc=$?
if [ $rc -eq 0 ]; then
  ok "heartbeats with mtimes in the past keep a healthy worker alive (2.5 s, timeout 1 s)"
else
  bad "healthy worker with past mtimes: exit $rc"; echo "$out" | tail -5
fi
future='touch -d "2099-01-01" "$DDPRUN_HEARTBEAT_FILE"; exec sleep 30'
t0=$(date +%s)
out=$(TMPDIR=$tmp timeout 60 "$ddprun" --standalone --nproc_per_node=1 --worker_timeout=1 --stop_timeout=1 --no_python /bin/sh -c "$future" 2>&1)
rc=$?
secs=$(( $(date +%s) - t0 ))
if [ $rc -eq 124 ] && [ $secs -lt 10 ] && echo "$out" | grep -q "no heartbeat for"; then
  ok "a hang after an mtime in the future is found after the time-out (${secs} s, exit 124)"
else
  bad "hang after a future mtime: exit $rc after ${secs} s"; echo "$out" | tail -5
fi
finish
