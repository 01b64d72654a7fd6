#!/usr/bin/env bash
# ddprun-store's address allow-list across two namespaced hosts: a client on h2 is refused by a
# store on h1 unless h2's address is in --allow (by default only this host's clients are).
# Usage: store_allow_test.sh DDPRUN_STORE
set -u
store=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts.sh"
hosts_up 2
# A 2.x VALIDATE then PING from h2: served when the store answers the PING.
probe='import socket,struct,sys
s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=5)
s.sendall(bytes([0])+struct.pack("<I",0x3C85F7CE)+bytes([13])+struct.pack("<I",7))
try: d=s.recv(4)
except OSError: d=b""
sys.exit(0 if d==struct.pack("<I",7) else 1)'
fail=0
check_allow() {
  local name=$1 expect=$2
  shift 2
  start 1 "store_$expect" "$store" --host "" --port 29500 "$@"
  wait_line "$out/store_$expect.out" listening 20 || { echo "FAILED: the store did not start"; fail=1; return; }
  local rc=0
  on 2 /usr/bin/python3 -c "$probe" h1 29500 || rc=$?
  local p="pid_store_$expect"
  kill -- "-${!p}" 2>/dev/null
  wait "${!p}" 2>/dev/null
  if { [ "$expect" = served ] && [ $rc -eq 0 ]; } ||
     { [ "$expect" = refused ] && [ $rc -ne 0 ] &&
       grep -q "refused a connection from $(addr 2): not in the allowed addresses" "$out/store_$expect.err"; }; then
    echo "ok: $name"
  else
    echo "FAILED: $name (probe exit $rc)"; cat "$out/store_$expect".*; fail=1
  fi
}
check_allow "ddprun-store refuses another host by default (--allow loopback)" refused
check_allow "ddprun-store serves another host in --allow" served --allow "$net.0/24"
exit $fail
