"""kvfs.torch on CPU tensors: the pin=True path end to end through a real
mount, and the REGISTER_CUDA path's registrations and target regions with a
fake driver.

Needs torch (any build; no GPU), and KVFS_MOUNT (a mounted kvfs) for the
pinned path; skips otherwise. torch.cuda's stream/event calls and the driver's
cuMemHostRegister are replaced by no-ops, so what runs is kvfs.torch's own
logic: staging layout, chunking and double buffering, the scatter into NHD,
HND and Hugging Face tensors (also a transposed V view), tensor-parallel head
shards, absent blocks. Every byte is checked against the group files.
"""

import contextlib
import os
import random
import unittest

import kvfs
import torch_on_cpu

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

MOUNT = os.environ.get("KVFS_MOUNT")


@unittest.skipUnless(torch is not None and MOUNT, "needs torch and KVFS_MOUNT")
class PinnedPathTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import kvfs.torch as kt
        cls.kt = kt
        cls.saved = torch_on_cpu.enter(kt, torch)

    @classmethod
    def tearDownClass(cls):
        torch_on_cpu.leave(cls.kt, torch, cls.saved)

    def setUp(self):
        self.c = kvfs.Client(MOUNT)
        self.info = i = self.c.info()
        self.dtype = {1: torch.bfloat16, 2: torch.float16, 3: torch.float32, 4: torch.uint8}[i.dtype]
        self.hd = i.row_bytes // torch.tensor([], dtype=self.dtype).element_size()
        self.rng = random.Random(7)
        self.base = self.rng.getrandbits(40) << 16

    def tearDown(self):
        self.c.close()

    def group(self, block, layer, head, kind):
        with open(self.c.group_path(MOUNT, block, layer, head, kind), "rb") as f:
            return f.read()

    def test_nhd_store_then_load_chunked(self):
        i = self.info
        L, H, bt, nb = i.layers, i.kv_heads, i.block_tokens, 7
        caches = [self._rand_bytes((2, nb, bt, H, self.hd)) for _ in range(L)]
        ids = [self.base + j for j in range(5)]
        cache_ids = [6, 0, 3, 2, 5]
        with self.kt.KVCache.nhd(self.c, caches, pin=True, staging_blocks=2) as kc:
            self.assertEqual(kc.store(ids, cache_ids), [kvfs.OK] * 5)
        for b, cb in zip(ids, cache_ids):
            for l in range(L):
                for k in (0, 1):
                    for h in range(H):
                        self.assertEqual(self.group(b, l, h, k), self._bytes(caches[l][k, cb, :, h, :]), (b, l, h, k))
        # load into a fresh HND cache at other cache blocks, with one absent block among them
        fresh = [torch.zeros((nb, 2, H, bt, self.hd), dtype=self.dtype) for _ in range(L)]
        marker = [f.clone() for f in fresh]
        absent = self.base + 0xFFFF
        with self.kt.KVCache.hnd(self.c, fresh, pin=True, staging_blocks=2) as kc:
            st = kc.load(ids[:2] + [absent] + ids[2:], [0, 1, 2, 4, 5, 6])
        self.assertEqual(st, [kvfs.OK, kvfs.OK, kvfs.ABSENT, kvfs.OK, kvfs.OK, kvfs.OK])
        for b_idx, dst in zip(range(5), [0, 1, 4, 5, 6]):
            src = cache_ids[b_idx]
            for l in range(L):
                for k in (0, 1):
                    # NHD [nb, bt, H, hd] tile of src vs HND [nb, H, bt, hd] tile of dst
                    self.assertTrue(_same(fresh[l][dst, k], caches[l][k, src].transpose(0, 1)), (b_idx, l, k))
        for l in range(L):
            self.assertTrue(_same(fresh[l][2], marker[l][2]), "absent block's cache block touched")
            self.assertTrue(_same(fresh[l][3], marker[l][3]), "unnamed cache block touched")

    def test_hf_transposed_v_and_tp_shards(self):
        i = self.info
        L, H, bt = i.layers, i.kv_heads, i.block_tokens
        seq = 3 * bt + 5
        pairs = []
        for _ in range(L):
            k = self._rand_bytes((1, H, seq, self.hd))
            v = self._rand_bytes((1, seq, H, self.hd)).transpose(1, 2)  # as transformers' v_proj(...).transpose(1, 2)
            pairs.append((k, v))
        ids = [self.base + 0x100 + j for j in range(3)]
        with self.assertRaisesRegex(ValueError, "one set of strides"):
            self.kt.KVCache.hf(self.c, pairs, pin=False)
        with self.kt.KVCache.hf(self.c, pairs, pin=True) as kc:
            self.assertEqual(kc.num_blocks, 3)
            self.assertEqual(kc.store(ids, range(3)), [kvfs.OK] * 3)
        if H % 2:
            self.skipTest("odd kv_heads: no 2-rank split")
        for rank in (0, 1):
            h0, hc = self.kt.tp_head_range(H, rank, 2)
            shard = [(torch.zeros((1, hc, 3 * bt, self.hd), dtype=self.dtype),
                      torch.zeros((1, hc, 3 * bt, self.hd), dtype=self.dtype)) for _ in range(L)]
            with self.kt.KVCache.hf(self.c, shard, pin=True, tp_rank=rank, tp_size=2, staging_blocks=1) as kc:
                self.assertEqual((kc.head_first, kc.head_count), (h0, hc))
                self.assertEqual(kc.load(ids, range(3)), [kvfs.OK] * 3)
            for l in range(L):
                for t, src in zip(shard[l], pairs[l]):
                    self.assertTrue(_same(t, src[:, h0:h0 + hc, :3 * bt]), (rank, l))

    def test_refusals(self):
        i = self.info
        caches = [self._rand_bytes((2, 4, i.block_tokens, i.kv_heads, self.hd)) for _ in range(i.layers)]
        with self.kt.KVCache.nhd(self.c, caches, pin=True) as kc:
            with self.assertRaisesRegex(ValueError, "twice"):
                kc.load([1, 2], [0, 0])
            with self.assertRaisesRegex(ValueError, "outside"):
                kc.load([1], [4])
            with self.assertRaisesRegex(ValueError, "block ids for"):
                kc.store([1, 2], [0])
        with self.assertRaisesRegex(ValueError, "kv-heads"):
            self.kt.KVCache.nhd(self.c, caches, pin=True, tp_size=2 if i.kv_heads % 2 == 0 else i.kv_heads)

    # helpers

    def _rand_bytes(self, shape):
        es = torch.tensor([], dtype=self.dtype).element_size()
        n = 1
        for s in shape:
            n *= s
        raw = bytes(self.rng.getrandbits(8) for _ in range(n * es)) if n * es < 64 else self.rng.randbytes(n * es)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(self.dtype).reshape(shape)

    def _bytes(self, t):
        return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if _has_numpy() else \
            bytes(t.contiguous().view(-1).view(torch.uint8).tolist())


def _same(a, b):
    """Bitwise equality (random bytes include NaNs, which torch.equal calls unequal)."""
    u8 = lambda t: t.contiguous().view(-1).view(torch.uint8)  # noqa: E731
    return a.shape == b.shape and torch.equal(u8(a), u8(b))


def _has_numpy():
    try:
        import numpy  # noqa: F401
        return True
    except ImportError:
        return False


class _FakeDriver:
    """Allocations are the tensors' storages: base = storage start, size = its bytes."""
    allocs = []

    def __init__(self):
        pass

    def address_range(self, ptr):
        for base, size in self.allocs:
            if base <= ptr < base + size:
                return base, size
        raise AssertionError("pointer %#x in no allocation" % ptr)

    def ipc_handle(self, base):
        return base.to_bytes(8, "little") * 8


class _FakeClient:
    def __init__(self, max_buffers=64):
        v = dict.fromkeys(kvfs.abi.INFO_FIELDS, 0)
        v.update(layers=4, kv_heads=4, head_dim=8, block_tokens=4, dtype_bytes=2, row_bytes=16,
                 caps=kvfs.abi.CAP_BLOCKS | kvfs.abi.CAP_CUDA, max_buffers=max_buffers)
        self._info = kvfs.Info(**v)
        self.registered, self.targets = [], []

    def info(self):
        return self._info

    def register_cuda(self, handle, offset, length, device):
        self.registered.append((handle, offset, length, device))
        return len(self.registered)

    def register_target(self, t):
        self.targets.append(t)
        return 9

    def unregister_target(self, tid):
        pass

    def unregister(self, bid):
        pass


@unittest.skipUnless(torch is not None, "needs torch")
class RegisterCudaPathTest(unittest.TestCase):
    """pin=False: one REGISTER_CUDA per allocation, regions at the tensors' offsets in it."""

    def setUp(self):
        import kvfs.torch as kt
        self.kt = kt
        self.saved = (kt._CPU_FOR_TESTS, kt.CudaDriver, torch.cuda.device, torch.cuda.synchronize,
                      torch.cuda.current_device)
        torch.cuda.current_device = lambda: 0
        kt._CPU_FOR_TESTS, kt.CudaDriver = True, _FakeDriver
        torch.cuda.device = lambda *a: contextlib.nullcontext()
        torch.cuda.synchronize = lambda *a: None

    def tearDown(self):
        kt = self.kt
        (kt._CPU_FOR_TESTS, kt.CudaDriver, torch.cuda.device, torch.cuda.synchronize,
         torch.cuda.current_device) = self.saved

    def test_one_registration_per_allocation(self):
        # vLLM-style: one tensor for all layers [L, 2, nb, bs, heads, hd], views per layer
        whole = torch.zeros((4, 2, 5, 4, 4, 8), dtype=torch.bfloat16)
        other = torch.zeros((2, 5, 4, 4, 8), dtype=torch.bfloat16)  # layer 3 in its own allocation
        es = whole.element_size()
        _FakeDriver.allocs = [(whole.data_ptr(), whole.numel() * es), (other.data_ptr(), other.numel() * es)]
        c = _FakeClient()
        layers = [whole[l] for l in range(3)] + [other]
        kc = self.kt.KVCache.nhd(c, layers)
        self.assertEqual(len(c.registered), 2)
        h, off, n, dev = c.registered[0]
        self.assertEqual((h, off, n), (whole.data_ptr().to_bytes(8, "little") * 8, 0, whole.numel() * es))
        t = c.targets[0]
        layer_bytes = 2 * 5 * 4 * 4 * 8 * es
        want = [(1, l * layer_bytes + k * layer_bytes // 2) for l in range(3) for k in (0, 1)] + \
            [(2, 0), (2, layer_bytes // 2)]
        self.assertEqual(t.regions, want)
        self.assertEqual((t.num_blocks, t.block_stride, t.head_stride, t.row_pitch), (5, 4 * 4 * 8 * es, 8 * es, 4 * 8 * es))
        self.assertEqual((t.layer_first, t.layer_count, t.head_first, t.head_count), (0, 4, 0, 4))
        kc.close()

    def test_kv_dim(self):
        # vLLM FlashInfer NHD: [num_blocks, 2, block_size, heads, head_dim] per layer, K/V on dim 1
        layers = [torch.zeros((5, 2, 4, 4, 8), dtype=torch.bfloat16) for _ in range(4)]
        _FakeDriver.allocs = [(t.data_ptr(), t.numel() * 2) for t in layers]
        c = _FakeClient()
        self.kt.KVCache.nhd(c, layers)
        t = c.targets[0]
        self.assertEqual(t.block_stride, 2 * 4 * 4 * 8 * 2)
        self.assertEqual(t.regions[:2], [(1, 0), (1, 4 * 4 * 8 * 2)])
        with self.assertRaisesRegex(ValueError, "kv_dim"):
            self.kt.KVCache.nhd(c, [torch.zeros((2, 2, 4, 4, 8), dtype=torch.bfloat16)] * 4)
        with self.assertRaisesRegex(ValueError, "size 2 on dim 0"):
            self.kt.KVCache.nhd(c, layers, kv_dim=0)

    def test_tp_rank_and_too_many_allocations(self):
        shards = [torch.zeros((2, 5, 4, 2, 8), dtype=torch.bfloat16) for _ in range(4)]
        _FakeDriver.allocs = [(t.data_ptr(), t.numel() * 2) for t in shards]
        c = _FakeClient()
        self.kt.KVCache.nhd(c, shards, tp_rank=1, tp_size=2)
        t = c.targets[0]
        self.assertEqual((t.head_first, t.head_count), (2, 2))
        self.assertEqual(len(c.registered), 4)
        with self.assertRaises(kvfs.KvfsError) as cm:
            self.kt.KVCache.nhd(_FakeClient(max_buffers=4), shards, tp_rank=1, tp_size=2)
        self.assertIn("allocations", str(cm.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
