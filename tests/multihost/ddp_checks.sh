# What the multi-host DDP tests check of their workers (sourced after hosts.sh): the agent of a
# host, and that every rank ended with the parameters of one process training alone.
# ddp_worker.py prints "checksum SUM ... world=N" at its end; --reference trains alone.

reference() { DDP_STEPS=$1 /usr/bin/python3 "$here/ddp_worker.py" --reference | awk '{print $2}'; }

# Every checksum line in FILES: the same, and equal to one process's training of STEPS (1e-4).
same_result() {
  local steps=$1
  shift
  /usr/bin/python3 - "$(reference "$steps")" "$@" <<'EOF'
import re, sys
ref, files = float(sys.argv[1]), sys.argv[2:]
sums = [float(m.group(1)) for f in files for m in re.finditer(r"checksum (\S+) \S+ world=(\d+)", open(f).read())]
ok = bool(sums) and all(abs(s - ref) < 1e-4 for s in sums) and len(set(sums)) == 1
print("  checksums %s vs one process %.6f: %s" % (sorted(set(sums)), ref, "equal" if ok else "DIFFERENT"))
sys.exit(0 if ok else 1)
EOF
}

agent_pid() {  # the ddprun agent on host I
  ip netns pids "ns-$id-h$1" | xargs -r ps -o pid=,comm= -p | awk '$2 == "ddprun" {print $1}'
}

