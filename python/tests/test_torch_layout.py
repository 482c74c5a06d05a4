"""CPU-only tests of kvfs.torch's layout math and the REGISTER_CUDA encoding.

No torch, numpy, GPU or mount needed (pure stdlib): shapes and strides are
what torch would report for the tensors. Run directly (python3
test_torch_layout.py, PYTHONPATH=python) or by integration/ctl's go test.
"""

import itertools
import struct
import subprocess
import sys
import unittest

import kvfs
import kvfs.torch as kt
from kvfs import abi


def contiguous_strides(shape):
    s, out = 1, []
    for n in reversed(shape):
        out.append(s)
        s *= n
    return tuple(reversed(out))


def fake_info(layers=4, kv_heads=8, head_dim=8, block_tokens=4, dtype_bytes=2):
    v = dict.fromkeys(abi.INFO_FIELDS, 0)
    v.update(layers=layers, kv_heads=kv_heads, head_dim=head_dim, block_tokens=block_tokens,
             dtype_bytes=dtype_bytes, row_bytes=head_dim * dtype_bytes,
             caps=abi.CAP_BLOCKS, abi=abi.ABI_VERSION)
    return kvfs.Info(**v)


def fake_client(info):
    c = kvfs.Client.__new__(kvfs.Client)
    c._info = info
    return c


def tile_bytes(g, block_tokens, c, h):
    """Byte addresses the daemon touches for cache block c, head index h (from head_first)."""
    base = c * g["block_stride"] + h * g["head_stride"]
    return [base + r * g["row_pitch"] + b for r in range(block_tokens) for b in range(g["row_bytes"])]


class LayoutTest(unittest.TestCase):
    E = 2  # bf16
    BT, H, D, NB = 4, 3, 5, 6

    def element_index(self, layout, strides, c, h, r, d):
        if layout == "nhd":
            return c * strides[0] + r * strides[1] + h * strides[2] + d * strides[3]
        if layout == "hnd":
            return c * strides[0] + h * strides[1] + r * strides[2] + d * strides[3]
        t = c * self.BT + r  # hf: batch row 0
        return h * strides[1] + t * strides[2] + d * strides[3]

    def check_layout(self, layout, shape, strides):
        """Every byte the target names is the byte torch holds for that element."""
        g = kt.tensor_geometry(layout, shape, strides, self.E, self.BT, self.D * self.E)
        self.assertEqual(g["heads"], self.H)
        seen = set()
        for c, h in itertools.product(range(g["num_blocks"]), range(self.H)):
            addrs = tile_bytes(g, self.BT, c, h)
            for r, d in itertools.product(range(self.BT), range(self.D)):
                want = self.element_index(layout, strides, c, h, r, d) * self.E
                got = addrs[(r * self.D + d) * self.E]
                self.assertEqual(got, want, (layout, c, h, r, d))
            self.assertFalse(seen.intersection(addrs), "tiles share a byte")
            seen.update(addrs)
        self.assertLess(max(seen), kt.region_extent(g, self.BT))
        return g

    def test_nhd_contiguous(self):
        shape = (self.NB, self.BT, self.H, self.D)
        g = self.check_layout("nhd", shape, contiguous_strides(shape))
        self.assertEqual((g["block_stride"], g["head_stride"], g["row_pitch"]),
                         (self.BT * self.H * self.D * 2, self.D * 2, self.H * self.D * 2))

    def test_hnd_contiguous(self):
        shape = (self.NB, self.H, self.BT, self.D)
        g = self.check_layout("hnd", shape, contiguous_strides(shape))
        self.assertEqual(g["row_pitch"], self.D * 2)

    def test_hf_contiguous_and_partial_block(self):
        seq = self.NB * self.BT + 3  # 3 tokens past the last whole block are not moved
        shape = (2, self.H, seq, self.D)
        g = self.check_layout("hf", shape, contiguous_strides(shape))
        self.assertEqual(g["num_blocks"], self.NB)
        self.assertEqual(g["batch_stride"], self.H * seq * self.D * 2)
        self.assertEqual(g["head_stride"], seq * self.D * 2)

    def test_vllm_kv_split_views(self):
        # vLLM [2, num_blocks, block_size, heads, head_dim]: K = t[0], V = t[1] keep the strides
        full = (2, self.NB, self.BT, self.H, self.D)
        st = contiguous_strides(full)
        self.check_layout("nhd", full[1:], st[1:])

    def test_flashinfer_interleaved_pages(self):
        # FlashInfer [pages, 2, heads, page_size, head_dim]: K = t[:, 0] has block stride of a whole page
        full = (self.NB, 2, self.H, self.BT, self.D)
        st = contiguous_strides(full)
        g = self.check_layout("hnd", (full[0],) + full[2:], (st[0],) + st[2:])
        self.assertEqual(g["block_stride"], 2 * self.H * self.BT * self.D * 2)

    def test_matches_client_target_helpers(self):
        info = fake_info(layers=2, kv_heads=self.H, head_dim=self.D, block_tokens=self.BT)
        c = fake_client(info)
        for layout, shape, helper, n in (
                ("nhd", (self.NB, self.BT, self.H, self.D), c.nhd_target, self.NB),
                ("hnd", (self.NB, self.H, self.BT, self.D), c.hnd_target, self.NB),
                ("hf", (1, self.H, self.NB * self.BT, self.D), c.hf_target, self.NB * self.BT)):
            g = kt.tensor_geometry(layout, shape, contiguous_strides(shape), 2, self.BT, info.row_bytes)
            t = helper(n, [(1, 0)] * 4)
            self.assertEqual((t.num_blocks, t.block_stride, t.head_stride, t.row_pitch),
                             (g["num_blocks"], g["block_stride"], g["head_stride"], g["row_pitch"]), layout)
            self.assertEqual(kvfs.Client.region_bytes(info, t), kt.region_extent(g, self.BT))

    def test_refusals(self):
        shape = (self.NB, self.BT, self.H, self.D)
        st = contiguous_strides(shape)
        with self.assertRaisesRegex(ValueError, "block_size"):
            kt.tensor_geometry("nhd", shape, st, 2, self.BT + 1)
        with self.assertRaisesRegex(ValueError, "rows are"):
            kt.tensor_geometry("nhd", shape, st, 2, self.BT, 4 * self.D)
        with self.assertRaisesRegex(ValueError, "contiguous"):
            kt.tensor_geometry("hnd", (self.NB, self.H, self.BT, self.D), (1, 2, 3, 4), 2, self.BT)
        with self.assertRaisesRegex(ValueError, "4-D"):
            kt.tensor_geometry("nhd", shape[:3], st[:3], 2, self.BT)
        with self.assertRaisesRegex(ValueError, "layout"):
            kt.tensor_geometry("xyz", shape, st, 2, self.BT)
        with self.assertRaisesRegex(ValueError, "no whole block"):
            kt.tensor_geometry("hf", (1, self.H, self.BT - 1, self.D), contiguous_strides((1, self.H, 3, self.D)),
                               2, self.BT)


class StagingTest(unittest.TestCase):
    def test_slots_are_contiguous_records(self):
        L, H, BT, RB, S = 3, 2, 4, 16, 5
        g, offs, total = kt.staging_geometry(L, H, BT, RB, S)
        self.assertEqual(total, S * 2 * L * H * BT * RB)
        seen = set()
        for s, (i, off) in itertools.product(range(S), enumerate(offs)):
            for h in range(H):
                addrs = [off + a for a in tile_bytes(g, BT, s, h)]
                # [slots, layers, 2, heads, block_tokens, head_dim] contiguous: (l, k) = divmod(i, 2)
                l, k = divmod(i, 2)
                want = ((((s * L + l) * 2 + k) * H + h) * BT) * RB
                self.assertEqual(addrs[0], want)
                self.assertEqual(addrs, list(range(want, want + BT * RB)))
                self.assertFalse(seen.intersection(addrs))
                seen.update(addrs)
        self.assertEqual(seen, set(range(total)), "staging is dense")


class TensorParallelTest(unittest.TestCase):
    def test_even_split(self):
        self.assertEqual([kt.tp_head_range(8, r, 4) for r in range(4)], [(0, 2), (2, 2), (4, 2), (6, 2)])
        self.assertEqual(kt.tp_head_range(8), (0, 8))

    def test_replicated_heads(self):
        self.assertEqual([kt.tp_head_range(2, r, 8) for r in range(8)],
                         [(0, 1)] * 4 + [(1, 1)] * 4)

    def test_refusals(self):
        for args in ((8, 4, 4), (8, -1, 2), (8, 0, 0), (6, 0, 4)):
            with self.assertRaises(ValueError, msg=args):
                kt.tp_head_range(*args)


class RegisterCudaEncodingTest(unittest.TestCase):
    def test_layout_matches_ctl_abi(self):
        h = bytes(range(64))
        b = abi.pack_register_cuda(h, 0x1122334455667788, 0x99AABBCC, 3)
        self.assertEqual(len(b), 128)
        self.assertEqual(abi.IOC_REGISTER_CUDA, 0xC080B704)
        # offsets of ctl/abi/cuda.go: handle 8, offset 72, length 80, device 88, buffer 92, reserved 96
        self.assertEqual(struct.unpack_from("<II", b, 0), (abi.ABI_VERSION, 0))
        self.assertEqual(bytes(b[8:72]), h)
        self.assertEqual(struct.unpack_from("<QQII", b, 72), (0x1122334455667788, 0x99AABBCC, 3, 0))
        self.assertEqual(bytes(b[96:]), bytes(32))

    def test_refusals(self):
        with self.assertRaisesRegex(ValueError, "64 bytes"):
            abi.pack_register_cuda(bytes(63), 0, 1, 0)
        for off, n in ((0, 0), (-1, 4), ((1 << 64) - 2, 4)):
            with self.assertRaises(ValueError):
                abi.pack_register_cuda(bytes(64), off, n, 0)
        with self.assertRaises(ValueError):
            abi.pack_register_cuda(bytes(64), 0, 1, -1)

    def test_client_refuses_without_cap(self):
        c = fake_client(fake_info())  # caps lack CAP_CUDA
        with self.assertRaises(kvfs.KvfsError) as cm:
            c.register_cuda(bytes(64), 0, 4096, 0)
        self.assertIn("no CUDA support", str(cm.exception))


class ImportTest(unittest.TestCase):
    def test_kvfs_torch_imports_without_torch(self):
        # importing kvfs and kvfs.torch loads neither torch nor libcuda
        code = "import sys, kvfs, kvfs.torch; assert 'torch' not in sys.modules, 'torch imported'"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

if __name__ == "__main__":
    unittest.main(verbosity=2)
