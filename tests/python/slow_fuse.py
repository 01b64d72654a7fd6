#!/usr/bin/python3
"""A slow network file system for the tests: a minimal FUSE server, on /dev/fuse itself (no
libfuse), that takes each write request (4 KiB) after DELAY seconds, as a loaded cloud or network
mount does, and holds its files' sizes only. One flat directory; no reads.
Usage: slow_fuse.py MOUNTPOINT DELAY (as root; prints "mounted" once it serves; ends when
unmounted, or with its parent)."""
import ctypes
import errno
import os
import struct
import sys
import time

INIT, LOOKUP, FORGET, GETATTR, SETATTR, OPEN, WRITE, RELEASE, FSYNC, FLUSH = 26, 1, 2, 3, 4, 14, 16, 18, 20, 25
OPENDIR, READDIR, RELEASEDIR, ACCESS, CREATE, BATCH_FORGET = 27, 28, 29, 34, 35, 42


def main():
    mnt, delay = sys.argv[1], float(sys.argv[2])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: ends with the test, whatever ends it
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"ddprun-slow-fuse", mnt.encode(), b"fuse", 0, opts) != 0:
        sys.exit("slow_fuse: mount: " + os.strerror(ctypes.get_errno()))
    print("mounted", flush=True)
    sizes, names, nxt = {}, {}, 2

    def attr(ino, mode, size):
        now = int(time.time())
        return struct.pack("<QQQQQQIIIIIIIIII", ino, size, (size + 511) // 512, now, now, now, 0, 0, 0, mode, 1,
                           0, 0, 0, 4096, 0)

    def entry(ino, size):
        return struct.pack("<QQQQII", ino, 0, 1, 1, 0, 0) + attr(ino, 0o100644, size)

    def reply(unique, err=0, data=b""):
        os.write(fd, struct.pack("<IiQ", 16 + len(data), -err, unique) + data)

    while True:
        try:
            buf = os.read(fd, (1 << 20) + 8192)
        except OSError as e:
            if e.errno == errno.ENODEV:  # unmounted
                return
            if e.errno in (errno.EINTR, errno.ENOENT, errno.EAGAIN):
                continue
            raise
        length, op, unique, node = struct.unpack_from("<IIQQ", buf)
        body = buf[40:length]
        if op == INIT:  # protocol 7.31, max_write 128 KiB
            reply(unique, 0, struct.pack("<IIIIHHIIHHI", 7, 31, 0, 0, 16, 12, 128 << 10, 1, 0, 0, 0) + b"\0" * 28)
        elif op == GETATTR:
            if node == 1:
                reply(unique, 0, struct.pack("<QII", 1, 0, 0) + attr(1, 0o40755, 0))
            elif node in sizes:
                reply(unique, 0, struct.pack("<QII", 0, 0, 0) + attr(node, 0o100644, sizes[node]))
            else:
                reply(unique, errno.ENOENT)
        elif op == LOOKUP:
            name = body.split(b"\0")[0]
            if name in names:
                reply(unique, 0, entry(names[name], sizes[names[name]]))
            else:
                reply(unique, errno.ENOENT)
        elif op == CREATE:
            name = body[16:].split(b"\0")[0]
            node, nxt = nxt, nxt + 1
            sizes[node], names[name] = 0, node
            reply(unique, 0, entry(node, 0) + struct.pack("<QII", node, 0, 0))
        elif op in (OPEN, OPENDIR):
            reply(unique, 0, struct.pack("<QII", node, 0, 0))
        elif op == WRITE:
            _fh, offset, size = struct.unpack_from("<QQI", body)
            time.sleep(delay)
            sizes[node] = max(sizes.get(node, 0), offset + size)
            reply(unique, 0, struct.pack("<II", size, 0))
        elif op == SETATTR:
            valid, _, _fh, size = struct.unpack_from("<IIQQ", body)
            if valid & 8:  # FATTR_SIZE
                sizes[node] = size
            reply(unique, 0, struct.pack("<QII", 0, 0, 0) + attr(node, 0o40755 if node == 1 else 0o100644,
                                                                   sizes.get(node, 0)))
        elif op in (RELEASE, FLUSH, RELEASEDIR, ACCESS, FSYNC):
            reply(unique)
        elif op == READDIR:
            reply(unique, 0, b"")
        elif op in (FORGET, BATCH_FORGET):  # no reply
            pass
        else:
            reply(unique, errno.ENOSYS)


if __name__ == "__main__":
    main()
