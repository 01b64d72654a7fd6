#!/usr/bin/env bash
# What a parent leaves in the signal state survives exec (README: Security): ddprun started with
# SIGCHLD blocked must still see its workers end (they stayed zombies and ddprun waited forever),
# started with SIGTERM and SIGINT blocked must still stop the job on them (nothing happened), and
# started with them ignored likewise. The workers start with an empty mask and default
# dispositions. Runs in private mount and pid namespaces. Usage: tests/inherited_signals_test.sh DDPRUN
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/private_ns.sh" "$1" -- "$0" "$@"
need python3
# /tmp/bin/with_signals CMD...: runs CMD with the signals of $MASK blocked and those of $IGNORE
# ignored, as some job schedulers and language runtimes start their children.
cat >/tmp/bin/with_signals <<'PY'
#!/usr/bin/env python3
import os, signal, sys
for name in filter(None, os.environ.get("MASK", "").split(",")):
    signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, name)})
for name in filter(None, os.environ.get("IGNORE", "").split(",")):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
os.execv(sys.argv[1], sys.argv[1:])
PY
chmod 755 /tmp/bin/with_signals
# Waits (at most 20 s) until $1 files are in /tmp/ready.
wait_ready() {
  local deadline=$((SECONDS + 20))
  while [ "$(ls /tmp/ready | wc -l)" -lt "$1" ] && [ $SECONDS -lt $deadline ]; do sleep 0.02; done
  [ "$(ls /tmp/ready | wc -l)" -ge "$1" ]
}
mkdir -p /tmp/ready

# 1. SIGCHLD blocked: the workers end, ddprun sees it and exits 0 (timeout: it used to hang).
MASK=SIGCHLD timeout -s KILL 30 /tmp/bin/with_signals /tmp/bin/ddprun --standalone --nproc_per_node=2 --no_python \
  /bin/sh -c 'exit 0' >/tmp/chld.log 2>&1
rc=$?
[ $rc -eq 0 ] && ok "SIGCHLD blocked by the parent: the workers' exits are seen, ddprun exits 0" ||
  bad "SIGCHLD blocked by the parent: exit $rc (137: it hung until killed): $(tail -5 /tmp/chld.log)"

# 2. The workers' own mask and dispositions are clean: SigBlk and SigIgn of a worker are empty.
MASK=SIGCHLD,SIGTERM,SIGINT,SIGUSR1 IGNORE=SIGHUP,SIGUSR2 timeout -s KILL 30 /tmp/bin/with_signals /tmp/bin/ddprun \
  --standalone --nproc_per_node=1 --no_python /bin/grep -E '^Sig(Blk|Ign)' /proc/self/status >/tmp/worker.log 2>&1
if grep -q "SigBlk:[[:space:]]*0*$" /tmp/worker.log && grep -q "SigIgn:[[:space:]]*0*$" /tmp/worker.log; then
  ok "a worker starts with no signal blocked or ignored"
else
  bad "a worker's signal state: $(grep -E 'Sig(Blk|Ign)' /tmp/worker.log)"
fi

# 3. SIGTERM, SIGINT blocked (and SIGQUIT ignored): each still stops the job, which ends with 128 + it.
for sig in TERM INT QUIT; do
  rm -f /tmp/ready/*
  log=/tmp/$sig.log
  MASK=SIGCHLD,SIGTERM,SIGINT IGNORE=SIGQUIT,SIGHUP /tmp/bin/with_signals /tmp/bin/ddprun --standalone --nproc_per_node=2 \
    --stop_timeout=5 --no_python /bin/sh -c ': > /tmp/ready/$RANK; exec sleep 60' >"$log" 2>&1 &
  pid=$!
  if ! wait_ready 2; then
    bad "SIG$sig: the workers never started: $(cat "$log")"; kill -9 $pid; wait $pid; continue
  fi
  kill -s $sig $pid
  deadline=$((SECONDS + 20))
  while kill -0 $pid 2>/dev/null && [ "$(awk '{print $3}' /proc/$pid/stat 2>/dev/null)" != Z ] &&
        [ $SECONDS -lt $deadline ]; do sleep 0.05; done
  if kill -0 $pid 2>/dev/null && [ "$(awk '{print $3}' /proc/$pid/stat 2>/dev/null)" != Z ]; then
    bad "SIG$sig with SIGTERM and SIGINT blocked, SIGQUIT ignored by the parent: ddprun still runs after 20 s: $(tail -3 "$log")"
    kill -9 $pid
    wait $pid
    continue
  fi
  wait $pid; rc=$?
  left=$(pgrep -c -x sleep || true)
  num=$(kill -l $sig)
  [ $rc -eq $((128 + num)) ] && [ "$left" = 0 ] &&
    ok "SIG$sig stops the job though the parent blocked or ignored it (exit $rc, no worker left)" ||
    bad "SIG$sig: exit $rc (want $((128 + num))), $left workers left: $(tail -3 "$log")"
done
finish
