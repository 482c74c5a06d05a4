#!/usr/bin/env python3
"""A real model's KV cache through kvfs, bit for bit (issue 12).

A randomly initialised Llama-architecture model (no weights downloaded:
6 layers, hidden 1024, 8 query heads, 2 kv-heads (GQA), head_dim 128, bf16)
prefills a 1,024-token prompt. Process A stores the prompt's KV cache into
kvfs straight from the GPU, then decodes 32 tokens greedily with the
original cache. Process B (a fresh process: CUDA IPC forbids opening your
own handle, and nothing of A's memory is reachable) builds a fresh cache,
loads the 64 blocks back from kvfs and decodes the same 32 tokens. The
logits of every step must be bit-identical (torch.equal), as must the cache
bytes; exit status 1 otherwise.

    hf_roundtrip.py --geometry                 # the kvfs format flags of the store
    hf_roundtrip.py MOUNT WORKDIR [--mode cuda|pin]

--mode cuda: REGISTER_CUDA (the daemon copies to/from GPU memory); pin: the
client's pinned staging buffer (any daemon). Exit 3 when --mode cuda and the
daemon has no CUDA support (KVFS_CAP_CUDA unset).
"""

import argparse
import errno
import os
import subprocess
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

LAYERS, HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 6, 8, 2, 128, 1024
BLOCK_TOKENS, PROMPT, DECODE, VOCAB = 16, 1024, 32, 32000
BLOCK_BASE = 0x5EED0000
GEOMETRY = ["--layers", str(LAYERS), "--kv-heads", str(KV_HEADS), "--head-dim", str(HEAD_DIM),
            "--block-tokens", str(BLOCK_TOKENS), "--dtype", "bf16"]


def model_and_prompt(workdir, create):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1234)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2816, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=4096,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    try:
        cfg._attn_implementation = "sdpa"
    except Exception:
        pass
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    path = os.path.join(workdir, "hf_roundtrip_model.pt")
    if create:
        torch.save(model.state_dict(), path)
        prompt = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(99)).cuda()
        torch.save(prompt.cpu(), os.path.join(workdir, "hf_roundtrip_prompt.pt"))
    else:
        model.load_state_dict(torch.load(path, map_location="cuda"))
        prompt = torch.load(os.path.join(workdir, "hf_roundtrip_prompt.pt")).cuda()
    return model, prompt


def new_cache():
    from transformers import DynamicCache
    return DynamicCache()


def cache_from(pairs):
    """A DynamicCache holding the given per-layer (K, V), any transformers version."""
    c = new_cache()
    for i, (k, v) in enumerate(pairs):
        c.update(k, v, i)
    return c


def decode(model, cache, tok):
    """DECODE greedy steps from token tok (shape [1, 1]); returns (logits [DECODE, vocab], tokens)."""
    import torch
    logits, toks = [], []
    with torch.no_grad():
        for _ in range(DECODE):
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            lg = out.logits[:, -1, :]
            logits.append(lg.float().clone())
            tok = lg.argmax(-1, keepdim=True)
            toks.append(int(tok))
    return torch.cat(logits), toks


def phase_a(args):
    import torch
    import kvfs
    import kvfs.torch as kt
    model, prompt = model_and_prompt(args.workdir, True)
    with torch.no_grad():
        out = model(input_ids=prompt, past_key_values=new_cache(), use_cache=True)
    cache = out.past_key_values
    first = out.logits[:, -1, :].argmax(-1, keepdim=True)
    pairs = [(k.contiguous(), v.contiguous()) for k, v in kt._hf_layers(cache)]
    torch.save([(k.cpu(), v.cpu()) for k, v in pairs], os.path.join(args.workdir, "hf_roundtrip_cache.pt"))
    nb = PROMPT // BLOCK_TOKENS
    ids = [BLOCK_BASE + i for i in range(nb)]
    with kvfs.Client(args.mount) as c:
        t0 = time.perf_counter()
        try:
            kv = kt.KVCache.hf(c, pairs, pin=args.mode == "pin")
        except kvfs.KvfsError as e:
            print("A: %s" % e)
            return 3 if e.errno == errno.ENOTTY else 1
        t1 = time.perf_counter()
        st = kv.store(ids, range(nb))
        t2 = time.perf_counter()
        kv.close()
    bad = [(hex(b), kvfs.status_name(s)) for b, s in zip(ids, st) if s != kvfs.OK]
    print("A: stored %d blocks (%s): register %.1f ms, store %.1f ms; not OK: %s"
          % (nb, args.mode, (t1 - t0) * 1e3, (t2 - t1) * 1e3, bad or "none"))
    if bad:
        return 1
    logits, toks = decode(model, cache, first)
    torch.save({"first": first.cpu(), "logits": logits.cpu(), "tokens": toks},
               os.path.join(args.workdir, "hf_roundtrip_ref.pt"))
    print("A: decoded %d tokens with the original cache: %s..." % (DECODE, toks[:8]))
    return 0


def phase_b(args):
    import torch
    import kvfs
    import kvfs.torch as kt
    model, prompt = model_and_prompt(args.workdir, False)
    ref = torch.load(os.path.join(args.workdir, "hf_roundtrip_ref.pt"))
    want_cache = torch.load(os.path.join(args.workdir, "hf_roundtrip_cache.pt"))
    nb = PROMPT // BLOCK_TOKENS
    ids = [BLOCK_BASE + i for i in range(nb)]
    pairs = [(torch.full((1, KV_HEADS, PROMPT, HEAD_DIM), float("nan"), dtype=torch.bfloat16, device="cuda"),
              torch.full((1, KV_HEADS, PROMPT, HEAD_DIM), float("nan"), dtype=torch.bfloat16, device="cuda"))
             for _ in range(LAYERS)]
    with kvfs.Client(args.mount) as c:
        try:
            kv = kt.KVCache.hf(c, pairs, pin=args.mode == "pin")
        except kvfs.KvfsError as e:
            print("B: %s" % e)
            return 3 if e.errno == errno.ENOTTY else 1
        t0 = time.perf_counter()
        st = kv.load(ids, range(nb))
        t1 = time.perf_counter()
        kv.close()
    bad = [(hex(b), kvfs.status_name(s)) for b, s in zip(ids, st) if s != kvfs.OK]
    print("B: loaded %d blocks (%s) in %.1f ms into a fresh cache; not OK: %s"
          % (nb, args.mode, (t1 - t0) * 1e3, bad or "none"))
    if bad:
        return 1
    same_cache = all(torch.equal(k.cpu(), wk) and torch.equal(v.cpu(), wv)
                     for (k, v), (wk, wv) in zip(pairs, want_cache))
    print("B: cache bytes identical to A's: %s" % same_cache)
    logits, toks = decode(model, cache_from(pairs), ref["first"].cuda())
    same = torch.equal(logits.cpu(), ref["logits"])
    diff = (logits.cpu() - ref["logits"]).abs().max().item()
    print("B: decoded %d tokens: %s...; tokens equal: %s; logits bit-identical: %s (max |diff| %g)"
          % (DECODE, toks[:8], toks == ref["tokens"], same, diff))
    return 0 if same and same_cache and toks == ref["tokens"] else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mount", nargs="?")
    p.add_argument("workdir", nargs="?")
    p.add_argument("--mode", choices=("cuda", "pin"), default="pin")
    p.add_argument("--phase", choices=("a", "b", "both"), default="both")
    p.add_argument("--geometry", action="store_true", help="print the kvfs format flags and exit")
    args = p.parse_args()
    if args.geometry:
        print(" ".join(GEOMETRY))
        return 0
    if not args.mount or not args.workdir:
        p.error("MOUNT and WORKDIR are required")
    if args.phase == "a":
        return phase_a(args)
    if args.phase == "b":
        return phase_b(args)
    import torch
    import transformers
    print("torch %s, transformers %s, %s" % (torch.__version__, transformers.__version__,
                                             torch.cuda.get_device_name(0)))
    rc = subprocess.call([sys.executable, __file__, args.mount, args.workdir, "--mode", args.mode, "--phase", "a"])
    if rc != 0:
        print("hf_roundtrip %s: FAIL (process A exit %d)" % (args.mode, rc))
        return rc
    rc = subprocess.call([sys.executable, __file__, args.mount, args.workdir, "--mode", args.mode, "--phase", "b"])
    print("hf_roundtrip %s: %s" % (args.mode, {0: "PASS", 3: "n/a (daemon without CUDA)"}.get(rc, "FAIL")))
    return rc


if __name__ == "__main__":
    sys.exit(main())
