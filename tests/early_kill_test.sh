#!/usr/bin/env bash
# A kill -9 of ddprun at any moment of its first milliseconds leaves nothing: no temporary
# directory, no cgroup, no worker (the guardian is told their names before they are made). As
# root (cgroup mode where the hierarchy allows) and as nobody (subreaper mode), COUNT kills each,
# at random moments from 0 to 5 ms after the start. Runs in private mount and pid namespaces.
# Usage: tests/early_kill_test.sh DDPRUN [COUNT]
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/private_ns.sh" "$1" "$(dirname "$0")/early_kill.py" -- "$0" "$@"
need /usr/bin/python3 setpriv pgrep
count=${2:-1000}
if /usr/bin/python3 /tmp/bin/early_kill.py /tmp/bin/ddprun "$count" 5; then
  ok "root: $count kill -9s at 0-5 ms left nothing"
else
  bad "root: kill -9s at 0-5 ms left something behind"
fi
if setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 /tmp/bin/early_kill.py /tmp/bin/ddprun "$count" 5; then
  ok "nobody: $count kill -9s at 0-5 ms left nothing"
else
  bad "nobody: kill -9s at 0-5 ms left something behind"
fi
finish
