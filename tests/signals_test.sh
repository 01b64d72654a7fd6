#!/usr/bin/env bash
# Every terminating signal handled (README: Security). Signals ddprun does not forward (SIGUSR1
# without --signals_to_handle, SIGUSR2, SIGALRM, SIGXCPU, SIGVTALRM, SIGPWR, SIGRTMIN) stop the
# job as SIGTERM does: the workers get SIGTERM and their grace period, the summary is printed,
# the temporary directory is removed, ddprun exits 128 + the signal and leaves no process. A
# signal listed in --signals_to_handle reaches the workers, who decide. Runs in private mount and
# pid namespaces. Usage: tests/signals_test.sh DDPRUN
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/private_ns.sh" "$1" -- "$0" "$@"
# Waits (at most 20 s) until both workers have set their traps (ddprun's console output is
# block-buffered into a file, so the workers say so with files).
wait_ready() {
  local deadline=$((SECONDS + 20))
  while [ "$(ls /tmp/ready | wc -l)" -lt 2 ] && [ $SECONDS -lt $deadline ]; do sleep 0.02; done
  [ "$(ls /tmp/ready | wc -l)" -ge 2 ]
}
mkdir /tmp/ready /tmp/usr1
# The TERM trap takes 0.3 s: "done-TERM" shows the worker had its grace period.
worker='trap "echo got-TERM; sleep 0.3; echo done-TERM; exit 3" TERM; trap "echo got-USR1; exit 0" USR1
  : > /tmp/ready/$RANK; while :; do sleep 0.05; done'

for sig in USR1 USR2 ALRM XCPU VTALRM PWR RTMIN RTMAX; do
  num=$(kill -l "$sig")
  tmp=$(mktemp -d /tmp/run-XXXX)
  log=/tmp/$sig.log
  rm -f /tmp/ready/*
  TMPDIR=$tmp /tmp/bin/ddprun --standalone --nproc_per_node=2 --stop_timeout=10 --no_python /bin/sh -c "$worker" >"$log" 2>&1 &
  pid=$!
  wait_ready || { bad "SIG$sig: the workers never started: $(cat "$log")"; kill -9 $pid; continue; }
  kill -s "$sig" $pid
  wait $pid; rc=$?
  left=$(pgrep -c -f "while :; do sleep" || true)
  if [ $rc -eq $((128 + num)) ] && [ "$(grep -c 'done-TERM' "$log")" = 2 ] &&
     grep -q "received SIG$sig; stopping the job" "$log" && grep -q "stopped by SIG$sig; the workers had run" "$log" &&
     [ -z "$(ls -A "$tmp")" ] && [ "$left" = 0 ]; then
    ok "SIG$sig stops the job: both workers ran their SIGTERM handler to its end, summary printed, exit $rc, temporary directory empty, $left processes left"
  else
    bad "SIG$sig: exit $rc (want $((128 + num))), temporary directory: '$(ls -A "$tmp")', $left left: $(cat "$log")"
  fi
done

# Listed in --signals_to_handle: forwarded; the workers end on their own terms (here: exit 0).
log=/tmp/forward.log
rm -f /tmp/ready/*
/tmp/bin/ddprun --standalone --nproc_per_node=2 --signals_to_handle=SIGTERM,SIGINT,SIGUSR1 --no_python /bin/sh -c "$worker" >"$log" 2>&1 &
pid=$!
if wait_ready; then
  kill -USR1 $pid
  wait $pid; rc=$?
  if [ $rc -eq 138 ] && [ "$(grep -c 'got-USR1' "$log")" = 2 ] && ! grep -q "got-TERM" "$log" &&
     grep -q "forwarding it to the workers" "$log"; then
    ok "SIGUSR1 listed in --signals_to_handle reaches the workers, who end on their own (exit $rc)"
  else
    bad "a forwarded SIGUSR1: exit $rc (want 138): $(cat "$log")"
  fi
else
  bad "the forwarding job never started: $(cat "$log")"; kill -9 $pid
fi

# Slurm's pre-emption: SIGUSR1 forwarded (the workers checkpoint and go on), then SIGTERM at the
# time limit: a first stop, with its grace period, not "again". The job's end was recorded at
# the notice (every node reports the same): exit 128 + SIGUSR1.
log=/tmp/usr1-term.log
notice='trap "echo got-TERM; sleep 0.3; echo done-TERM; exit 3" TERM; trap ": > /tmp/usr1/\$RANK" USR1
  : > /tmp/ready/$RANK; while :; do sleep 0.05; done'
rm -f /tmp/ready/* /tmp/usr1/*
/tmp/bin/ddprun --standalone --nproc_per_node=2 --signals_to_handle=SIGUSR1 --no_python /bin/sh -c "$notice" >"$log" 2>&1 &
pid=$!
if wait_ready; then
  kill -USR1 $pid
  deadline=$((SECONDS + 20))
  while [ "$(ls /tmp/usr1 | wc -l)" -lt 2 ] && [ $SECONDS -lt $deadline ]; do sleep 0.02; done
  kill -TERM $pid
  wait $pid; rc=$?
  if [ "$(ls /tmp/usr1 | wc -l)" = 2 ] && [ "$(grep -c 'done-TERM' "$log")" = 2 ] && ! grep -q "again" "$log" && [ $rc -eq 138 ]; then
    ok "SIGUSR1 forwarded, then SIGTERM: the workers get their grace period (exit $rc)"
  else
    bad "SIGUSR1 then SIGTERM: exit $rc (want 138): $(cat "$log")"
  fi
else
  bad "the pre-emption job never started: $(cat "$log")"; kill -9 $pid
fi

finish
