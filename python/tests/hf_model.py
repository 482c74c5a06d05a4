"""A tiny random Llama for kvfs.hf's tests, and the generation they compare with.

The model is built from a LlamaConfig (no weights downloaded; GQA: twice as
many query heads as kv-heads), seeded, shaped like the store (layers,
kv-heads, head_dim, dtype). reference() is the computation PrefixCache(...,
prefill_blocks=1) does, without kvfs: every whole block of the prompt but
the one holding its last token in its own forward, then model.generate.
"""

import inspect

import torch

VOCAB = 128
NEW_TOKENS = 8
DTYPES = {1: torch.bfloat16, 2: torch.float16, 3: torch.float32}


def tiny_llama(layers, kv_heads, head_dim, dtype, seed=1234):
    from transformers import LlamaConfig, LlamaForCausalLM
    heads = 2 * kv_heads
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=heads * head_dim, intermediate_size=2 * heads * head_dim,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=head_dim, max_position_embeddings=1024, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    m = LlamaForCausalLM(cfg).to(dtype).eval()
    m.generation_config.eos_token_id = None  # decode exactly NEW_TOKENS
    m.generation_config.pad_token_id = 0
    return m


def for_info(info, seed=1234):
    return tiny_llama(info.layers, info.kv_heads, info.row_bytes // info.dtype_bytes, DTYPES[info.dtype], seed)


def cache_kw(model):
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


GEN = dict(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, output_logits=True,
           return_dict_in_generate=True)


def reference(model, prompt, block_tokens, seed=None, cache=None, suffix=True, **gen):
    """Generation without kvfs, prefilled block by block as PrefixCache(prefill_blocks=1) does.
    gen: GEN's settings changed (num_beams, sampling); seed: torch.manual_seed before generating;
    cache: a DynamicCache holding the prompt's first whole blocks already (default: an empty one);
    suffix: with the attention PrefixCache(suffix_attention=True) runs (kvfs.hf.suffix_attention)."""
    from transformers import DynamicCache
    from kvfs.hf import suffix_attention
    gen = dict(GEN, cache_implementation=None, **gen)  # the cache is the DynamicCache given
    # generate runs max(num_beams, num_return_sequences) rows per sequence: the cache has them all
    rows = prompt.repeat_interleave(max(gen.get("num_beams", 1), gen.get("num_return_sequences", 1)), 0)
    cache = DynamicCache() if cache is None else cache
    kw = cache_kw(model)
    with torch.no_grad(), suffix_attention(model, suffix):
        for j in range(cache.get_seq_length() // block_tokens, (prompt.shape[1] - 1) // block_tokens):
            model(input_ids=rows[:, j * block_tokens:(j + 1) * block_tokens], use_cache=True, **{kw: cache})
        if seed is not None:
            torch.manual_seed(seed)
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), **{kw: cache}, **gen)


def plain(model, prompt):
    """model.generate with no cache given, every token attended (without a
    mask, generate would take the prompt's pad_token_id tokens for padding)."""
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), **GEN)


def prompt(n, seed):
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def assert_generated(tc, got, want, what="", tol=0):
    """The same tokens, and logits at every step identical (tol=0) or within
    tol (relative and absolute): for generations of any settings."""
    tc.assertEqual(got.sequences.tolist(), want.sequences.tolist(), what)
    tc.assertEqual(len(got.logits), len(want.logits), what)
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        ok = torch.equal(a, b) if tol == 0 else torch.allclose(a, b, rtol=tol, atol=tol)
        tc.assertTrue(ok, "%s step %d: logits differ (max |diff| %g)"
                      % (what, step, (a.float() - b.float()).abs().max().item()))


def assert_same(tc, got, want, what=""):
    """GEN's generation: same tokens and bit-identical logits at every step."""
    assert_generated(tc, got, want, what)
    tc.assertEqual(len(got.logits), NEW_TOKENS)
    # the logits are the model's: greedy decoding followed them
    n = want.sequences.shape[1] - NEW_TOKENS
    tc.assertEqual(want.sequences[0, n:].tolist(), [int(lg.argmax(-1)) for lg in want.logits])
