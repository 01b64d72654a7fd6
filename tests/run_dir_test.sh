#!/usr/bin/env bash
# ddprun never deletes what it did not create, and its files are private. Runs inside a private
# mount namespace with its own tmpfs on /tmp (unshare -m), so that a regression cannot damage the
# machine running the tests. Needs root; exits 77 (skipped) where namespaces cannot be made.
#  - run ids that could climb out of the log directory are refused (exit 2), nothing deleted;
#  - without --log_dir ddprun works in its own directory under $TMPDIR and removes exactly it,
#    following no link and crossing no mount point a worker left in it;
#  - a user's --log_dir and everything beside it stay; new directories are 0700, files 0600;
#  - a worker starts with exactly descriptors 0, 1 and 2.
# Usage: tests/run_dir_test.sh DDPRUN
set -u
source "$(dirname "$0")/lib.sh"
ddprun=$1
if [ "${DDPRUN_IN_PRIVATE_NS:-}" != 1 ]; then
  if [ "$(id -u)" -ne 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
    skip "needs root and unshare -m"
  fi
  exec env DDPRUN_IN_PRIVATE_NS=1 unshare -m --propagation private bash "$0" "$@"
fi
# The binary may live under /tmp itself (a checkout in /tmp): keep it open across the mount and
# run a copy from inside the private tmpfs.
exec 9<"$ddprun"
mount -t tmpfs -o size=512m tmpfs /tmp || skip "cannot mount a tmpfs on /tmp"
# ddprun's own directory goes to /dev/shm when nothing in it is kept: a private one too.
mount -t tmpfs -o size=64m tmpfs /dev/shm || skip "cannot mount a tmpfs on /dev/shm"
mkdir -p /tmp/.under-test && cp "/proc/$$/fd/9" /tmp/.under-test/ddprun && chmod 755 /tmp/.under-test/ddprun
exec 9<&-
ddprun=/tmp/.under-test/ddprun
mkdir -p /tmp/keep && echo precious > /tmp/keep/file && echo sentinel > /tmp/sentinel
snapshot() { (cd /tmp && find . | sort); (cd /dev/shm && find . | sed 's|^|shm:|' | sort); }
intact() { [ "$(cat /tmp/sentinel 2>/dev/null)" = sentinel ] && [ "$(cat /tmp/keep/file 2>/dev/null)" = precious ]; }

# 1. Run ids that name something else are refused before anything happens.
for id in '../x' '..' '.' 'a/b' '/tmp' "$(printf 'x%.0s' $(seq 129))" 'a b' 'x;rm'; do
  out=$("$ddprun" --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:0 --rdzv_id="$id" --nproc_per_node=1 --no_python /bin/true 2>&1)
  rc=$?
  if [ $rc -eq 2 ] && echo "$out" | grep -q "is not a valid run id" && intact; then
    ok "--rdzv_id='${id:0:20}' refused with exit 2, nothing deleted"
  else
    bad "--rdzv_id='${id:0:20}' (exit $rc): $out"
  fi
done
# The exact command of the report (it deleted most of /tmp).
before=$(snapshot)
"$ddprun" --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:0 --rdzv_id=../x --nproc_per_node=1 --no_python /bin/true >/dev/null 2>&1
[ "$(snapshot)" = "$before" ] && ok "the reported command leaves /tmp exactly as it was" || bad "/tmp changed: $(diff <(echo "$before") <(snapshot))"

# 2. Without --log_dir: ddprun's own temporary directory, under $TMPDIR, removed at the end.
before=$(snapshot)
"$ddprun" --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:0 --rdzv_id=job.1_a-B --nproc_per_node=2 --no_python /bin/true >/dev/null 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(snapshot)" = "$before" ] && intact && ok "a valid run id runs; its temporary directory is gone and nothing else changed" \
  || bad "exit $rc; /tmp changed: $(diff <(echo "$before") <(snapshot))"
"$ddprun" --standalone --nproc_per_node=2 --no_python /bin/sh -c 'case "$TORCHELASTIC_ERROR_FILE" in /dev/shm/ddprun-*/attempt_0/*/error.json) exit 0;; esac; exit 1' >/dev/null 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(snapshot)" = "$before" ] && ok "without TMPDIR, nothing kept: the directory is in /dev/shm, and gone at the end" \
  || bad "exit $rc (1: not in /dev/shm); changed: $(diff <(echo "$before") <(snapshot))"
mount -o remount,ro /dev/shm
"$ddprun" --standalone --nproc_per_node=1 --no_python /bin/sh -c 'case "$TORCHELASTIC_ERROR_FILE" in /tmp/ddprun-*) exit 0;; esac; exit 1' >/dev/null 2>&1
rc=$?
mount -o remount,rw /dev/shm
[ $rc -eq 0 ] && [ "$(snapshot)" = "$before" ] && ok "/dev/shm unusable: /tmp, and gone at the end" || bad "exit $rc; changed: $(diff <(echo "$before") <(snapshot))"
# A worker leaves links to the user's files and a bind mount of them in its directory: the
# removal follows no link and crosses no mount point (the mount stays, and what it shows).
"$ddprun" --standalone --nproc_per_node=1 --no_python /bin/sh -c 'd=$(dirname "$TORCHELASTIC_ERROR_FILE")
  ln -s /tmp/keep "$d/dirlink"; ln -s /tmp/keep/file "$d/filelink"; mkdir -p "$d/deep/m"; mount --bind /tmp/keep "$d/deep/m"
  echo "$d" > /tmp/worker-dir' >/dev/null 2>&1
rc=$?
m="$(cat /tmp/worker-dir 2>/dev/null)/deep/m"
if [ $rc -eq 0 ] && intact && [ -f /tmp/keep/file ] && mountpoint -q "$m" && [ "$(cat "$m/file")" = precious ]; then
  ok "a worker's links and bind mount in its directory: nothing outside it removed, the mount kept"
else
  bad "links and a mount in a worker's directory: exit $rc; $(ls -la /tmp/keep); $m: $(ls -la "$m" 2>&1)"
fi
umount "$m" 2>/dev/null; rm -rf /dev/shm/ddprun-* /tmp/worker-dir

mkdir -p /tmp/mytmp && echo mine > /tmp/mytmp/own
TMPDIR=/tmp/mytmp "$ddprun" --standalone --nproc_per_node=1 --no_python /bin/sh -c 'pwd >/dev/null; exit 0' >/dev/null 2>&1
[ "$(ls -A /tmp/mytmp)" = own ] && [ "$(cat /tmp/mytmp/own)" = mine ] && ok "TMPDIR is used, and only ddprun's own directory in it is removed" \
  || bad "TMPDIR: $(ls -la /tmp/mytmp)"
TMPDIR=/tmp/mytmp "$ddprun" --standalone --nproc_per_node=1 --tee 3 --no_python /bin/sh -c 'echo hello' >/dev/null 2>&1
d=$(ls -d /tmp/mytmp/ddprun-* 2>/dev/null | head -1)
if [ -n "$d" ] && [ "$(stat -c %a "$d")" = 700 ] && f=$(find "$d" -name stdout.log | head -1) && [ "$(stat -c %a "$f")" = 600 ] && grep -q hello "$f"; then
  ok "with --tee the logs are kept in a 0700 directory, files 0600"
else
  bad "kept logs: $(find /tmp/mytmp -exec stat -c '%a %n' {} \;)"
fi

# 3. A user's --log_dir: logs go under it, nothing of the user's is touched, new dirs 0700.
"$ddprun" --standalone --nproc_per_node=2 --log_dir=/tmp/keep --redirects 3 --no_python /bin/sh -c 'echo out; echo err >&2' >/dev/null 2>&1
run=$(ls /tmp/keep | grep -v '^file$' | head -1)
if intact && [ -n "$run" ] && [ "$(stat -c %a "/tmp/keep/$run")" = 700 ] && [ "$(stat -c %a /tmp/keep)" = 755 ] &&
   [ "$(stat -c %a "/tmp/keep/$run/attempt_0/0/stdout.log")" = 600 ] && grep -q out "/tmp/keep/$run/attempt_0/0/stdout.log"; then
  ok "--log_dir kept with the user's files; new directories 0700, log files 0600"
else
  bad "--log_dir: $(find /tmp/keep -exec stat -c '%a %n' {} \;)"
fi

# A run's logs go to a directory it made itself: beside an earlier run's (the same run id), never
# into it, so a link planted where a log file would go there is never reached, and the earlier
# run's logs stay.
mkdir -p /tmp/links/linkjob/attempt_0/0 && echo precious > /tmp/victim
ln -s /tmp/victim /tmp/links/linkjob/attempt_0/0/stdout.log
echo earlier > /tmp/links/linkjob/attempt_0/0/stderr.log
"$ddprun" --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:0 --rdzv_id=linkjob --nproc_per_node=1 --log_dir=/tmp/links \
  --redirects 3 --no_python /bin/sh -c 'echo overwritten; echo later >&2' >/dev/null 2>&1
[ "$(cat /tmp/victim)" = precious ] && [ "$(cat /tmp/links/linkjob/attempt_0/0/stderr.log)" = earlier ] &&
  [ "$(cat /tmp/links/linkjob.2/attempt_0/0/stdout.log)" = overwritten ] &&
  [ "$(cat /tmp/links/linkjob.2/attempt_0/0/stderr.log)" = later ] &&
  ok "a run's logs go beside an earlier run's (linkjob.2): its files kept, a link planted there not reached" \
  || bad "an earlier run's directory: victim '$(cat /tmp/victim)', $(find /tmp/links -exec stat -c '%a %n' {} \;)"
# A --log_dir that is a file, or cannot be made, is bad usage: exit 2, at once.
touch /tmp/afile
"$ddprun" --log_dir=/tmp/afile/logs --no_python /bin/true >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && ok "a --log_dir below a file exits 2" || bad "a --log_dir below a file: exit $rc"
rm -f /tmp/afile

# 4. A worker starts with exactly 0, 1 and 2 (no store socket, no pipe of another worker), and 5:
# its own rank's state area (docs/usage.md: In-memory state), none with --no_state.
# (No pipe in the worker's shell: the shell would hold the pipe's descriptor while ls lists it.)
out=$("$ddprun" --standalone --nproc_per_node=2 --log_level warn --no_python /bin/sh -c 'ls /proc/$$/fd; readlink /proc/$$/fd/5' 2>&1)
fds=$(for r in 0 1; do echo "$out" | sed -n "s/^\[default$r\]://p" | sort -n | tr '\n' ' '; echo; done | sort -u)
if [ "$fds" = "$(printf '/memfd:ddprun-state-0 (deleted) 0 1 2 5 \n/memfd:ddprun-state-1 (deleted) 0 1 2 5 ')" ]; then
  ok "each worker starts with exactly descriptors 0, 1 and 2, and 5: its rank's state area"
else
  bad "worker descriptors: $fds"
fi
out=$("$ddprun" --standalone --nproc_per_node=2 --log_level warn --no_state --no_python /bin/sh -c 'ls /proc/$$/fd' 2>&1)
fds=$(for r in 0 1; do echo "$out" | sed -n "s/^\[default$r\]://p" | sort -n | tr '\n' ' '; echo; done | sort -u)
[ "$fds" = "0 1 2 " ] && ok "with --no_state, exactly 0, 1 and 2" || bad "worker descriptors with --no_state: $fds"
intact && ok "the sentinel files survived everything" || bad "sentinel files damaged"
finish
