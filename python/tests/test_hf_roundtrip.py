"""A Hugging Face transformers cache through a real kvfs mount on the CPU,
bit for bit.

A tiny randomly initialised Llama (no weights downloaded; GQA: twice as many
query heads as kv-heads) is built from a LlamaConfig shaped like the mounted
store (its layers, kv-heads, head_dim and dtype). It prefills the whole
blocks of a prompt into a DynamicCache, which kvfs.torch stores as kvfs
blocks; a second client loads them back into a fresh DynamicCache (NaN until
loaded). The loaded cache must hold the same bytes, and model.generate on the
full prompt (the tokens past the last whole block, then greedy decoding) must
give the same tokens and bit-identical logits at every step from the loaded
cache as from the one the model computed.

Needs torch, transformers and KVFS_MOUNT; skips otherwise (an error in CI,
see conftest.py). kvfs.torch runs on CPU tensors through torch_on_cpu.
"""

import inspect
import os
import unittest

import kvfs
import torch_on_cpu

try:
    import torch
    import transformers
except ImportError:  # pragma: no cover
    torch = transformers = None

MOUNT = os.environ.get("KVFS_MOUNT")
VOCAB, BLOCKS, TAIL, NEW_TOKENS = 128, 4, 5, 12
BLOCK_BASE = 0x4F5EED0000


@unittest.skipUnless(torch is not None and MOUNT, "needs torch, transformers and KVFS_MOUNT")
class HFRoundTripTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import kvfs.torch as kt
        cls.kt = kt
        cls.saved = torch_on_cpu.enter(kt, torch)

    @classmethod
    def tearDownClass(cls):
        torch_on_cpu.leave(cls.kt, torch, cls.saved)

    def setUp(self):
        with kvfs.Client(MOUNT) as c:
            self.info = c.info()
        i = self.info
        self.dtype = {1: torch.bfloat16, 2: torch.float16, 3: torch.float32}[i.dtype]
        self.head_dim = i.row_bytes // i.dtype_bytes
        self.model = self._model()

    def _model(self):
        from transformers import LlamaConfig, LlamaForCausalLM
        i, hd = self.info, self.head_dim
        heads = 2 * i.kv_heads
        torch.manual_seed(1234)
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=heads * hd, intermediate_size=2 * heads * hd,
                          num_hidden_layers=i.layers, num_attention_heads=heads, num_key_value_heads=i.kv_heads,
                          head_dim=hd, max_position_embeddings=1024, tie_word_embeddings=False,
                          bos_token_id=None, eos_token_id=None, pad_token_id=0)
        cfg._attn_implementation = "sdpa"
        m = LlamaForCausalLM(cfg).to(self.dtype).eval()
        # decode exactly NEW_TOKENS: no end-of-sequence token
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
        return m

    def _cache_kw(self):
        # transformers 5.x names the cache argument "cache"; earlier, "past_key_values"
        params = inspect.signature(self.model.forward).parameters
        return "cache" if "cache" in params else "past_key_values"

    def _generate(self, ids, cache):
        return self.model.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                   output_logits=True, return_dict_in_generate=True, **{self._cache_kw(): cache})

    def test_cache_stored_and_loaded_generates_the_same(self):
        from transformers import DynamicCache
        kt, bt = self.kt, self.info.block_tokens
        n = BLOCKS * bt
        prompt = torch.randint(0, VOCAB, (1, n + TAIL), generator=torch.Generator().manual_seed(99))
        with torch.no_grad():
            out = self.model(input_ids=prompt[:, :n], use_cache=True, **{self._cache_kw(): DynamicCache()})
        computed = _output_cache(out)
        layers = kt._hf_layers(computed)
        self.assertEqual(len(layers), self.info.layers)
        self.assertEqual(tuple(layers[0][0].shape), (1, self.info.kv_heads, n, self.head_dim))
        want = [(k.clone(), v.clone()) for k, v in layers]
        ids = [BLOCK_BASE + b for b in range(BLOCKS)]

        with kvfs.Client(MOUNT) as c, kt.KVCache.hf(c, computed, pin=True, staging_blocks=3) as kc:
            self.assertEqual(kc.num_blocks, BLOCKS)
            self.assertEqual(kc.store(ids, range(BLOCKS)), [kvfs.OK] * BLOCKS)

        # a fresh client and fresh tensors: nothing of the computed cache is reachable
        shape = (1, self.info.kv_heads, n, self.head_dim)
        pairs = [(torch.full(shape, float("nan"), dtype=self.dtype), torch.full(shape, float("nan"), dtype=self.dtype))
                 for _ in range(self.info.layers)]
        with kvfs.Client(MOUNT) as c, kt.KVCache.hf(c, pairs, pin=True, staging_blocks=3) as kc:
            self.assertEqual(kc.load(ids, range(BLOCKS)), [kvfs.OK] * BLOCKS)
        for l, ((k, v), (wk, wv)) in enumerate(zip(pairs, want)):
            self.assertTrue(torch.equal(k, wk) and torch.equal(v, wv), "layer %d: loaded bytes differ" % l)
        loaded = DynamicCache()
        for l, (k, v) in enumerate(pairs):
            loaded.update(k, v, l)
        self.assertEqual(loaded.get_seq_length(), n)

        with torch.no_grad():
            ref = self._generate(prompt, computed)
            got = self._generate(prompt, loaded)
        self.assertEqual(ref.sequences.shape, (1, n + TAIL + NEW_TOKENS))
        self.assertEqual(got.sequences.tolist(), ref.sequences.tolist())
        self.assertEqual(len(got.logits), NEW_TOKENS)
        for step, (a, b) in enumerate(zip(got.logits, ref.logits)):
            self.assertTrue(torch.equal(a, b), "step %d: logits differ (max |diff| %g)"
                            % (step, (a.float() - b.float()).abs().max().item()))
        # the logits are the model's, not a constant: greedy decoding followed them
        self.assertEqual(ref.sequences[0, n + TAIL:].tolist(), [int(lg.argmax(-1)) for lg in ref.logits])

    def test_absent_block_is_reported(self):
        # a block kvfs never stored loads as ABSENT and leaves its cache block untouched
        kt, bt = self.kt, self.info.block_tokens
        shape = (1, self.info.kv_heads, 2 * bt, self.head_dim)
        pairs = [(torch.full(shape, 3.0, dtype=self.dtype), torch.full(shape, 3.0, dtype=self.dtype))
                 for _ in range(self.info.layers)]
        with kvfs.Client(MOUNT) as c, kt.KVCache.hf(c, pairs, pin=True) as kc:
            self.assertEqual(kc.load([BLOCK_BASE + 0xFFFF], [1]), [kvfs.ABSENT])
        self.assertTrue(all(bool((k == 3).all() and (v == 3).all()) for k, v in pairs))


def _output_cache(out):
    """The cache of a forward's output (transformers 5.x: .cache; earlier: .past_key_values)."""
    c = getattr(out, "cache", None)
    return c if c is not None else out.past_key_values


if __name__ == "__main__":
    unittest.main(verbosity=2)
