#!/usr/bin/env python3
"""Time to first token: recompute the prefill, or load its KV cache from kvfs (issue 12).

A Llama-3-8B-shaped model (random weights, bf16: 32 layers, hidden 4096,
32 query heads, 8 kv-heads, head_dim 128, MLP 14336, vocab 128256) on one
GPU. For each prompt length N (4K, 16K, 32K tokens):

* recompute: a prefill of all N tokens, then the first token's logits;
* kvfs: the KV of tokens [0, N-16) (whole 16-token blocks) loaded from a
  store into a fresh Hugging Face cache, then a prefill of the last block
  with that cache and the first token's logits. The load is timed from the
  LOAD call to the logits (the cache's registration is a one-time setup of an
  engine and is reported apart). Through pin=True (the client's pinned
  staging buffer) and through REGISTER_CUDA ("n/a" when the daemon lacks it),
  from a store on tmpfs and one on disk (the disk store's page cache dropped
  before each load where the kernel lets us).

Before timing, the blocks are stored from the recompute's cache (pin=True)
and every load is checked byte for byte against that cache.

    ttft.py --geometry        # the kvfs format flags of the stores
    ttft.py --tmpfs MOUNT --disk MOUNT [--tokens 4096,16384,32768] [--repeat 3]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

LAYERS, HEADS, KV_HEADS, HEAD_DIM, HIDDEN, MLP, VOCAB = 32, 32, 8, 128, 4096, 14336, 128256
BLOCK_TOKENS = 16
GEOMETRY = ["--layers", str(LAYERS), "--kv-heads", str(KV_HEADS), "--head-dim", str(HEAD_DIM),
            "--block-tokens", str(BLOCK_TOKENS), "--dtype", "bf16"]


def build_model(max_tokens):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=MLP, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                      max_position_embeddings=max(8192, max_tokens + 64), rope_theta=500000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    try:
        cfg._attn_implementation = "sdpa"
    except Exception:
        pass
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.to(torch.bfloat16).eval()


def first_token(model, ids, cache):
    """Logits of the token after ids, extending cache; only the last position goes through lm_head."""
    import torch
    with torch.no_grad():
        out = model.model(input_ids=ids, past_key_values=cache, use_cache=True)
        h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return model.lm_head(h[:, -1, :]), out.past_key_values


def cache_from(pairs):
    from transformers import DynamicCache
    c = DynamicCache()
    for i, (k, v) in enumerate(pairs):
        c.update(k, v, i)
    return c


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tmpfs", help="mount of the store on tmpfs")
    p.add_argument("--disk", help="mount of the store on disk")
    p.add_argument("--tokens", default="4096,16384,32768")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per cell (the median is reported)")
    p.add_argument("--staging-blocks", type=int, default=64)
    p.add_argument("--geometry", action="store_true", help="print the kvfs format flags and exit")
    args = p.parse_args()
    if args.geometry:
        print(" ".join(GEOMETRY))
        return 0
    import torch
    import transformers
    import kvfs
    import kvfs.torch as kt

    sizes = [int(x) for x in args.tokens.split(",")]
    stores = [(n, m) for n, m in (("tmpfs", args.tmpfs), ("disk", args.disk)) if m]
    print("torch %s, transformers %s, %s" % (torch.__version__, transformers.__version__,
                                             torch.cuda.get_device_name(0)), flush=True)
    model = build_model(max(sizes))
    print("model: %.2f B parameters, bf16" % (sum(p.numel() for p in model.parameters()) / 1e9), flush=True)
    clients = {name: kvfs.Client(m) for name, m in stores}
    for name, c in clients.items():
        i = c.info()
        print("store %s: engine %s, caps %#x (CUDA %s)" % (name, i.engine, i.caps,
                                                        "yes" if i.caps & kvfs.abi.CAP_CUDA else "no"), flush=True)
    sync = torch.cuda.synchronize
    ms = lambda t: "%.1f" % (t * 1e3)  # noqa: E731
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    # warm up kernels
    first_token(model, torch.randint(0, VOCAB, (1, 512), device="cuda"), cache_from([]))
    sync()
    rows, notes = [], []
    base = 0x77000000
    for n in sizes:
        nb = n // BLOCK_TOKENS - 1  # blocks loaded; the last block is prefilled on top
        ids = [base + i for i in range(nb)]
        base += n
        prompt = torch.randint(0, VOCAB, (1, n), device="cuda", generator=torch.Generator("cuda").manual_seed(n))
        rec = []
        for _ in range(args.repeat):
            from transformers import DynamicCache
            sync()
            t0 = time.perf_counter()
            logits, cache = first_token(model, prompt, DynamicCache())
            sync()
            rec.append(time.perf_counter() - t0)
        ref = [(k[:, :, :nb * BLOCK_TOKENS].contiguous(), v[:, :, :nb * BLOCK_TOKENS].contiguous())
               for k, v in kt._hf_layers(cache)]
        del cache, logits
        kv_bytes = sum(k.numel() * k.element_size() * 2 for k, _ in ref)
        row = {"tokens": n, "recompute": med(rec), "kv_gb": kv_bytes / 1e9}
        for name, c in clients.items():
            kvc = kt.KVCache.hf(c, ref, pin=True, staging_blocks=args.staging_blocks)
            t0 = time.perf_counter()
            st = kvc.store(ids, range(nb))
            row[name + ":store"] = time.perf_counter() - t0
            kvc.close()
            bad = sum(s != kvfs.OK for s in st)
            if bad:
                print("store %s, %d tokens: %d blocks not OK (%s)" % (name, n, bad, kvfs.status_name(
                    next(s for s in st if s != kvfs.OK))))
                return 1
        # one allocation for the whole cache, as engines do: one CUDA registration (the daemon takes
        # at most max_buffers per open file)
        whole = torch.empty((LAYERS, 2) + tuple(ref[0][0].shape), dtype=ref[0][0].dtype, device="cuda")
        fresh = [(whole[l, 0], whole[l, 1]) for l in range(LAYERS)]
        for name, c in clients.items():
            for mode in ("pin", "cuda"):
                col = "%s:%s" % (name, mode)
                try:
                    t0 = time.perf_counter()
                    kvc = kt.KVCache.hf(c, fresh, pin=mode == "pin", staging_blocks=args.staging_blocks)
                    row[col + ":register"] = time.perf_counter() - t0
                except (kvfs.KvfsError, OSError) as e:
                    row[col] = None
                    notes.append("%s at %d tokens: n/a: %s" % (col, n, e))
                    continue
                times, dropped = [], True
                try:
                    for _ in range(args.repeat):
                        whole.zero_()
                        if name == "disk":
                            dropped = drop_caches() and dropped
                        sync()
                        t0 = time.perf_counter()
                        st = kvc.load(ids, range(nb))
                        t1 = time.perf_counter()
                        first_token(model, prompt[:, nb * BLOCK_TOKENS:],
                                    cache_from([(k, v) for k, v in fresh]))
                        sync()
                        t2 = time.perf_counter()
                        times.append((t2 - t0, t1 - t0))
                        if any(s != kvfs.OK for s in st):
                            raise RuntimeError("%s: %d blocks not OK" % (col, sum(s != kvfs.OK for s in st)))
                        if not all(torch.equal(k, rk) and torch.equal(v, rv) for (k, v), (rk, rv) in zip(fresh, ref)):
                            raise RuntimeError("%s: loaded cache differs from the stored one" % col)
                finally:
                    kvc.close()
                row[col] = med([t for t, _ in times])
                row[col + ":load"] = med([t for _, t in times])
                if name == "disk" and not dropped:
                    notes.append("%s: page cache not dropped (no permission): disk loads may be cached" % col)
        rows.append(row)
        del ref, fresh, whole
        torch.cuda.empty_cache()
        print("done %d tokens" % n, flush=True)

    cols = ["%s:%s" % (s, m) for s, _ in stores for m in ("pin", "cuda")]
    print("\nTTFT, ms (median of %d): recompute = prefill of all N tokens; kvfs = load N-16 tokens' KV + "
          "prefill of the last 16" % args.repeat)
    print("| tokens | KV GB | recompute | " + " | ".join(cols) + " |")
    print("|---" * (3 + len(cols)) + "|")
    for r in rows:
        cells = [str(r["tokens"]), "%.2f" % r["kv_gb"], ms(r["recompute"])]
        for c in cols:
            v = r.get(c)
            cells.append("n/a" if v is None else "%s (x%.1f)" % (ms(v), r["recompute"] / v))
        print("| " + " | ".join(cells) + " |")
    print("\nkvfs load alone, ms and GB/s (the LOAD call; registration once per cache, apart):")
    print("| tokens | " + " | ".join(cols) + " |")
    print("|---" * (1 + len(cols)) + "|")
    for r in rows:
        cells = [str(r["tokens"])]
        for c in cols:
            v = r.get(c + ":load")
            cells.append("n/a" if v is None else "%s (%.1f GB/s; reg %s)" % (ms(v), r["kv_gb"] / v,
                                                                          ms(r[c + ":register"])))
        print("| " + " | ".join(cells) + " |")
    print("\nstore (pin=True), ms: " + ", ".join(
        "%d tokens: %s" % (r["tokens"], ", ".join("%s %s" % (s, ms(r[s + ":store"])) for s, _ in stores))
        for r in rows))
    for note in notes:
        print("note: " + note)
    for c in clients.values():
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
