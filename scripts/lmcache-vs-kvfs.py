#!/usr/bin/env python3
"""LMCache's disk storage and kvfs side by side on one disk: store whole chunks, read them back into host memory.

Needs LMCache in the interpreter that runs it (not a dependency of kvfs):

    python3 -m venv /var/tmp/lmc-venv
    /var/tmp/lmc-venv/bin/pip install lmcache                                  # the local disk backend
    /var/tmp/lmc-venv/bin/pip install --pre lmcache-rust-raw-block-io          # raw-block (optional)
    /var/tmp/lmc-venv/bin/python scripts/lmcache-vs-kvfs.py --kvfs out/kvfs    # as root, from the repository root

(scripts/measure.sh peers does this with LMCACHE_PY=/var/tmp/lmc-venv/bin/python.)

The data: --chunks LMCache chunks of a Llama-3-8B-shaped model (256 tokens,
KV_2LTD: [2, 32 layers, 256 tokens, 8 kv-heads, 128] bf16, 32 MiB each) of
random bytes, the same bytes for every side. Each round, in turn and on the
same directory (--dir, a disk), each side stores the chunks under new keys,
then os.sync() (part of the store's time: every side's bytes are on the
disk when its store ends), the page cache is dropped (echo 3 >
/proc/sys/vm/drop_caches), and the side reads the chunks back into host
memory; the bytes are then compared with the source (untimed).

* lmcache-disk: LocalDiskBackend (one file per chunk, written and read with
  buffered I/O: its default); batched_submit_put_task, waited for with its
  completion callbacks, and batched_get_blocking (a thread pool of readinto
  calls into memory objects of LocalCPUBackend's allocator).
* lmcache-disk-odirect: the same with extra_config use_odirect=True.
* lmcache-raw-block: RustRawBlockBackend (lmcache-rust-raw-block-io) on a
  preallocated file in --dir, O_DIRECT: slots of header + chunk.
* kvfs: a store file in --dir formatted for the same model (16-token blocks of
  2 MiB: 512 groups of 4 KiB, each with a CRC32C that every load checks),
  mounted with kvfs mount; STORE_BLOCKS and LOAD_BLOCKS through the Python
  client, one target per chunk laid out as the chunk (NHD per layer and
  kind), so the store reads from and the load writes into the same bytes
  LMCache moves. Stores are durable (the daemon syncs before answering).

Reported per side: GB/s (1e9 bytes) of the store (with the sync) and of the
retrieve, and CPU seconds per GB: this process's CPU time (every thread:
LMCache's workers run in it; for kvfs, the client) plus, for kvfs, the
daemon's (/proc/PID/stat). Medians over --rounds, and every round.
"""

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")  # before lmcache is imported: its INFO lines are many
sys.path.insert(0, os.path.join(ROOT, "python"))

LAYERS, KV_HEADS, HEAD_DIM, CHUNK_TOKENS, BLOCK_TOKENS = 32, 8, 128, 256, 16
SHAPE = (2, LAYERS, CHUNK_TOKENS, KV_HEADS, HEAD_DIM)
CHUNK_BYTES = 2 * LAYERS * CHUNK_TOKENS * KV_HEADS * HEAD_DIM * 2
BLOCKS_PER_CHUNK = CHUNK_TOKENS // BLOCK_TOKENS
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """User + system CPU seconds of process pid (every thread)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class Meter:
    """Wall and CPU time of one phase: this process, plus a daemon's."""

    def __init__(self, daemon=None):
        self.daemon = daemon

    def __enter__(self):
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.d0 = proc_cpu(self.daemon) if self.daemon else 0.0
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.dcpu = (proc_cpu(self.daemon) - self.d0) if self.daemon else 0.0
        self.cpu = time.process_time() - self.c0 + self.dcpu


class LMCacheSide:
    """One LMCache storage backend over LocalCPUBackend's allocator."""

    def __init__(self, name, kind, directory, chunks, rounds):
        import torch
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
        self.name, self.torch = name, torch
        self.dir = os.path.join(directory, "lmcache-" + kind)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        total = rounds * chunks * CHUNK_BYTES
        extra = {}
        if kind == "disk-odirect":
            extra["use_odirect"] = True
        if kind == "raw-block":
            dev = os.path.join(self.dir, "raw-block.img")
            cap = total + 256 * 2 ** 20 + rounds * chunks * 8192
            with open(dev, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, cap)
            extra.update({"rust_raw_block.device_path": dev, "rust_raw_block.capacity_bytes": cap,
                          "rust_raw_block.use_odirect": True})
        cfg = LMCacheEngineConfig.from_defaults(
            chunk_size=CHUNK_TOKENS, local_cpu=False, max_local_cpu_size=2.2 * chunks * CHUNK_BYTES / 2 ** 30,
            local_disk=self.dir if kind.startswith("disk") else None,
            max_local_disk_size=2 * total / 2 ** 30, extra_config=extra)
        self.md = LMCacheMetadata(model_name="kvfs-peers", world_size=1, local_world_size=1, worker_id=0,
                                  local_worker_id=0, kv_dtype=torch.bfloat16,
                                  kv_shape=(LAYERS, 2, CHUNK_TOKENS, KV_HEADS, HEAD_DIM))
        self.cpu = LocalCPUBackend(cfg, self.md)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        if kind.startswith("disk"):
            from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
            self.backend = LocalDiskBackend(cfg, self.loop, self.cpu)
        else:
            from lmcache.v1.storage_backend.plugins.rust_raw_block_backend import RustRawBlockBackend
            self.backend = RustRawBlockBackend(config=cfg, metadata=self.md, local_cpu_backend=self.cpu,
                                               loop=self.loop)
        self.keys = None

    def store(self, src, rnd):
        """Untimed: chunk memory objects filled from src; returns the timed store."""
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.memory_management import MemoryFormat
        torch = self.torch
        n = src.shape[0]
        self.keys = [CacheEngineKey("kvfs-peers", 1, 0, (rnd << 20) | i, torch.bfloat16) for i in range(n)]
        objs = []
        for i in range(n):
            o = self.cpu.allocate(torch.Size(SHAPE), torch.bfloat16, MemoryFormat.KV_2LTD)
            if o is None:
                raise RuntimeError("%s: LocalCPUBackend could not allocate a chunk" % self.name)
            o.tensor.view(torch.int16).copy_(src[i])
            objs.append(o)
        done, stored = threading.Semaphore(0), []

        def cb(key):
            stored.append(key)
            done.release()

        def run():
            self.backend.batched_submit_put_task(self.keys, objs, on_complete_callback=cb)
            for _ in range(n):
                if not done.acquire(timeout=300):
                    raise RuntimeError("%s: %d of %d chunks stored after 300 s" % (self.name, len(stored), n))
            os.sync()
            for o in objs:
                o.ref_count_down()
        return run

    def retrieve(self):
        got = self.backend.batched_get_blocking(self.keys)
        missing = sum(g is None for g in got)
        if missing:
            raise RuntimeError("%s: %d of %d chunks not retrieved" % (self.name, missing, len(got)))
        self.got = got

    def check(self, src):
        torch = self.torch
        ok = all(torch.equal(g.tensor.view(torch.int16), src[i]) for i, g in enumerate(self.got))
        for g in self.got:
            g.ref_count_down()
        self.got = None
        return ok

    def close(self):
        self.backend.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)


class KvfsSide:
    """A kvfs store file in directory, mounted; one NHD target per chunk over one host buffer."""

    def __init__(self, kvfs_bin, directory, chunks, rounds):
        import kvfs
        import torch
        self.kvfs, self.torch, self.bin = kvfs, torch, kvfs_bin
        self.name = "kvfs"
        self.store_path = os.path.join(directory, "kvfs-peers.kvfs")
        self.mnt = os.path.join(directory, "kvfs-peers.mnt")
        os.makedirs(self.mnt, exist_ok=True)
        blocks = rounds * chunks * BLOCKS_PER_CHUNK
        size = (blocks + 16) * (CHUNK_BYTES // BLOCKS_PER_CHUNK + 2 * 2 ** 16)
        subprocess.run([kvfs_bin, "format", self.store_path, "--size", str(size), "--layers", str(LAYERS),
                        "--kv-heads", str(KV_HEADS), "--head-dim", str(HEAD_DIM), "--block-tokens",
                        str(BLOCK_TOKENS), "--dtype", "bf16", "--force"], check=True, capture_output=True)
        out = subprocess.run([kvfs_bin, "mount", self.store_path, self.mnt, "--daemon", "--log-file",
                              self.store_path + ".log"], check=True, capture_output=True, text=True).stdout
        self.pid = int(out.split("(pid ", 1)[1].split(",", 1)[0])
        self.c = kvfs.Client(self.mnt)
        info = self.c.info()
        if (info.layers, info.kv_heads, info.block_tokens) != (LAYERS, KV_HEADS, BLOCK_TOKENS):
            raise RuntimeError("kvfs store geometry %s" % (info,))
        self.engine = info.engine
        self.buf = self.c.create_host_buffer(chunks * CHUNK_BYTES)
        self.view = torch.frombuffer(self.buf.mm, dtype=torch.int16).view((chunks,) + SHAPE)
        region = CHUNK_TOKENS * KV_HEADS * HEAD_DIM * 2  # one (kind, layer) of a chunk: [tokens, heads, head_dim]
        self.targets = []
        for ch in range(chunks):
            regions = [(self.buf.id, ch * CHUNK_BYTES + (kind * LAYERS + l) * region)
                       for l in range(LAYERS) for kind in (0, 1)]
            t = self.c.nhd_target(BLOCKS_PER_CHUNK, regions)
            self.targets.append((t, self.c.register_target(t)))
        self.ids = None

    def _entries(self):
        BE = self.kvfs.BlockEntry
        return [[BE(self.ids[ch] + j, j) for j in range(BLOCKS_PER_CHUNK)] for ch in range(len(self.targets))]

    def store(self, src, rnd):
        self.view.copy_(src)
        self.ids = [0x7e000000 + (rnd << 16) + ch * BLOCKS_PER_CHUNK for ch in range(len(self.targets))]

        def run():
            for t, es in zip(self.targets, self._entries()):
                st = self.c.store_blocks(t, es)
                if any(s != self.kvfs.OK for s in st):
                    raise RuntimeError("kvfs store: %s" % [self.kvfs.status_name(s) for s in st if s])
            os.sync()
        return run

    def retrieve(self):
        for t, es in zip(self.targets, self._entries()):
            st = self.c.load_blocks(t, es)
            if any(s != self.kvfs.OK for s in st):
                raise RuntimeError("kvfs load: %s" % [self.kvfs.status_name(s) for s in st if s])

    def check(self, src):
        return self.torch.equal(self.view, src)

    def close(self):
        del self.view
        for _, tid in self.targets:
            self.c.unregister_target(tid)
        self.buf.close()
        self.c.close()
        subprocess.run([self.bin, "umount", self.mnt], capture_output=True)
        for p in (self.store_path, self.store_path + ".log"):
            if os.path.exists(p):
                os.remove(p)
        os.rmdir(self.mnt)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kvfs", required=True, help="the kvfs binary")
    p.add_argument("--dir", default="/var/tmp", help="directory on the disk both sides store to [/var/tmp]")
    p.add_argument("--chunks", type=int, default=16, help="32 MiB chunks per round [16: 512 MiB]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sides", default="kvfs,lmcache-disk,lmcache-disk-odirect,lmcache-raw-block")
    args = p.parse_args()
    if os.geteuid() != 0:
        p.error("run as root (kvfs mount, drop_caches)")
    import torch
    try:
        import lmcache
    except ImportError:
        p.error("LMCache is not installed in %s (see --help)" % sys.executable)
    kvfs_bin = os.path.abspath(args.kvfs)
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(-2 ** 15, 2 ** 15, (args.chunks,) + SHAPE, dtype=torch.int16, generator=gen)
    gb = args.chunks * CHUNK_BYTES / 1e9
    sides, notes = [], []
    for name in args.sides.split(","):
        try:
            if name == "kvfs":
                sides.append(KvfsSide(kvfs_bin, args.dir, args.chunks, args.rounds))
            elif name.startswith("lmcache-"):
                sides.append(LMCacheSide(name, name[len("lmcache-"):], args.dir, args.chunks, args.rounds))
            else:
                p.error("unknown side %s" % name)
        except Exception as e:  # a side that does not run here is reported, the others measured
            notes.append("%s: not measured: %s: %s" % (name, type(e).__name__, e))
            print("note: " + notes[-1], file=sys.stderr, flush=True)
    res = {s.name: [] for s in sides}
    try:
        for rnd in range(args.rounds):
            for s in sides:
                run = s.store(src, rnd)
                with Meter(getattr(s, "pid", None)) as ms:
                    run()
                drop_caches()
                with Meter(getattr(s, "pid", None)) as ml:
                    s.retrieve()
                if not s.check(src):
                    raise RuntimeError("%s: retrieved bytes differ from the stored ones" % s.name)
                res[s.name].append((gb / ms.wall, ms.cpu / gb, gb / ml.wall, ml.cpu / gb, ms.dcpu / gb, ml.dcpu / gb))
                print("round %d %-22s store %.2f GB/s (%.3f core-s/GB), retrieve %.2f GB/s (%.3f core-s/GB)"
                      % ((rnd + 1, s.name) + res[s.name][-1][:4]), file=sys.stderr, flush=True)
    finally:
        for s in sides:
            try:
                s.close()
            except Exception as e:  # keep closing the others
                print("close %s: %s" % (s.name, e), file=sys.stderr)
    print("%d chunks of 32 MiB (%.2f GB) per round, %d rounds, %s; lmcache %s, torch %s%s" % (
        args.chunks, gb, args.rounds, args.dir, getattr(lmcache, "__version__", "?"), torch.__version__,
        "".join(", kvfs engine %s" % s.engine for s in sides if s.name == "kvfs")))
    print()
    print("| side | store GB/s (core-s/GB) | retrieve GB/s (core-s/GB) | rounds: retrieve GB/s |")
    print("|---|---|---|---|")
    med = statistics.median
    for s in sides:
        r = res[s.name]
        print("| %s | %.2f (%.3f) | %.2f (%.3f) | %s |" % (
            s.name, med(x[0] for x in r), med(x[1] for x in r), med(x[2] for x in r), med(x[3] for x in r),
            ", ".join("%.2f" % x[2] for x in r)))
    for s in sides:
        if getattr(s, "pid", None):
            r = res[s.name]
            print("%s: of its core-s/GB, the daemon's: store %.3f, retrieve %.3f" % (
                s.name, med(x[4] for x in r), med(x[5] for x in r)))
    for n in notes:
        print("note: " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
