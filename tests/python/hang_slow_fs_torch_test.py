#!/usr/bin/python3
"""A rank held up by a slow file system (README: Hangs), on a real PyTorch gloo DDP job
(hang_worker.py) and a real FUSE mount (slow_fuse.py: 10 ms a 4 KiB write request, as a loaded
network or cloud mount): rank 0 writes 6 MB in one write() (about 15 s) while rank 1 waits in a
barrier. Under --hang_floor=3 that silence is reported; the report must name rank 0 (neither its
Python nor its native stack can be read: the stack signal turns its wait into uninterruptible
sleep), and must leave it as it was: once the write ends the job goes on and ends 0. (eu-stack,
which ddprun ran when its own reader read no main thread, attaches with a SIGSTOP that such a
thread takes only when it wakes: the worker then stayed stopped for good and was killed at
--hang_stop.)
Runs in a mount namespace of its own (the mount dies with it); needs root and /dev/fuse (exits 77,
skipped, without them; a failure under CI=true). Usage: hang_slow_fs_torch_test.py --ddprun PATH
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import need_torch, require, skip  # noqa: E402

need_torch()
from hang_torch_test import Job  # noqa: E402

CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x00020000, 0x4000, 0x40000


def own_mount_namespace():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0 or libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        skip(f"no mount namespace of its own: {os.strerror(ctypes.get_errno())}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    args = ap.parse_args()
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        skip("a FUSE mount needs root and /dev/fuse")
    own_mount_namespace()  # the mount goes with this process
    with tempfile.TemporaryDirectory() as tmp:
        mnt = os.path.join(tmp, "mnt")
        os.mkdir(mnt)
        server = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_fuse.py"),
                                   mnt, "0.01"], stdout=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()
            if line.strip() != "mounted":
                skip(f"the FUSE server did not mount ({line.strip() or server.wait()})")
            # --stack_dump_timeout=3: the stack signal's answer waited for 3 s, far less than the
            # write's 15 s (the report comes about 4 s into it).
            job = Job(args.ddprun, tmp, "slow_fs", ["--nproc_per_node=2", "--hang_floor=3", "--hang_stop=60",
                                                    "--stack_dump_timeout=3"],
                      ["--steps", "30", "--one_write_at", "5", "--one_write_mb", "6", "--write_dir", mnt])
            rc = job.wait(150)
        finally:
            subprocess.run(["umount", "-l", mnt], check=False)
            server.kill()
            server.wait()
        require(rc == 0, "the job ends 0 once the write is done" + ("" if rc == 0 else f" (got {rc}; {job.text[-2500:]})"))
        reports = job.event("hang_reported")
        require(len(reports) == 1 and reports[0]["blamed"] == [0],
                f"one report, blaming rank 0 ({[(r['blamed'], r['verdict']) for r in reports]})")
        verdict = reports[0]["verdict"]
        require("could not be read (no stack: the stack signal wrote nothing within 3 s)" in verdict and
                "held in the kernel" in verdict and "rank 1 waits for it" in verdict,
                f"the verdict says rank 0 is held in the kernel and rank 1 waits for it: {verdict}")
        require("one write done" in job.text and "rank 0 made progress again" in job.text,
                "the write ends and ddprun says rank 0 made progress again: the report left it running")
    print("all slow file system checks passed")


if __name__ == "__main__":
    main()
