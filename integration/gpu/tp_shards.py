#!/usr/bin/env python3
"""Tensor-parallel shard loads through one kvfs mount (issue 14).

The parent stores NB random whole blocks (NHD, every kv-head) into the
mount. Then N rank processes, rank r on GPU r % (GPUs), each allocate the
NHD cache of their kv-head shard (one tensor for all layers, as engines do),
load every block into a permuted set of cache blocks through their own
kvfs.torch.KVCache (tp_rank=r, tp_size=N), and check every byte against the
shard of the stored data. With --kill, one more rank is SIGKILLed while it
loads in a loop; the others must still finish correct, and a load after it
must still work.

    tp_shards.py --geometry
    tp_shards.py MOUNT WORKDIR [--ranks 2] [--mode pin|cuda] [--kill]
    tp_shards.py MOUNT WORKDIR --cpu     # the same logic on CPU tensors (pin path, no GPU)

Exit 0 when every rank loaded its shard byte for byte, 3 when --mode cuda and
the daemon lacks REGISTER_CUDA, 1 otherwise.
"""

import argparse
import contextlib
import errno
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

LAYERS, KV_HEADS, HEAD_DIM, BLOCK_TOKENS, NB = 8, 8, 128, 16, 256
BLOCK_BASE = 0x7B000000
GEOMETRY = ["--layers", str(LAYERS), "--kv-heads", str(KV_HEADS), "--head-dim", str(HEAD_DIM),
            "--block-tokens", str(BLOCK_TOKENS), "--dtype", "bf16"]


def cpu_mode():
    """Run kvfs.torch on CPU tensors: stream/event/driver calls become no-ops."""
    import torch
    import kvfs.torch as kt

    class Nop:
        def __init__(self, *a, **k):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: None

    kt._CPU_FOR_TESTS = True
    kt.CudaDriver = Nop
    torch.cuda.device = lambda *a: contextlib.nullcontext()
    torch.cuda.stream = lambda *a: contextlib.nullcontext()
    torch.cuda.current_stream = lambda *a: Nop()
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.Event = Nop


def u8(t):
    return t.contiguous().view(-1).view(__import__("torch").uint8)


def full_path(workdir):
    return os.path.join(workdir, "tp_full.pt")


def perm(rank):
    """The cache block each stored block lands in on this rank (a permutation)."""
    return [(i * 37 + rank * 11) % NB for i in range(NB)]


def writer(args):
    import torch
    import kvfs
    import kvfs.torch as kt
    dev = "cpu" if args.cpu else "cuda:0"
    g = torch.Generator().manual_seed(5)
    full = torch.randint(0, 256, (LAYERS, 2, NB, BLOCK_TOKENS, KV_HEADS, HEAD_DIM * 2), dtype=torch.uint8,
                         generator=g).view(torch.bfloat16)
    torch.save(full, full_path(args.workdir))
    full = full.to(dev)
    ids = [BLOCK_BASE + i for i in range(NB)]
    with kvfs.Client(args.mount) as c:
        with kt.KVCache.nhd(c, [full[l] for l in range(LAYERS)], pin=True) as kc:
            st = kc.store(ids, range(NB))
    bad = sum(s != kvfs.OK for s in st)
    print("writer: stored %d blocks (%.0f MiB), %d not OK" % (NB, full.numel() * 2 / 2**20, bad), flush=True)
    return 1 if bad else 0


def rank_main(args):
    import torch
    import kvfs
    import kvfs.torch as kt
    r, n = args.rank, args.ranks
    if args.cpu:
        dev = "cpu"
    else:
        ngpu = torch.cuda.device_count()
        dev = "cuda:%d" % (r % ngpu)
        torch.cuda.set_device(r % ngpu)
    h0, hc = kt.tp_head_range(KV_HEADS, r, n)
    cache = torch.zeros((LAYERS, 2, NB, BLOCK_TOKENS, hc, HEAD_DIM), dtype=torch.bfloat16, device=dev)
    ids = [BLOCK_BASE + i for i in range(NB)]
    dst = perm(r)
    with kvfs.Client(args.mount) as c:
        try:
            kc = kt.KVCache.nhd(c, [cache[l] for l in range(LAYERS)], tp_rank=r, tp_size=n, pin=args.mode == "pin")
        except kvfs.KvfsError as e:
            print("rank %d: %s" % (r, e), flush=True)
            return 3 if e.errno in (errno.ENOTTY, errno.ENODEV) else 1
        with kc:
            rounds = 1 << 30 if args.victim else args.rounds
            best = None
            for i in range(rounds):
                if args.victim and i == 0:
                    print("rank %d (victim): loading in a loop" % r, flush=True)
                t0 = time.perf_counter()
                st = kc.load(ids, dst)
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
                if any(s != kvfs.OK for s in st):
                    print("rank %d: %d blocks not OK" % (r, sum(s != kvfs.OK for s in st)), flush=True)
                    return 1
    full = torch.load(full_path(args.workdir))
    want = full[:, :, :, :, h0:h0 + hc, :]
    got = cache.cpu()[:, :, dst]
    ok = torch.equal(u8(got), u8(want))
    nbytes = cache.numel() * 2
    print("rank %d of %d on %s: heads %d..%d, %d blocks, %.1f MiB, best load %.1f ms (%.2f GB/s), bytes %s"
          % (r, n, dev, h0, h0 + hc - 1, NB, nbytes / 2**20, best * 1e3, nbytes / best / 1e9,
             "identical" if ok else "DIFFER"), flush=True)
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mount", nargs="?")
    p.add_argument("workdir", nargs="?")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mode", choices=("pin", "cuda"), default="pin")
    p.add_argument("--kill", action="store_true", help="also SIGKILL a rank mid-load")
    p.add_argument("--cpu", action="store_true", help="CPU tensors, pin path (checks the logic without a GPU)")
    p.add_argument("--geometry", action="store_true")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--victim", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.geometry:
        print(" ".join(GEOMETRY))
        return 0
    if not args.mount or not args.workdir:
        p.error("MOUNT and WORKDIR are required")
    if args.cpu:
        cpu_mode()
        args.mode = "pin"
    if args.rank >= 0:
        return rank_main(args)
    if writer(args):
        return 1
    base = [sys.executable, os.path.abspath(__file__), args.mount, args.workdir, "--ranks", str(args.ranks),
            "--mode", args.mode, "--rounds", str(args.rounds)] + (["--cpu"] if args.cpu else [])
    victim = None
    if args.kill:
        # the victim is rank 0 of the same split, loading in a loop; killed once the others are under way
        victim = subprocess.Popen(base + ["--rank", "0", "--victim"], stdout=subprocess.PIPE, text=True)
        line = victim.stdout.readline()
        print(line.rstrip(), flush=True)
    procs = [subprocess.Popen(base + ["--rank", str(r)]) for r in range(args.ranks)]
    if victim is not None:
        time.sleep(0.5)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        print("victim killed mid-load (exit %d)" % victim.returncode, flush=True)
    rcs = [pr.wait() for pr in procs]
    if any(rc == 3 for rc in rcs):
        print("tp_shards %s: n/a (daemon without REGISTER_CUDA)" % args.mode)
        return 3
    ok = all(rc == 0 for rc in rcs)
    if ok and args.kill:
        # the mount still serves after the kill
        ok = subprocess.call(base + ["--rank", "1" if args.ranks > 1 else "0", "--rounds", "1"]) == 0
    print("tp_shards %s, %d ranks%s: %s" % (args.mode, args.ranks, ", one killed" if args.kill else "",
                                            "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
