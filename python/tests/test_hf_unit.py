"""kvfs.hf without a daemon: block names, salts, the minor-3 encoding, and
generation that falls back to recomputing when there is no kvfs mount.

Needs torch and transformers; skips otherwise (an error in CI, see conftest.py).
"""

import functools
import os
import struct
import tempfile
import types
import unittest
import warnings

import kvfs
from kvfs import abi

try:
    import torch
    import transformers  # noqa: F401
    import hf_model
    import kvfs.hf as khf
except ImportError:  # pragma: no cover
    torch = None


class EncodingTest(unittest.TestCase):
    """The minor-3 structs as include/kvfs.h lays them out."""

    def test_tagged_entry_layout(self):
        tag = bytes(range(16))
        b = abi.BLOCK_ENTRY_TAGGED.pack(0x1122, 7, 1, 2, 3, 4, abi.KINDS_BOTH, 0, 0, 0, 0, 0, tag, 0xabc,
                                        abi.META_PARENT, 0)
        self.assertEqual(len(b), 64)
        self.assertEqual(struct.unpack_from("<Q", b, 0)[0], 0x1122)
        self.assertEqual(b[32:48], tag)
        self.assertEqual(struct.unpack_from("<QII", b, 48), (0xabc, 1, 0))
        # the first 32 bytes are the minor-2 entry
        self.assertEqual(b[:32], abi.BLOCK_ENTRY.pack(0x1122, 7, 1, 2, 3, 4, abi.KINDS_BOTH, 0, 0, 0, 0, 0))

    def test_lookup_layout(self):
        self.assertEqual(abi.LOOKUP.size, 64)
        h = abi.LOOKUP.pack(1, 0, 3, 9, 16, 0, 0, 0, 0, 0, 0, 0)
        self.assertEqual(struct.unpack_from("<IIIIQ", h, 0), (1, 0, 3, 9, 16))
        p = abi.LOOKUP_PAIR.pack(5, b"\x07" * 16, 0)
        self.assertEqual((len(p), p[8:24], p[abi.LOOKUP_PAIR_STATUS_OFF]), (32, b"\x07" * 16, 0))
        self.assertEqual(abi.IOC_LOOKUP_INLINE, 0xffe0b727)
        self.assertEqual(abi.LOOKUP.size + abi.LOOKUP_INLINE_MAX * abi.LOOKUP_PAIR.size, abi.BLOCKS_INLINE_SIZE)

    def test_block_entry_defaults_stay_minor_2(self):
        e = kvfs.BlockEntry(1, 2)
        self.assertIsNone(e.tag)
        self.assertIsNone(e.parent)
        self.assertEqual(kvfs.BlockEntry(*tuple(e)[:7]), e)


@unittest.skipUnless(torch is not None, "needs torch and transformers")
class NamesTest(unittest.TestCase):
    def test_chain(self):
        salt = b"s" * 32
        a = list(range(64))
        b = list(range(48)) + [99] * 16
        ka, kb = khf.block_keys(salt, a, 16), khf.block_keys(salt, b, 16)
        self.assertEqual(len(ka), 4)
        self.assertEqual(ka[:3], kb[:3])          # a shared prefix shares names
        self.assertNotEqual(ka[3], kb[3])
        self.assertIsNone(ka[0].parent)
        for prev, k in zip(ka, ka[1:]):
            self.assertEqual(k.parent, prev.block)
        self.assertTrue(all(len(k.tag) == 16 and k.tag != bytes(16) for k in ka))
        # a block's name fixes every token before it, not only its own
        c = [1] + a[1:]
        kc = khf.block_keys(salt, c, 16)
        self.assertTrue(all(x.block != y.block and x.tag != y.tag for x, y in zip(ka, kc)))
        self.assertEqual(khf.block_keys(b"t" * 32, a, 16)[0].block != ka[0].block, True)
        self.assertEqual(len(khf.block_keys(salt, a[:47], 16)), 2)
        with self.assertRaises(ValueError):
            khf.block_keys(salt, a[:20], 16, 2)

    def test_salt_differs_whenever_kv_would(self):
        m = hf_model.tiny_llama(2, 2, 32, torch.float32)
        base = khf.model_salt(m, None, 0, 2)
        self.assertEqual(base, khf.model_salt(hf_model.tiny_llama(2, 2, 32, torch.float32), None, 0, 2))
        others = {
            "dtype": khf.model_salt(hf_model.tiny_llama(2, 2, 32, torch.bfloat16), None, 0, 2),
            "weights": khf.model_salt(hf_model.tiny_llama(2, 2, 32, torch.float32, seed=7), None, 0, 2),
            "config": khf.model_salt(hf_model.tiny_llama(3, 2, 32, torch.float32), None, 0, 2),
            "shard": khf.model_salt(m, None, 1, 1),
            "layers": khf.model_salt(m, None, 0, 2, layer_first=2),
            "identity": khf.model_salt(m, None, 0, 2, identity="lora-a"),
        }
        for what, s in others.items():
            self.assertNotEqual(s, base, what)
        m.config.name_or_path = "org/other"
        self.assertNotEqual(khf.model_salt(m, None, 0, 2), base, "name_or_path")


@unittest.skipUnless(torch is not None, "needs torch and transformers")
class NoDaemonTest(unittest.TestCase):
    """No kvfs mount at the path: generation recomputes, warning once."""

    def test_generate_without_mount(self):
        m = hf_model.tiny_llama(2, 2, 32, torch.float32)
        p = hf_model.prompt(40, 3)
        want = hf_model.plain(m, p)
        for layerwise in (False, True):
            with tempfile.TemporaryDirectory() as d:
                pc = khf.PrefixCache(os.path.join(d, "not-a-mount"), m, prefill_blocks=1, layerwise=layerwise)
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    got = pc.generate(p, **hf_model.GEN)
                    again = pc.generate(p, **hf_model.GEN)
                    cache, n = pc.load(p)
                self.assertEqual(len([x for x in w if issubclass(x.category, RuntimeWarning)]), 1,
                                 [str(x.message) for x in w])
                self.assertIn("kvfs.hf", str(w[0].message))
            hf_model.assert_same(self, got, want, "first")
            hf_model.assert_same(self, again, want, "again")
            self.assertEqual((n, cache.get_seq_length()), (0, 0))
            self.assertGreaterEqual(pc.stats["fallbacks"], 3)
            self.assertEqual(pc.stats["loaded_blocks"], 0)

    def test_batch(self):
        """A batch of sequences of one length is B prompts (with the daemon
        down, an empty cache: recomputed); sequences of other lengths are
        refused (a batch of other lengths is padded, with its mask)."""
        m = hf_model.tiny_llama(2, 2, 32, torch.float32)
        pc = khf.PrefixCache("/nonexistent", m)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            cache, n = pc.load(torch.zeros((2, 20), dtype=torch.long))
        self.assertEqual((n, cache.get_seq_length()), (0, 0))
        self.assertEqual(khf._token_rows(torch.arange(6).view(2, 3)), [[0, 1, 2], [3, 4, 5]])
        self.assertEqual(khf._token_rows([[1, 2], [3, 4]]), [[1, 2], [3, 4]])
        self.assertEqual(khf._token_rows(torch.tensor([[7, 8]])), [[7, 8]])
        self.assertEqual(khf._token_rows([7, 8]), [[7, 8]])
        with self.assertRaises(ValueError):
            pc.load([[1, 2, 3], [1, 2]])
        # ids as int64 little-endian bytes, from a tensor without a list of ints: the same names
        ids = torch.tensor([[5, -1, 2 ** 40], [0, 7, 128255]])
        self.assertEqual(khf._token_raw(ids), [struct.pack("<3q", *r) for r in ids.tolist()])
        self.assertEqual(khf._token_raw(ids[1]), khf._token_raw([[0, 7, 128255]]))
        salt = bytes(range(32))
        self.assertEqual(khf.block_keys(salt, khf._token_raw(ids)[0] * 2, 2),
                         khf.block_keys(salt, ids[0].tolist() * 2, 2))
        with self.assertRaises(ValueError):
            khf._token_raw(torch.zeros((1, 2, 3), dtype=torch.long))

    def test_model_on_several_devices_refused(self):
        """A model that accelerate spread over devices (hf_device_map naming
        more than one) is refused when the PrefixCache is made, not when a
        hit's cache meets a layer on another device."""
        m = hf_model.tiny_llama(2, 2, 32, torch.float32)
        m.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "lm_head": 1}
        with self.assertRaisesRegex(ValueError, "spread over 0, 1"):
            khf.PrefixCache("/nonexistent", m)
        m.hf_device_map = {"": 0}
        khf.PrefixCache("/nonexistent", m).close()

    def test_layer_groups(self):
        """After layer 0, layers_per_load layers a load, the first loads
        doubling up to it from one layer and the last halving down to one;
        every layer once, in order."""
        self.assertEqual([n for _, n in khf._layer_groups(32, 4)], [1, 2, 4, 4, 4, 4, 4, 4, 1, 2, 1])
        self.assertEqual(khf._layer_groups(4, 4), [(1, 1), (2, 1), (3, 1)])
        self.assertEqual(khf._layer_groups(8, 4), [(1, 1), (2, 2), (4, 1), (5, 2), (7, 1)])
        self.assertEqual(khf._layer_groups(5, 1), [(1, 1), (2, 1), (3, 1), (4, 1)])
        self.assertEqual(khf._layer_groups(1, 4), [])
        m = hf_model.tiny_llama(2, 2, 32, torch.float32)
        for bad in (dict(layers_per_load=0), dict(loads_in_flight=0)):
            with self.assertRaisesRegex(ValueError, "want 1 or more"):
                khf.PrefixCache("/nonexistent", m, **bad)
        for layers in range(1, 90):
            for per in (1, 2, 3, 4, 8):
                g = khf._layer_groups(layers, per)
                self.assertEqual([l for f, n in g for l in range(f, f + n)], list(range(1, layers)), (layers, per))
                self.assertTrue(all(1 <= n <= per for _, n in g), (layers, per, g))
                if g:
                    self.assertEqual((g[0][1], g[-1][1]), (1, 1), (layers, per, g))

    def test_left_pads(self):
        """Which masks are left padding (each row zeros, then ones): those
        kvfs.hf names by the tokens after the pads; any other is not."""
        t = torch.tensor
        self.assertEqual(khf._left_pads(t([[1, 1, 1], [0, 0, 1], [0, 1, 1]])), [0, 2, 1])
        self.assertEqual(khf._left_pads(t([[True, True], [False, True]])), [0, 1])
        for what, m in (("a hole", [[1, 0, 1]]), ("right padding", [[1, 1, 0]]), ("a row of pads", [[0, 0], [1, 1]]),
                        ("one dimension", [0, 1])):
            self.assertIsNone(khf._left_pads(t(m)), what)


@unittest.skipUnless(torch is not None, "needs torch and transformers")
class SuffixAttentionTest(unittest.TestCase):
    """kvfs.hf.suffix_attention: the rest of a prompt attends its cached
    prefix through a lower-right causal bias instead of transformers'
    materialized mask; the logits are transformers' own, and the model's
    attention implementation is back afterwards."""

    def rest_logits(self, m, p, cached, mask=None, on=True):
        from transformers import DynamicCache
        kw = hf_model.cache_kw(m)
        c = DynamicCache()
        with torch.no_grad():
            if cached:
                m(input_ids=p[:, :cached], use_cache=True, attention_mask=None if mask is None else mask[:, :cached],
                  **{kw: c})
            with khf.suffix_attention(m, on):
                self.assertEqual(m.config._attn_implementation, khf.SUFFIX_ATTENTION if on else "sdpa")
                return m(input_ids=p[:, cached:], use_cache=True, attention_mask=mask, **{kw: c}).logits

    def test_logits_as_transformers(self):
        # KVFS_TEST_DEVICE=cuda: in bf16 on the GPU, where the bias runs FlashAttention's kernel
        dev = os.environ.get("KVFS_TEST_DEVICE", "cpu")
        tol = 1e-5 if dev == "cpu" else 2e-2
        m = hf_model.tiny_llama(2, 2, 32, torch.float32 if dev == "cpu" else torch.bfloat16).to(dev)
        p = hf_model.prompt(56, 7).to(dev)
        # the rest over a prefix (the bias), one token (decoding), no prefix (plain causal)
        for cached in (32, 55, 0):
            got, want = self.rest_logits(m, p, cached).float(), self.rest_logits(m, p, cached, on=False).float()
            self.assertTrue(torch.allclose(got, want, rtol=tol, atol=tol),
                            "%d cached: max |diff| %g" % (cached, (got - want).abs().max().item()))
        # a left-padded batch: transformers' mask, as it is
        batch = torch.cat([p, hf_model.prompt(56, 8).to(dev)])
        mask = torch.ones_like(batch)
        mask[1, :5] = 0
        got, want = self.rest_logits(m, batch, 32, mask), self.rest_logits(m, batch, 32, mask, on=False)
        self.assertTrue(torch.equal(got, want), (got.float() - want.float()).abs().max().item())
        self.assertEqual(m.config._attn_implementation, "sdpa")

    def test_mask(self):
        """None (the bias) only for unpadded causal queries that end the keys."""
        from transformers.masking_utils import causal_mask_function
        f = functools.partial(khf._suffix_mask, batch_size=1, mask_function=causal_mask_function)
        self.assertIsNone(f(q_length=24, kv_length=56, q_offset=32))
        self.assertIsNone(f(q_length=24, kv_length=56, q_offset=32, attention_mask=torch.ones(1, 56, dtype=torch.bool)))
        for what, kw in (("padded", dict(attention_mask=torch.tensor([[False] + [True] * 55]))),
                         ("queries before the keys' end", dict(q_offset=0)),
                         ("no skip allowed", dict(q_offset=32, allow_is_causal_skip=False)),
                         ("a sliding window", dict(q_offset=32, local_size=8))):
            got = f(q_length=24, kv_length=56, **kw)
            self.assertIsNotNone(got, what)
            self.assertEqual(tuple(got.shape), (1, 1, 24, 56), what)

    def test_restored(self):
        m = hf_model.tiny_llama(2, 2, 32, torch.float32)
        with self.assertRaises(KeyError):
            with khf.suffix_attention(m):
                raise KeyError("inside")
        self.assertEqual(m.config._attn_implementation, "sdpa")
        m.config._attn_implementation = "eager"
        with khf.suffix_attention(m):
            self.assertEqual(m.config._attn_implementation, "eager")
        self.assertEqual(m.config._attn_implementation, "eager")
        # a composite model: its text config's attention only, a vision tower's left as it is
        from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig
        small = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2)
        cfg = LlavaConfig(vision_config=CLIPVisionConfig(**small), text_config=LlamaConfig(vocab_size=64, **small))
        cfg._attn_implementation = {"": "sdpa", "vision_config": "eager", "text_config": "sdpa"}
        composite = types.SimpleNamespace(config=cfg)
        with khf.suffix_attention(composite):
            self.assertEqual((cfg.text_config._attn_implementation, cfg.vision_config._attn_implementation),
                             (khf.SUFFIX_ATTENTION, "eager"))
        self.assertEqual((cfg._attn_implementation, cfg.text_config._attn_implementation,
                          cfg.vision_config._attn_implementation), ("sdpa", "sdpa", "eager"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
