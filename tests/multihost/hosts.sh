# Hosts that are hosts, for multi-node tests (sourced by the tests in this folder): each host is a
# network namespace of its own, joined to the others by a bridge in a "switch" namespace, with
# its own host name (unshare --uts) and its own hosts file (/etc/netns/NAME/hosts, which
# `ip netns exec` puts over /etc/hosts), so that what a process learns from its host name
# (PyTorch's gloo binds to the address of `hostname`) is what a real host would tell it.
#
#   hosts_up N          N hosts h1..hN at $net.1..$net.N (exits 77 where namespaces cannot be
#                       made; under CI=true that is a failure)
#   on I CMD...         runs CMD on host I (foreground), with TMPDIR the host's own ($out/tmp-hI)
#   start I NAME CMD... runs CMD on host I in the background; output in $out/NAME.{out,err},
#                       its pid in pid_NAME
#   addr I              host I's address
#   etcd_up I...        an etcd cluster of one member on each host I (clients on port 2379), healthy
#                       when it returns; its endpoints (hI:2379,...) in $etcd_endpoints
# Everything (processes, namespaces, hosts files, $out) goes at exit.

set -u
id=$$
net=10.$((id % 200 + 20)).$(((id / 200) % 250)).0
net=${net%.0}
sw=ddprun-sw-$id
out=$(mktemp -d /tmp/ddprun-multihost-XXXXXX)
declare -a host_pids=()
nhosts=0

source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
skip_or_fail() { skip "$1"; }

hosts_down() {
  exec 2>/dev/null  # the shell's notes on the jobs killed here
  local p
  for p in "${host_pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; done
  # The agents' guardians (sessions of their own) outlive them to kill what is left and remove
  # the job's cgroup: give them a moment (at most 3 s) before everything in the hosts is killed.
  local deadline=$((SECONDS + 3))
  guardians() { for ((i = 1; i <= nhosts; i++)); do ip netns pids "ns-$id-h$i" 2>/dev/null; done | xargs -r ps -o comm= -p 2>/dev/null | grep -c ddprun-guard; }
  while [ "$(guardians)" != 0 ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
  for ((i = 1; i <= nhosts; i++)); do
    ip netns pids "ns-$id-h$i" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip netns del "ns-$id-h$i" 2>/dev/null
    rm -rf "/etc/netns/ns-$id-h$i"
  done
  ip netns del "$sw" 2>/dev/null
  [ -n "${keep_out:-}" ] || rm -rf "$out"
}
trap hosts_down EXIT

addr() { echo "$net.$1"; }

etcd_up() {
  command -v etcd >/dev/null && command -v etcdctl >/dev/null ||
    skip_or_fail "etcd and etcdctl are needed (scripts/setup.sh installs etcd-server and etcd-client)"
  local cluster="" i
  etcd_endpoints=""
  for i in "$@"; do
    cluster+="${cluster:+,}e$i=http://$(addr "$i"):2380"
    etcd_endpoints+="${etcd_endpoints:+,}h$i:2379"
  done
  for i in "$@"; do
    start "$i" "etcd$i" etcd --name "e$i" --data-dir "$out/etcd$i" --listen-client-urls "http://$(addr "$i"):2379" \
      --advertise-client-urls "http://$(addr "$i"):2379" --listen-peer-urls "http://$(addr "$i"):2380" \
      --initial-advertise-peer-urls "http://$(addr "$i"):2380" --initial-cluster "$cluster" \
      --initial-cluster-state new --heartbeat-interval 50 --election-timeout 500 --log-level error
  done
  on "$1" /bin/sh -c "for t in \$(seq 200); do ETCDCTL_API=3 etcdctl --endpoints=$etcd_endpoints \
    endpoint health >/dev/null 2>&1 && exit 0; sleep 0.05; done; exit 1" ||
    { echo "FAILED: etcd did not come up"; cat "$out"/etcd*.err; exit 1; }
}

hosts_up() {
  nhosts=$1
  [ "$(id -u)" -eq 0 ] || skip_or_fail "multi-host tests need root (network namespaces)"
  command -v ip >/dev/null && command -v unshare >/dev/null || skip_or_fail "iproute2 and util-linux are needed"
  # Names with this shell's pid that exist are a killed test's, whose pid this one reuses (no
  # live process has it): gone first.
  local stale
  for stale in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^(ddprun-sw-$id|ns-$id-h[0-9]+)$"); do
    ip netns del "$stale" 2>/dev/null
  done
  rm -rf /etc/netns/ns-"$id"-h*
  ip netns add "$sw" 2>/dev/null || skip_or_fail "cannot create network namespaces here"
  ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up || skip_or_fail "cannot make a bridge"
  local hosts="127.0.0.1 localhost"$'\n'
  for ((i = 1; i <= nhosts; i++)); do hosts+="$(addr "$i") h$i"$'\n'; done
  for ((i = 1; i <= nhosts; i++)); do
    local ns="ns-$id-h$i"
    ip netns add "$ns" || skip_or_fail "cannot create network namespace $ns"
    ip link add "h$i-$id" netns "$ns" type veth peer name "p$i-$id" netns "$sw" || skip_or_fail "veth refused"
    ip -n "$sw" link set "p$i-$id" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(addr "$i")/24" dev "h$i-$id"
    ip -n "$ns" link set "h$i-$id" up
    mkdir -p "/etc/netns/$ns"
    printf '%s' "$hosts" >"/etc/netns/$ns/hosts"
    mkdir -p -m 1777 "$out/tmp-h$i"
  done
}

on() {
  local i=$1
  shift
  # Its own TMPDIR too, as its own /tmp: what a host killed whole leaves there goes with $out.
  ip netns exec "ns-$id-h$i" unshare --uts -- env TMPDIR="$out/tmp-h$i" /bin/sh -c 'hostname "$0" && exec "$@"' "h$i" "$@"
}

start() {
  local i=$1 name=$2
  shift 2
  setsid bash -c 'on_host "$@"' bash "$i" "$@" >"$out/$name.out" 2>"$out/$name.err" &
  local pid=$!
  host_pids+=("$pid")
  printf -v "pid_$name" '%s' "$pid"
}
on_host() {
  local i=$1
  shift
  on "$i" "$@"
}
export -f on on_host
export id out

# Waits (bounded, `secs`) until FILE has a line matching PATTERN.
wait_line() {
  local file=$1 pattern=$2 secs=${3:-60} t=0
  while ! grep -qE "$pattern" "$file" 2>/dev/null; do
    ((t++ >= secs * 20)) && return 1
    sleep 0.05
  done
}
