#!/usr/bin/env bash
# A console that stops reading must not stop supervision: ddprun's stdout is a pipe whose reader
# never reads; two workers flood it, then exit 3. ddprun must exit 3 within seconds (lines the
# console could not take are dropped and counted), and with --tee the log files are complete.
# Usage: tests/console_test.sh DDPRUN
set -u
source "$(dirname "$0")/lib.sh"
ddprun=$1
work=$(mktemp -d)
reader=
cleanup() { [ -n "$reader" ] && kill "$reader" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
run_stuck() {  # run ddprun with stdout into a FIFO held open by a process that never reads it
  rm -f "$work/fifo"; mkfifo "$work/fifo"
  sleep 60 < "$work/fifo" & reader=$!
  local t0; t0=$(date +%s%N)
  timeout 60 "$ddprun" "$@" > "$work/fifo" 2> "$work/err"
  rc=$?
  secs=$(( ($(date +%s%N) - t0) / 1000000 ))
  kill "$reader" 2>/dev/null; wait "$reader" 2>/dev/null; reader=
}
flood='yes "a line of output from a worker, long enough to fill pipes quickly" | head -n 200000; exit 3'
run_stuck --standalone --nproc_per_node=2 --no_python /bin/sh -c "$flood"
if [ $rc -eq 3 ] && [ $secs -lt 15000 ] && grep -q "line(s) dropped from the console, which did not keep up" "$work/err"; then
  ok "stuck console: ddprun exits 3 in ${secs} ms and reports the dropped lines"
else
  bad "stuck console: exit $rc after ${secs} ms"; tail -5 "$work/err"
fi
run_stuck --standalone --nproc_per_node=1 --log_dir "$work/logs" --tee 1 --no_python /bin/sh -c "$flood"
lines=$(cat "$work"/logs/*/attempt_0/*/stdout.log 2>/dev/null | wc -l)
if [ $rc -eq 3 ] && [ "$lines" -eq 200000 ] && grep -q "the log files are complete" "$work/err"; then
  ok "stuck console with --tee: exit 3 in ${secs} ms, log files complete ($lines lines)"
else
  bad "stuck console with --tee: exit $rc, $lines lines in the logs"; tail -5 "$work/err"
fi
finish
