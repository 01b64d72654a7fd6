"""A worker that prints "tick t=<wall time> host=<h> world=<WORLD_SIZE>" every 0.1 s for
TICK_SECONDS (default 12), then exits 0: a stand-in for a job writing to shared storage, whose
lines show when it ran."""
import os
import socket
import time

end = time.time() + float(os.environ.get("TICK_SECONDS", "12"))
host, world = socket.gethostname(), os.environ["WORLD_SIZE"]
while time.time() < end:
    print("tick t=%.3f host=%s world=%s" % (time.time(), host, world), flush=True)
    time.sleep(0.1)
