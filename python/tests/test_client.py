"""Tests of the Python kvfs client through a real mount.

Run by integration/ctl (go test) with KVFS_MOUNT set to a mounted kvfs and
PYTHONPATH pointing at python/. KVFS_CORRUPT names one damaged group as
"block layer head kind" (hex block). Pure stdlib; numpy tests skip without it.
"""

import concurrent.futures
import errno
import mmap
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import kvfs
import own_daemon
from kvfs import abi

MOUNT = os.environ.get("KVFS_MOUNT")
GUARD = 0xA5


def rand_bytes(rng, n):
    return bytes(rng.getrandbits(8) for _ in range(n)) if n < 64 else rng.randbytes(n)


@unittest.skipUnless(MOUNT, "KVFS_MOUNT is not set")
class ClientTest(unittest.TestCase):
    def setUp(self):
        self.c = kvfs.Client(MOUNT)
        self.info = self.c.info()
        self.gb = self.info.group_bytes
        self.rng = random.Random(1234)
        self.files = []

    def tearDown(self):
        self.c.close()
        for p in self.files:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    # helpers

    def cp(self, block, layer, head, kind, data):
        p = self.c.group_path(MOUNT, block, layer, head, kind)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)

    def cat(self, block, layer, head, kind):
        with open(self.c.group_path(MOUNT, block, layer, head, kind), "rb") as f:
            return f.read()

    def keys(self, block):
        i = self.info
        return [(block, l, h, k) for l in range(i.layers) for k in (0, 1) for h in range(i.kv_heads)]

    def guarded(self, n, guard=4096):
        """A /dev/shm file of n bytes + guard bytes, mapped here; registered for n bytes."""
        path = "/dev/shm/kvfs-py-%d-%x" % (os.getpid(), self.rng.getrandbits(48))
        self.files.append(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, n + guard)
        mm = mmap.mmap(fd, n + guard)
        os.close(fd)
        mm[n:] = bytes([GUARD]) * guard
        bid = self.c.register_host(path, n)
        self.addCleanup(mm.close)
        return path, mm, bid

    def assert_guard(self, mm, n):
        self.assertEqual(mm[n:], bytes([GUARD]) * (len(mm) - n), "guard bytes changed")

    # tests

    def test_info(self):
        i = self.info
        self.assertEqual(i.abi, kvfs.ABI_VERSION)
        self.assertEqual(i.size, abi.INFO.size)
        self.assertEqual(i.group_bytes, i.block_tokens * i.row_bytes)
        self.assertEqual(i.row_bytes, i.head_dim * i.dtype_bytes)
        self.assertEqual(i.max_entries, abi.BATCH_MAX)
        self.assertTrue(i.caps & abi.CAP_HOST and i.caps & abi.CAP_STORE)
        self.assertEqual(i.engine, "mem")

    def test_roundtrip_through_files(self):
        blocks = [0x7100, 0x7101]
        want = {}
        for b in blocks:
            for key in self.keys(b):
                want[key] = rand_bytes(self.rng, self.gb)
                self.cp(*key, want[key])
        keys = list(want)
        order = list(range(len(keys)))
        self.rng.shuffle(order)
        path, mm, bid = self.guarded(len(keys) * self.gb)
        entries = [kvfs.Entry(*k, buffer=bid, offset=order[i] * self.gb) for i, k in enumerate(keys)]
        self.assertEqual(self.c.load(entries), [kvfs.OK] * len(keys))
        view = memoryview(mm)
        for i, k in enumerate(keys):
            self.assertEqual(view[order[i] * self.gb:(order[i] + 1) * self.gb], want[k], k)
        view.release()
        self.assert_guard(mm, len(keys) * self.gb)
        # STORE under new blocks, read back with the files.
        entries = [e._replace(block=e.block + 0x10) for e in entries]
        self.assertEqual(self.c.store(entries), [kvfs.OK] * len(keys))
        for i, k in enumerate(keys):
            self.assertEqual(self.cat(k[0] + 0x10, *k[1:]), want[k])

    def test_many_entries(self):
        # 40 blocks: 640 groups, more than one ioctl's worth, stored and loaded.
        keys = [k for b in range(40) for k in self.keys(0x7200 + b)]
        with self.c.create_host_buffer(len(keys) * self.gb) as buf:
            data = rand_bytes(self.rng, len(keys) * self.gb)
            buf.view[:] = data
            entries = [kvfs.Entry(*k, buffer=buf.id, offset=i * self.gb) for i, k in enumerate(keys)]
            self.assertEqual(self.c.store(entries), [kvfs.OK] * len(keys))
            buf.view[:] = bytes(len(data))
            self.assertEqual(self.c.load(entries), [kvfs.OK] * len(keys))
            self.assertEqual(buf.view.tobytes(), data)
            k = keys[123]
            self.assertEqual(self.cat(*k), data[123 * self.gb:124 * self.gb])

    def test_pitch(self):
        i = self.info
        rows, rb, heads = i.block_tokens, i.row_bytes, i.kv_heads
        pitch = heads * rb + 32
        pages = 3
        size = pages * rows * pitch
        path, mm, bid = self.guarded(size)
        mm[:size] = b"\xcc" * size
        want = bytearray(b"\xcc" * size)
        entries = []
        for p in range(pages):
            for h in range(heads):
                key = (0x7300 + p, 1, h, "K")
                d = rand_bytes(self.rng, self.gb)
                self.cp(*key, d)
                off = p * rows * pitch + h * rb
                entries.append(kvfs.Entry(*key, buffer=bid, offset=off, pitch=pitch))
                for r in range(rows):
                    want[off + r * pitch:off + r * pitch + rb] = d[r * rb:(r + 1) * rb]
        self.assertEqual(self.c.load(entries), [kvfs.OK] * len(entries))
        self.assertEqual(mm[:size], bytes(want))
        self.assert_guard(mm, size)

    def test_absent_and_corrupt(self):
        spec = os.environ.get("KVFS_CORRUPT")
        if not spec:
            self.skipTest("KVFS_CORRUPT not set")
        b, l, h, k = spec.split()
        bad = (int(b, 16), int(l), int(h), k)
        with self.c.create_host_buffer(3 * self.gb) as buf:
            buf.view[:] = b"\x11" * (3 * self.gb)
            present = (bad[0], bad[1], 1 - bad[2] if self.info.kv_heads > 1 else bad[2], "V" if k == "K" else "K")
            entries = [kvfs.Entry(*bad, buffer=buf.id, offset=0),
                       kvfs.Entry(0xdeadbeef, 0, 0, "K", buf.id, self.gb),
                       kvfs.Entry(*present, buffer=buf.id, offset=2 * self.gb)]
            st = self.c.load(entries, details=True)
            self.assertEqual([s for s, _ in st], [kvfs.CORRUPT, kvfs.ABSENT, kvfs.OK])
            self.assertEqual(buf.view[:self.gb], bytes(self.gb))
            self.assertEqual(buf.view[self.gb:2 * self.gb], b"\x11" * self.gb)
            self.assertEqual(buf.view[2 * self.gb:], self.cat(*present))

    def test_hostile(self):
        path, mm, bid = self.guarded(4 * self.gb, 8192)
        mm[:4 * self.gb] = b"\x33" * (4 * self.gb)
        before = mm[:]
        other = kvfs.Client(MOUNT)
        self.addCleanup(other.close)
        obuf = other.create_host_buffer(self.gb)
        self.addCleanup(obuf.close)
        key = (0x7400, 0, 0, "K")
        self.cp(*key, rand_bytes(self.rng, self.gb))
        n = 4 * self.gb
        bad = [
            (kvfs.Entry(*key, buffer=obuf.id, offset=0), abi.BAD_BUFFER),
            (kvfs.Entry(*key, buffer=0xFFFFFFF, offset=0), abi.BAD_BUFFER),
            (kvfs.Entry(*key, buffer=bid, offset=n), abi.BAD_RANGE),
            (kvfs.Entry(*key, buffer=bid, offset=n - self.gb + 1), abi.BAD_RANGE),
            (kvfs.Entry(*key, buffer=bid, offset=2 ** 64 - 1), abi.BAD_RANGE),
            (kvfs.Entry(*key, buffer=bid, offset=2 ** 64 - self.gb), abi.BAD_RANGE),
            (kvfs.Entry(*key, buffer=bid, offset=0, pitch=2 ** 32 - 1), abi.BAD_RANGE),
            (kvfs.Entry(*key, buffer=bid, offset=0, pitch=self.info.row_bytes - 1), abi.BAD_PITCH),
            (kvfs.Entry(0x7400, self.info.layers, 0, "K", bid, 0), abi.BAD_KEY),
            (kvfs.Entry(0x7400, 0, self.info.kv_heads, "V", bid, 0), abi.BAD_KEY),
        ]
        for op in (self.c.load, self.c.store):
            st = op([e for e, _ in bad], details=True)
            self.assertEqual(st, [(kvfs.BAD_REQUEST, d) for _, d in bad])
        self.assertEqual(mm[:], before)
        # Wrong ABI version, unknown command, garbage.
        b = bytearray(abi.BATCH_SIZE)
        abi.BATCH_HDR.pack_into(b, 0, 7, 1, 0, 0)
        with self.assertRaises(kvfs.KvfsError) as cm:
            self.c.ioctl(abi.IOC_LOAD, b, "load")
        self.assertEqual(cm.exception.errno, errno.EPROTO)
        with self.assertRaises(kvfs.KvfsError) as cm:
            self.c.ioctl(abi._ioc(3, 0x10, 64), bytearray(64), "load")
        self.assertEqual(cm.exception.errno, errno.ENOTTY)
        abi.BATCH_HDR.pack_into(b, 0, 1, 600, 0, 0)
        with self.assertRaises(kvfs.KvfsError) as cm:
            self.c.ioctl(abi.IOC_LOAD, b, "load")
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        rng = random.Random(5)
        for _ in range(100):
            g = bytearray(rng.randbytes(abi.BATCH_SIZE))
            abi.BATCH_HDR.pack_into(g, 0, 1, rng.randrange(abi.BATCH_MAX + 1), 0, 0)
            for j in range(abi.BATCH_HDR.size, len(g), abi.ENTRY.size):
                if rng.random() < 0.5:
                    struct.pack_into("<I", g, j + 16, bid)
            try:
                self.c.ioctl(rng.choice([abi.IOC_LOAD, abi.IOC_STORE]), g)
            except kvfs.KvfsError:
                pass
        self.assertEqual(mm[:], before, "garbage requests touched memory")

    def test_register_rejected(self):
        path, mm, bid = self.guarded(4096, 0)
        link = path + ".link"
        os.symlink(path, link)
        self.files.append(link)
        cases = [(link, errno.ELOOP), ("/etc/passwd", errno.EPERM), ("/dev/shm/../etc/passwd", errno.EPERM),
                 (path + ".nope", errno.ENOENT)]
        with tempfile.NamedTemporaryFile() as f:
            f.write(b"\0" * 4096)
            f.flush()
            cases.append((f.name, errno.EPERM))
            for p, want in cases:
                with self.assertRaises(kvfs.KvfsError) as cm:
                    self.c.register_host(p, 0)
                self.assertEqual(cm.exception.errno, want, p)
        with self.assertRaises(kvfs.KvfsError) as cm:
            self.c.register_host(path, 8192)
        self.assertEqual(cm.exception.errno, errno.ERANGE)
        self.c.unregister(bid)
        with self.assertRaises(kvfs.KvfsError) as cm:
            self.c.unregister(bid)
        self.assertEqual(cm.exception.errno, errno.ENOENT)

    def test_numpy_view(self):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy not installed")
        key = (0x7500, 0, 0, "V")
        d = rand_bytes(self.rng, self.gb)
        self.cp(*key, d)
        with self.c.create_host_buffer(self.gb) as buf:
            self.assertEqual(self.c.load([kvfs.Entry(*key, buffer=buf.id, offset=0)]), [kvfs.OK])
            a = buf.numpy("uint16", (self.info.block_tokens, self.info.head_dim))
            self.assertEqual(a.tobytes(), d)
            del a

    def test_blocks(self):
        """Minor 2: whole blocks written with cp load into NHD, HND and HF
        targets where each layout's tensor indexing says, guard bytes
        elsewhere; a shard target takes only its heads; stores read back
        through the files; more than 509 entries go through an entry array."""
        i = self.info
        self.assertTrue(i.caps & abi.CAP_BLOCKS)
        self.assertGreaterEqual(i.abi_minor, abi.ABI_MINOR)  # a newer daemon serves older clients
        self.assertEqual(i.max_block_entries, abi.BLOCKS_MAX)
        rb, bt, H, L = i.row_bytes, i.block_tokens, i.kv_heads, i.layers
        data = {}
        for b in (0x7b00, 0x7b01):
            for key in self.keys(b):
                d = rand_bytes(self.rng, self.gb)
                self.cp(*key, d)
                data[key] = d
        nb = 3
        for name in ("nhd", "hnd", "hf"):
            for hf, hc in ((0, H), (H - 1, 1)):
                tensor = nb * bt * hc * rb
                gap = 512
                size = gap + 2 * L * (tensor + gap)
                buf = self.c.create_host_buffer(size)
                buf.view[:] = bytes([GUARD]) * size
                regions = [(buf.id, gap + j * (tensor + gap)) for j in range(2 * L)]
                if name == "nhd":
                    t = self.c.nhd_target(nb, regions, head_first=hf, heads=hc)
                    off = lambda c, r, h: ((c * bt + r) * hc + h) * rb  # noqa: E731
                elif name == "hnd":
                    t = self.c.hnd_target(nb, regions, head_first=hf, heads=hc)
                    off = lambda c, r, h: ((c * hc + h) * bt + r) * rb  # noqa: E731
                else:
                    t = self.c.hf_target(nb * bt, regions, head_first=hf, heads=hc)
                    off = lambda c, r, h: (h * nb * bt + c * bt + r) * rb  # noqa: E731
                self.assertEqual(kvfs.Client.region_bytes(i, t), tensor)
                tid = self.c.register_target(t)
                res = self.c.load_blocks((t, tid), [kvfs.BlockEntry(0x7b01, 2), kvfs.BlockEntry(0x7b00, 0),
                                                    kvfs.BlockEntry(0x7b99, 1)], details=True)
                self.assertEqual(res, [(kvfs.OK, 0, L * hc * 2), (kvfs.OK, 0, L * hc * 2), (kvfs.ABSENT, 0, 0)])
                want = bytearray([GUARD]) * size
                for b, c in ((0x7b01, 2), (0x7b00, 0)):
                    for (blk, l, h, k) in self.keys(b):
                        if not hf <= h < hf + hc:
                            continue
                        d = data[(blk, l, h, k)]
                        for r in range(bt):
                            o = regions[2 * l + k][1] + off(c, r, h - hf)
                            want[o:o + rb] = d[r * rb:(r + 1) * rb]
                self.assertTrue(buf.view == want, "%s heads %d+%d" % (name, hf, hc))
                # A head outside the shard is refused, nothing touched.
                if hc == 1:
                    res = self.c.load_blocks(tid, [kvfs.BlockEntry(0x7b00, 1, 0, L, 0, 1)], details=True)
                    self.assertEqual(res, [(kvfs.BAD_REQUEST, kvfs.BAD_KEY, 0)])
                    self.assertTrue(buf.view == want)
                # Store cache block 2 as a new block; it reads back as 0x7b01.
                self.assertEqual(self.c.store_blocks((t, tid), [kvfs.BlockEntry(0x7c00, 2)]), [kvfs.OK])
                for (blk, l, h, k) in self.keys(0x7c00):
                    if hf <= h < hf + hc:
                        self.assertEqual(self.cat(blk, l, h, k), data[(0x7b01, l, h, k)])
                self.c.unregister_target(tid)
                buf.close()
                for key in self.keys(0x7c00):
                    p = self.c.group_path(MOUNT, *key)
                    if os.path.exists(p):
                        os.unlink(p)
        # More than BLOCKS_INLINE_MAX entries: an entry array.
        n = abi.BLOCKS_INLINE_MAX + 3
        tensor = n * bt * H * rb
        buf = self.c.create_host_buffer(2 * L * tensor)
        t = self.c.hnd_target(n, [(buf.id, j * tensor) for j in range(2 * L)])
        tid = self.c.register_target(t)
        res = self.c.load_blocks((t, tid), [kvfs.BlockEntry(0x7b00 + (c % 2), c) for c in range(n)])
        self.assertEqual(res, [kvfs.OK] * n)
        l, k, h, c = L - 1, 1, H - 1, n - 1
        o = (2 * l + k) * tensor + ((c * H + h) * bt) * rb
        self.assertEqual(bytes(buf.view[o:o + self.gb]), data[(0x7b01, l, h, k)])
        # close() drops the target before its buffer.

    def test_prefix(self):
        """Minor 3: tagged stores record tag and parent (the block directory's
        xattrs); tagged loads serve a block only under its tag, through
        the inline form and an entry array; LOOKUP answers present, absent
        and tag mismatch, and the leading run, inline and through an array."""
        i = self.info
        self.assertTrue(i.caps & abi.CAP_PREFIX)
        rb, bt, H, L = i.row_bytes, i.block_tokens, i.kv_heads, i.layers
        n = abi.BLOCKS_INLINE_TAGGED_MAX + 6
        tensor = n * bt * H * rb
        tile = H * bt * rb  # one cache block of one (layer, kind) region
        buf = self.c.create_host_buffer(2 * L * tensor)
        regions = [(buf.id, j * tensor) for j in range(2 * L)]
        t = self.c.hnd_target(n, regions)
        tid = self.c.register_target(t)
        ids = [0x7d00 + b for b in range(4)]
        tags = [bytes([b + 1]) * 16 for b in range(4)]
        for _, off in regions:
            buf.view[off:off + 4 * tile] = rand_bytes(self.rng, 4 * tile)
        want = {(r, b): bytes(buf.view[off + b * tile:off + (b + 1) * tile])
                for r, (_, off) in enumerate(regions) for b in range(4)}
        es = [kvfs.BlockEntry(ids[b], b, tag=tags[b], parent=ids[b - 1] if b else None) for b in range(4)]
        self.assertEqual(self.c.store_blocks((t, tid), es), [kvfs.OK] * 4)
        d = os.path.dirname(os.path.dirname(self.c.group_path(MOUNT, ids[2], 0, 0, 0)))
        self.assertEqual(os.getxattr(d, "user.kvfs.tag").decode(), tags[2].hex())
        self.assertEqual(os.getxattr(d, "user.kvfs.parent").decode(), "%016x" % ids[1])
        # n > 254 tagged entries: an entry array; the last expects another tag
        buf.view[:] = bytes(len(buf.view))
        es = [kvfs.BlockEntry(ids[c % 4], c, tag=tags[c % 4]) for c in range(n - 1)]
        es.append(kvfs.BlockEntry(ids[1], n - 1, tag=tags[2]))
        res = self.c.load_blocks((t, tid), es, details=True)
        self.assertEqual(res[:-1], [(kvfs.OK, 0, 2 * L * H)] * (n - 1))
        self.assertEqual(res[-1], (kvfs.ABSENT, kvfs.TAG_MISMATCH, 0))
        for c in (0, 5, n - 2):
            for r, (_, off) in enumerate(regions):
                self.assertEqual(bytes(buf.view[off + c * tile:off + (c + 1) * tile]), want[(r, c % 4)])
        for _, off in regions:  # the mismatched block's bytes never reached the cache
            self.assertEqual(bytes(buf.view[off + (n - 1) * tile:off + n * tile]), bytes(tile))
        # inline: a wrong tag, and a zero tag (unchecked)
        res = self.c.load_blocks((t, tid), [kvfs.BlockEntry(ids[0], 0, tag=bytes(16)),
                                            kvfs.BlockEntry(ids[3], 1, tag=b"x" * 16)], details=True)
        self.assertEqual([r[:2] for r in res], [(kvfs.OK, 0), (kvfs.ABSENT, kvfs.TAG_MISMATCH)])
        # the same entries as a BlockArray (packed once): every layer, then one layer per call
        ba = kvfs.BlockArray([e.block for e in es], range(n), 0, L, 0, H, tags=[e.tag for e in es])
        buf.view[:] = bytes(len(buf.view))
        self.assertEqual(self.c.load_blocks(tid, ba, details=True),
                         [(kvfs.OK, 0, 2 * L * H)] * (n - 1) + [(kvfs.ABSENT, kvfs.TAG_MISMATCH, 0)])
        for r, (_, off) in enumerate(regions):
            self.assertEqual(bytes(buf.view[off + 5 * tile:off + 6 * tile]), want[(r, 1)])
        buf.view[:] = bytes(len(buf.view))
        for l in range(L):
            self.assertEqual(self.c.load_blocks(tid, ba.set_layers(l, 1), details=True),
                             [(kvfs.OK, 0, 2 * H)] * (n - 1) + [(kvfs.ABSENT, kvfs.TAG_MISMATCH, 0)])
            for r, (_, off) in enumerate(regions):  # layer l's regions are in, later layers' untouched
                got = bytes(buf.view[off + (n - 2) * tile:off + (n - 1) * tile])
                self.assertEqual(got, want[(r, (n - 2) % 4)] if r // 2 <= l else bytes(tile), (l, r))
        # one layer per call from a thread each, at once (each call holds an
        # entry array of its own: one held here does not hold them up)
        buf.view[:] = bytes(len(buf.view))
        with self.c._entry_array() as held:
            with concurrent.futures.ThreadPoolExecutor(L) as ex:
                got = list(ex.map(lambda l: self.c.load_blocks(tid, ba.copy().set_layers(l, 1)), range(L)))
            self.assertNotIn(held, self.c._free_arrays)
        self.assertIn(held, self.c._free_arrays)
        self.assertEqual(got, [[kvfs.OK] * (n - 1) + [kvfs.ABSENT]] * L)
        self.assertEqual(ba.layer_first, L - 1)  # the copies' layers changed apart from ba's
        for r, (_, off) in enumerate(regions):
            for c in (0, n - 2):
                self.assertEqual(bytes(buf.view[off + c * tile:off + (c + 1) * tile]), want[(r, c % 4)], (r, c))
        small = kvfs.BlockArray(ids[:2], [0, 1], 0, L, 0, H, tags=[tags[0], b"x" * 16])  # inline
        self.assertEqual([r[:2] for r in self.c.load_blocks(tid, small, details=True)],
                         [(kvfs.OK, 0), (kvfs.ABSENT, kvfs.TAG_MISMATCH)])
        with self.assertRaises(ValueError):
            kvfs.BlockArray(ids[:2], [0], 0, L, 0, H)
        with self.assertRaises(ValueError):
            kvfs.BlockArray(ids[:1], [0], 0, L, 0, H, tags=[b"short"])
        self.c.unregister_target(tid)
        buf.close()
        for m in (4, abi.LOOKUP_INLINE_MAX + 91):  # inline, then an array
            pairs = [(ids[c % 4], tags[c % 4]) for c in range(m)]
            r = self.c.lookup(pairs)
            self.assertEqual((r.run, r.present, r.absent, r.mismatch), (m, m, 0, 0))
            pairs[m - 1] = (ids[0], tags[1])
            pairs[2] = (0x7dff, None)
            r = self.c.lookup(pairs)
            self.assertEqual((r.run, r.present, r.absent, r.mismatch), (2, m - 2, 1, 1))
            self.assertEqual((r.statuses[2], r.statuses[m - 1]), (kvfs.LOOKUP_ABSENT, kvfs.LOOKUP_TAG_MISMATCH))
        self.assertEqual(self.c.lookup([ids[3]]).run, 1)  # no tag: any
        self.assertEqual(self.c.lookup([]).run, 0)
        for b in ids:
            for key in self.keys(b):
                os.unlink(self.c.group_path(MOUNT, *key))


def _task_state(pid, task):
    """A thread's state letter (/proc/PID/task/TID/stat; "T" stopped); "T"
    for a thread gone meanwhile."""
    try:
        with open("/proc/%d/task/%s/stat" % (pid, task)) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "T"


@unittest.skipUnless(own_daemon.BIN, "KVFS_BIN is not set")
class ReleasesGILTest(unittest.TestCase):
    """A thread in a control ioctl leaves the other threads of the process
    running (a model's forward while a loader thread loads): the GIL is
    released for the call, inline calls too, whose 16 KiB buffers
    fcntl.ioctl would hold it through."""

    def test_other_threads_run_during_a_call(self):
        d = own_daemon.Daemon("16MiB", (2, 2, 64, 16, "f32"))
        self.addCleanup(d.close)
        c = kvfs.Client(d.mnt)
        self.addCleanup(c.close)
        pairs = [(0x4000 + i, bytes(16)) for i in range(300)]  # one inline LOOKUP
        self.assertEqual(c.lookup(pairs).run, 0)
        pid, marker = d.proc.pid, os.path.join(d.dir, "continued")
        started, got = threading.Event(), {}

        def call():
            started.set()
            got["run"] = c.lookup(pairs).run

        # stopped, the daemon leaves the call blocked in the kernel; a
        # watchdog process continues it after 20 s should this thread not
        # (started first: a child closing its copy of the control file
        # waits for the daemon)
        watchdog = subprocess.Popen(["sh", "-c", "sleep 20; touch %s; kill -CONT %d" % (marker, pid)])
        os.kill(pid, signal.SIGSTOP)
        # the signal stops the daemon's threads one by one: a busy machine
        # has them answer a call after kill() returned
        for _ in range(1000):
            if all(_task_state(pid, task) in "tT" for task in os.listdir("/proc/%d/task" % pid)):
                break
            time.sleep(0.01)
        else:
            self.fail("the daemon did not stop")
        t = threading.Thread(target=call)
        try:
            t.start()
            started.wait()
            time.sleep(0.5)  # the other thread is in its ioctl by now
            ran_during_call = not os.path.exists(marker) and t.is_alive()
        finally:
            os.kill(pid, signal.SIGCONT)
            t.join(60)
            watchdog.kill()
            watchdog.wait()
        self.assertTrue(ran_during_call, "this thread waited for the other's ioctl")
        self.assertEqual(got.get("run"), 0)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[1:])
