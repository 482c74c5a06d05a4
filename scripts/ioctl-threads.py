#!/usr/bin/env python3
"""What a kvfs.Client call on one thread leaves to the process's other threads.

A loader thread makes LOAD_BLOCKS calls of --blocks blocks (inline: one
16 KiB ioctl buffer each, up to BLOCKS_INLINE_TAGGED_MAX blocks) into an
HND target in host memory, as kvfs.hf's layer-by-layer loader does while
the model's forward runs on the main thread; the main thread meanwhile
runs a pure-Python loop, as a forward launching kernels does. Reported:
the main loop's rate alone and during the loads (and their ratio), and
the loads made, for Client.ioctl as it is (ioctl(2) through ctypes, the
GIL released) and, in the same run, for fcntl.ioctl (which holds the GIL
through calls whose buffer is over 1,024 bytes).

    scripts/ioctl-threads.py MOUNT [--blocks 128] [--seconds 2] [--rounds 3]
    scripts/measure.sh python-threads
"""

import argparse
import fcntl
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import kvfs  # noqa: E402


def fcntl_ioctl(self, cmd, buf, op="ioctl"):
    return fcntl.ioctl(self._fd, cmd, 0) if buf is None else fcntl.ioctl(self._fd, cmd, buf, True)


def spin(seconds):
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n / seconds


def measure(c, target, entries, seconds):
    alone = spin(seconds)
    stop, loads = threading.Event(), [0]

    def loader():
        while not stop.is_set():
            c.load_blocks(target, entries)
            loads[0] += 1

    t = threading.Thread(target=loader)
    t.start()
    during = spin(seconds)
    stop.set()
    t.join()
    return alone, during, loads[0] / seconds


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mount")
    p.add_argument("--blocks", type=int, default=128)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    c = kvfs.Client(a.mount)
    i = c.info()
    tensor = a.blocks * i.block_tokens * i.kv_heads * i.row_bytes
    buf = c.create_host_buffer(2 * i.layers * tensor)
    t = c.hnd_target(a.blocks, [(buf.id, j * tensor) for j in range(2 * i.layers)])
    tid = c.register_target(t)
    entries = [kvfs.BlockEntry(0x6b766673000 + b, b) for b in range(a.blocks)]
    st = c.store_blocks((t, tid), entries)
    if st.count(kvfs.OK) != a.blocks:
        sys.exit("ioctl-threads: %d of %d blocks stored" % (st.count(kvfs.OK), a.blocks))
    mb = 2 * i.layers * tensor / 1e6
    print("| client ioctl | main loop alone, M/s | during loads, M/s | ratio | loads/s (%.0f MB each) |" % mb)
    print("|---|---|---|---|---|")
    own = kvfs.Client.ioctl
    for _ in range(a.rounds):
        for name, fn in (("Client.ioctl (ctypes)", own), ("fcntl.ioctl", fcntl_ioctl)):
            kvfs.Client.ioctl = fn
            try:
                alone, during, rate = measure(c, (t, tid), entries, a.seconds)
            finally:
                kvfs.Client.ioctl = own
            print("| %s | %.2f | %.2f | %.2f | %.1f |" % (name, alone / 1e6, during / 1e6, during / alone, rate))
    c.unregister_target(tid)
    c.close()


if __name__ == "__main__":
    main()
