#!/usr/bin/env bash
# Files nobody else can touch, and every byte accounted (README: Security). Runs in a private
# mount namespace with its own tmpfs on /tmp (unshare -m); `nobody` plays the other user.
#  1. a run directory another user made in a shared --log_dir (mode 0777), or a link there, is
#     refused (exit 1, the path named) and nothing is written into it or through it;
#  2. an events file another user made (mode 0666), or a link, is refused: the job's command line
#     (with its --api-key=...) is not written there;
#  3. --log_dir on a full 1 MiB filesystem: the job still ends 0, every line reaches the console,
#     and ddprun says which log files lack how many bytes (and writes log_write_failed events);
#  4. two nodes sharing one --log_dir (as on a network filesystem): each agent's files go below
#     RUN_ID/HOST.PID, so node 1's rank 0 does not overwrite node 0's.
# Usage: tests/log_files_test.sh DDPRUN
set -u
source "$(dirname "$0")/lib.sh"
ddprun=$1
if [ "${DDPRUN_IN_PRIVATE_NS:-}" != 1 ]; then
  if [ "$(id -u)" -ne 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
    skip "needs root and unshare -m"
  fi
  exec env DDPRUN_IN_PRIVATE_NS=1 unshare -m --propagation private bash "$0" "$@"
fi
exec 9<"$ddprun"
mount -t tmpfs -o size=512m,mode=1777 tmpfs /tmp || skip "cannot mount a tmpfs on /tmp"
mkdir -p /tmp/.under-test && cp "/proc/$$/fd/9" /tmp/.under-test/ddprun && chmod 755 /tmp/.under-test/ddprun
exec 9<&-
ddprun=/tmp/.under-test/ddprun
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
run() { "$ddprun" --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:0 --nproc_per_node=1 --rdzv_id=job7 "$@" --no_python /bin/echo --api-key=s3cret 2>&1; }

# 1. A shared log directory: the run id's directory made by another user, or a link. Nodes of one
# job share it (--nnodes above 1: each node below it in HOST.PID), so such a job must refuse it; a
# one-node run writes in a directory it makes itself, beside it (job7.2), never through it.
mkdir -m 1777 /tmp/shared
as_nobody mkdir -m 0777 /tmp/shared/job7
out=$(run --nnodes=1:2 --log_dir=/tmp/shared --tee=3); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "'/tmp/shared/job7' belongs to uid 65534 with mode 0777" &&
   [ -z "$(ls -A /tmp/shared/job7)" ]; then
  ok "a run directory made by another user (0777) is refused by a job of several nodes, nothing written in it"
else
  bad "another user's run directory (exit $rc, contents: $(ls -A /tmp/shared/job7)): $out"
fi
out=$(run --log_dir=/tmp/shared --tee=3); rc=$?
if [ $rc -eq 0 ] && [ -z "$(ls -A /tmp/shared/job7)" ] && grep -q api-key /tmp/shared/job7.2/attempt_0/0/stdout.log; then
  ok "a one-node run writes beside another user's run directory (job7.2), nothing in it"
else
  bad "a one-node run beside another user's run directory (exit $rc, contents: $(ls -A /tmp/shared/job7)): $out"
fi
rm -rf /tmp/shared/job7.2
rmdir /tmp/shared/job7
as_nobody mkdir -m 0700 /tmp/nobodys && as_nobody ln -s /tmp/nobodys /tmp/shared/job7
out=$(run --nnodes=1:2 --log_dir=/tmp/shared --tee=3); rc=$?
if [ $rc -eq 2 ] && echo "$out" | grep -q "is a link or not a directory" && [ -z "$(ls -A /tmp/nobodys)" ]; then
  ok "a link planted as the run directory is refused (exit 2) by a job of several nodes, nothing written through it"
else
  bad "a planted link (exit $rc): $out"
fi
out=$(run --log_dir=/tmp/shared --tee=3); rc=$?
if [ $rc -eq 0 ] && [ -z "$(ls -A /tmp/nobodys)" ] && [ -f /tmp/shared/job7.2/attempt_0/0/stdout.log ]; then
  ok "a one-node run writes beside a link planted as its run directory (job7.2), nothing through it"
else
  bad "a one-node run beside a planted link (exit $rc, through it: $(ls -A /tmp/nobodys)): $out"
fi
rm -rf /tmp/shared/job7.2
rm /tmp/shared/job7
out=$(run --log_dir=/tmp/shared --tee=3); rc=$?
mode=$(stat -c %a /tmp/shared/job7/attempt_0/0)
if [ $rc -eq 0 ] && [ "$mode" = 700 ] && grep -q api-key /tmp/shared/job7/attempt_0/0/stdout.log; then
  ok "the job's own directories are made 0700 and used"
else
  bad "a clean run in a shared directory (exit $rc, mode $mode): $out"
fi

# 2. The events file.
as_nobody sh -c 'umask 0; : > /tmp/shared/events.jsonl'
out=$(run --standalone --events_file=/tmp/shared/events.jsonl); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "events file.*belongs to uid 65534 with mode 0666" &&
   [ ! -s /tmp/shared/events.jsonl ]; then
  ok "an events file made by another user (0666) is refused: the command line is not written there"
else
  bad "another user's events file (exit $rc, $(wc -c </tmp/shared/events.jsonl) bytes in it): $out"
fi
as_nobody ln -s /tmp/nobodys/stolen /tmp/shared/linked.jsonl
out=$(run --standalone --events_file=/tmp/shared/linked.jsonl); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "is a link" && [ ! -e /tmp/nobodys/stolen ]; then
  ok "an events file that is a link is refused"
else
  bad "a linked events file (exit $rc): $out"
fi

# 3. A full disk under --log_dir.
mkdir /tmp/small && mount -t tmpfs -o size=1m tmpfs /tmp/small
out=$("$ddprun" --standalone --nproc_per_node=2 --tee=3 --log_dir=/tmp/small --events_file=/tmp/events.jsonl \
  --no_python sh -c 'i=0; while [ $i -lt 20000 ]; do echo "line $i of rank $RANK padded to be a hundred bytes long ....................................."; i=$((i+1)); done' 2>/tmp/err)
rc=$?
lines=$(echo "$out" | grep -c 'padded to be')
lost=$(grep -c '"event":"log_write_failed"' /tmp/events.jsonl)
bytes=$(grep -o '"bytes_lost":[0-9]*' /tmp/events.jsonl | cut -d: -f2 | awk '{s += $1} END {print s + 0}')
echo "  a 1 MiB --log_dir, 2 x 2.2 MB of output: exit $rc, $lines of 40000 lines on the console, $lost log files incomplete, $bytes bytes lost"
if [ $rc -eq 0 ] && [ "$lines" -eq 40000 ] && [ "$lost" -ge 2 ] && grep -q "is incomplete: .* bytes of output are missing" /tmp/err; then
  ok "a full disk: the job ends 0, the console has every line, the incomplete log files are named with what they lack"
else
  bad "a full disk (exit $rc): $(cat /tmp/err)"
fi

# 4. Two nodes, one --log_dir: each agent's own directory below the run id.
two=(--rdzv_backend=c10d --nnodes=2 --nproc_per_node=1 --rdzv_id=job9 --log_dir=/tmp/two --tee=3 --no_python
     sh -c 'echo "from group rank $GROUP_RANK"')
"$ddprun" --rdzv_endpoint=127.0.0.1:0 "${two[@]}" >/tmp/two0.out 2>/tmp/two0.err &
first=$!
port=""
for _ in $(seq 200); do
  port=$(sed -n 's/.*hosting the rendezvous store on port \([0-9]*\).*/\1/p' /tmp/two0.err | head -1)
  [ -n "$port" ] && break
  kill -0 $first 2>/dev/null || break
  sleep 0.05
done
"$ddprun" --rdzv_endpoint=127.0.0.1:${port:-1} "${two[@]}" >/tmp/two1.out 2>/tmp/two1.err
rc1=$?
wait $first
rc0=$?
nodes=$(find /tmp/two/job9 -mindepth 1 -maxdepth 1 -type d | wc -l)
logs=$(cat /tmp/two/job9/*/attempt_0/0/stdout.log 2>/dev/null | sort | tr '\n' ' ')
if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && [ "$nodes" -eq 2 ] && [ "$logs" = "from group rank 0 from group rank 1 " ] &&
   [ "$(find /tmp/two/job9 -mindepth 1 -maxdepth 1 -name "$(hostname).*" | wc -l)" -eq 2 ]; then
  ok "two nodes sharing --log_dir: RUN_ID/HOST.PID each, both ranks 0's logs kept"
else
  bad "two nodes sharing --log_dir (exits $rc0 $rc1, $nodes node directories, logs: $logs): $(cat /tmp/two0.err /tmp/two1.err | tail -5)"
fi
finish
