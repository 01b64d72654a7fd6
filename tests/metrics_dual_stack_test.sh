#!/usr/bin/env bash
# --metrics_port answers on every interface, IPv4 included, where net.ipv6.bindv6only=1 (README:
# Operations): in a network namespace of its own with that setting, /healthz answers over
# 127.0.0.1 and over ::1; HEAD /metrics gets the headers of GET (its Content-Length) and no body.
# Usage: tests/metrics_dual_stack_test.sh DDPRUN
set -u
source "$(dirname "$0")/lib.sh"
ddprun=$1
need unshare ip curl
if [ "${DDPRUN_IN_NET_NS:-}" != 1 ]; then
  [ "$(id -u)" -eq 0 ] || skip "this needs root (unshare -n)"
  unshare -n true 2>/dev/null || skip "unshare -n is not allowed here"
  exec env DDPRUN_IN_NET_NS=1 unshare -n bash "$0" "$@"
fi
ip link set lo up
echo 1 >/proc/sys/net/ipv6/bindv6only || skip "cannot set net.ipv6.bindv6only in a network namespace"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$ddprun" --standalone --nproc_per_node=1 --metrics_port=0 --no_python /bin/sh -c \
  "while [ ! -e $tmp/done ]; do sleep 0.05; done" >"$tmp/log" 2>&1 &
pid=$!
port=
deadline=$((SECONDS + 20))
while [ -z "$port" ] && [ $SECONDS -lt $deadline ]; do
  port=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$tmp/log")
  [ -n "$port" ] || sleep 0.05
done
if [ -z "$port" ]; then
  bad "no metrics port printed: $(cat "$tmp/log")"
else
  v4=$(curl -s --max-time 5 "http://127.0.0.1:$port/healthz")
  v6=$(curl -s --max-time 5 -g "http://[::1]:$port/healthz")
  [ "$v4" = ok ] && ok "bindv6only=1: /healthz answers over 127.0.0.1" || bad "bindv6only=1: 127.0.0.1 got '$v4'"
  [ "$v6" = ok ] && ok "bindv6only=1: /healthz answers over ::1" || bad "bindv6only=1: ::1 got '$v6'"
  # HEAD over ::1, which answered before dual-stack too: this checks HEAD alone.
  get_len=$(curl -s --max-time 5 -g "http://[::1]:$port/metrics" | wc -c)
  exec 3<>"/dev/tcp/::1/$port"
  printf 'HEAD /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n' >&3
  timeout 5 cat <&3 >"$tmp/head"
  exec 3<&-
  body=$(sed '1,/^\r$/d' "$tmp/head" | wc -c)  # the bytes after the blank line
  length=$(tr -d '\r' <"$tmp/head" | sed -n 's/^Content-Length: //Ip')
  if head -1 "$tmp/head" | grep -q "^HTTP/1.1 200" && [ "$body" = 0 ] && [ "${length:-0}" -gt 0 ]; then
    ok "HEAD /metrics: 200, Content-Length $length (a GET just before sent $get_len bytes), and no body"
  else
    bad "HEAD /metrics: $body bytes of body, Content-Length ${length:-none} (GET sent $get_len): $(head -c 400 "$tmp/head")"
  fi
fi
touch "$tmp/done"
wait $pid
finish
