#!/usr/bin/env bash
# Two things a neighbour or a limit does to a launch (README: Security). Runs in private mount and
# pid namespaces, /tmp a fresh tmpfs.
#  1. --log_dir=/tmp/shared/logs, where /tmp/shared is sticky and anyone can write to it, and
#     `nobody` made logs a link to root's /tmp/victim: refused (the kernel's protected_symlinks
#     rule, kept whatever fs.protected_symlinks says), nothing written there; root's own link
#     there is followed;
#  2. RLIMIT_NPROC counts threads: as another user with a limit under what 4 workers and the
#     agent's threads need, exit 2 naming the limit (it used to pass the check, then fail with
#     "clone failed" and a bare "Resource temporarily unavailable"); with just enough for the
#     check, what the workers' own children push over it is named with the limit; with room,
#     the job runs.
# Usage: tests/planted_link_nproc_test.sh DDPRUN
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/private_ns.sh" "$1" -- "$0" "$@"
need setpriv prlimit
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
echo "fs.protected_symlinks=$(cat /proc/sys/fs/protected_symlinks) (ddprun's own check holds either way)"

# 1. A planted --log_dir link.
mkdir -m 1777 /tmp/shared
mkdir -m 700 /tmp/victim
as_nobody ln -s /tmp/victim /tmp/shared/logs
/tmp/bin/ddprun --standalone --nproc_per_node=1 --log_dir=/tmp/shared/logs --no_python /bin/true >/tmp/link.log 2>&1
rc=$?
if [ $rc -ne 0 ] && [ -z "$(ls -A /tmp/victim)" ] && grep -q "symbolic link of uid 65534" /tmp/link.log; then
  ok "nobody's link planted in a sticky shared directory is refused as --log_dir (exit $rc), nothing written"
else
  bad "planted --log_dir link: exit $rc, in /tmp/victim: '$(ls -A /tmp/victim)': $(cat /tmp/link.log)"
fi
rm /tmp/shared/logs
ln -s /tmp/victim /tmp/shared/mine
/tmp/bin/ddprun --standalone --nproc_per_node=1 --log_dir=/tmp/shared/mine --no_python /bin/true >/tmp/mine.log 2>&1
rc=$?
[ $rc -eq 0 ] && [ -n "$(ls -A /tmp/victim)" ] && ok "root's own link there is followed (the logs are in its target)" ||
  bad "root's own link: exit $rc: $(cat /tmp/mine.log)"

# 2. RLIMIT_NPROC, as a user of its own (root is not held to it; the kernel counts a user's tasks
# machine-wide, and other tests may run as nobody meanwhile).
uid=64999
limit=8
busy=(--standalone --nproc_per_node=4 --metrics_port=0 --no_python /bin/sh -c 'echo hi; sleep 0.5')
prlimit --nproc=$limit:$limit setpriv --reuid=$uid --regid=$uid --clear-groups /tmp/bin/ddprun "${busy[@]}" \
  >/tmp/nproc.log 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "RLIMIT_NPROC (ulimit -u), which counts threads, is $limit" /tmp/nproc.log; then
  ok "RLIMIT_NPROC=$limit, 4 workers and --metrics_port: exit 2 before anything starts, naming the limit: $(cat /tmp/nproc.log)"
else
  bad "RLIMIT_NPROC=$limit, 4 workers: exit $rc: $(cat /tmp/nproc.log)"
fi
# Just enough for the check, but each worker's shell starts a `sleep` of its own: whatever the
# kernel refuses is named, with the limit (not a bare "Resource temporarily unavailable").
need_n=$(sed -n 's/.*needs \([0-9]*\) processes and threads.*/\1/p' /tmp/nproc.log)
prlimit --nproc=${need_n:-10}:${need_n:-10} setpriv --reuid=$uid --regid=$uid --clear-groups /tmp/bin/ddprun "${busy[@]}" \
  >/tmp/short.log 2>&1
rc=$?
refused=$(grep -c "Resource temporarily unavailable" /tmp/short.log)
named=$(grep -c "Resource temporarily unavailable (the kernel refused a new thread or process: raise RLIMIT_NPROC" /tmp/short.log)
[ "$refused" -gt 0 ] && [ "$refused" = "$named" ] && grep -q "cannot start " /tmp/short.log &&
  ok "RLIMIT_NPROC=${need_n:-10}, the workers' own children over it: each refusal names what and the limit (exit $rc)" ||
  bad "RLIMIT_NPROC=${need_n:-10}: $refused refusals, $named of them named (exit $rc): $(grep -v '^\[' /tmp/short.log)"
need_n=$(sed -n 's/.*needs \([0-9]*\) processes and threads.*/\1/p' /tmp/nproc.log)
room=$(( ${need_n:-10} + 2 ))
prlimit --nproc=$room:$room setpriv --reuid=$uid --regid=$uid --clear-groups \
  /tmp/bin/ddprun --standalone --nproc_per_node=4 --metrics_port=0 --no_python /bin/sh -c 'echo worker $RANK' \
  >/tmp/room.log 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(grep -c ':worker [0-3]$' /tmp/room.log)" = 4 ] &&
  ok "RLIMIT_NPROC=$room (what was asked, and 2 for the workers' shells): the job runs, metrics too" ||
  bad "RLIMIT_NPROC=$room: exit $rc: $(cat /tmp/room.log)"
finish
