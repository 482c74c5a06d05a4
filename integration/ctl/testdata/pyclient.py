"""Python client processes for integration/ctl (hardening_test.go).

pyclient.py loadloop MOUNT BLOCKS   load whole blocks (hex, comma separated)
                                    into host buffers until killed; prints
                                    "ready" after the first round
pyclient.py closes MOUNT            Client.close() closes owned buffers;
                                    nothing appears in /dev/shm
"""
import os
import sys

import kvfs
from kvfs import abi


def shm_mine():
    tag = "-%d-" % os.getpid()
    return [n for n in os.listdir("/dev/shm") if tag in n]


def entries(c, blocks, buf):
    i = c.info()
    es = []
    for b in blocks:
        for layer in range(i.layers):
            for kind in (0, 1):
                for head in range(i.kv_heads):
                    es.append(kvfs.Entry(b, layer, head, kind, buf.id, len(es) * i.group_bytes))
    return es


def loadloop(mnt, blocks):
    c = kvfs.Client(mnt)
    blocks = [int(b, 16) for b in blocks.split(",")]
    per = len(blocks) * c.info().groups_per_block * c.info().group_bytes
    a = c.create_host_buffer(per)
    # The fallback of a daemon without REGISTER_FD: a /dev/shm file,
    # unlinked once registered.
    c._info = c._info._replace(caps=c._info.caps & ~abi.CAP_REGISTER_FD)
    b = c.create_host_buffer(per)
    ea, eb = entries(c, blocks, a), entries(c, blocks, b)
    n = 0
    while True:
        for es in (ea, eb):
            st = c.load(es)
            if st != [kvfs.OK] * len(es):
                print("load:", st, flush=True)
                sys.exit(1)
        if n == 0:
            print("ready", flush=True)
        n += 1


def closes(mnt):
    before = shm_mine()
    with kvfs.Client(mnt) as c:
        buf = c.create_host_buffer(64 << 20)  # the README's example
        assert buf.mm is not None and buf.pinned is False or buf.pinned is True
        assert shm_mine() == before, shm_mine()
        c._info = c._info._replace(caps=c._info.caps & ~abi.CAP_REGISTER_FD)
        old = c.create_host_buffer(1 << 20)
        assert shm_mine() == before, "fallback buffer left its file: %r" % shm_mine()
        ids = (buf.id, old.id)
    assert buf.mm is None and old.mm is None, "Client.close() left buffers mapped"
    assert shm_mine() == before
    # Closing a buffer after the client is harmless.
    buf.close()
    print("closed buffers", ids)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "loadloop":
        loadloop(sys.argv[2], sys.argv[3])
    elif mode == "closes":
        closes(sys.argv[2])
    else:
        sys.exit("unknown mode " + mode)
