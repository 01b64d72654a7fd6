# What the multi-host DDP tests check of their workers (sourced after hosts.sh): the agent of a
# host, and that every rank ended with the parameters of one process training alone.
# ddp_worker.py prints "checksum SUM ... world=N" at its end; rank 0 then trains alone, in the
# same interpreter, and prints "reference SUM ... steps=STEPS".

# Every checksum line in FILES: the same, and equal to the reference of STEPS steps that rank 0
# printed (1e-4).
same_result() {
  /usr/bin/python3 - "$@" <<'EOF'
import re, sys
steps, text = sys.argv[1], "".join(open(f).read() for f in sys.argv[2:])
sums = [float(s) for s in re.findall(r"checksum (\S+) \S+ world=\d+", text)]
refs = sorted(set(float(s) for s in re.findall(r"reference (\S+) \S+ steps=" + steps + r"\b", text)))
ok = bool(sums) and len(refs) == 1 and all(abs(s - refs[0]) < 1e-4 for s in sums) and len(set(sums)) == 1
print("  checksums %s vs one process %s: %s" % (sorted(set(sums)), refs, "equal" if ok else "DIFFERENT"))
sys.exit(0 if ok else 1)
EOF
}

agent_pid() {  # the ddprun agent on host I
  ip netns pids "ns-$id-h$1" | xargs -r ps -o pid=,comm= -p | awk '$2 == "ddprun" {print $1}'
}

