#!/usr/bin/env python3
"""Time to first token through kvfs.hf: recompute, a full hit, a 50 % hit loaded layer by layer.

The model: on a GPU (--device cuda, the default) a Llama-3-8B-shaped model
(random weights, bf16: 32 layers, hidden 4096, 32 query heads, 8 kv-heads,
head_dim 128, MLP 14336, vocab 128256); with --tiny a small random Llama
shaped like the store it is given (its layers, kv-heads, head_dim and
dtype; twice as many query heads), which runs on the CPU in seconds: CI
runs this script that way as a smoke test (python/tests/test_ttft_smoke.py).

For each prompt length N (random token ids, N a multiple of the store's
block_tokens), each timed from the call to the first generated token
(a streamer sees it), median of --repeat runs:

* recompute: model.generate from an empty cache: a prefill of all N tokens;
* resident:full, resident:half: model.generate given a cache already in
  the model's memory holding the first N − 16 (N/2) tokens, a copy of the
  recompute's: what a hit costs with no load at all, the floor of the
  columns below (run, as the hits are, with kvfs.hf.suffix_attention:
  fused attention kernels over the cache; --stock-attention runs the
  resident columns and the hits with transformers' sdpa as it is);
* full: kvfs.hf.PrefixCache.generate with every whole block but the last
  stored before (from the recompute's cache): LOOKUP, the load of N − 16
  tokens' KV layer by layer (layer 0 first, the others on a thread while
  the model prefills the last block, layer i waiting only for its own
  data). On a GPU through pin=True (pinned host slots) and through
  REGISTER_CUDA (pin=False); on the CPU into a registered host buffer;
* half: the first N/2 tokens stored, loaded the same way while the model
  prefills the second half.

The hit runs store nothing afterwards, so every repeat finds the same
blocks. Every run generates --new-tokens tokens greedily (after the first
token, untimed); a hit whose tokens differ from the recompute's is
reported, and with --check (the default with --tiny) ends the script with
exit status 1. Blocks are named by a fresh identity per run of the script,
so blocks an earlier run left in the store never serve. A store given with
--disk or --dram has its page cache dropped before each hit where the kernel
lets us; --dram is a disk store mounted with `kvfs mount --dram SIZE`
(docs/performance.md, "DRAM tier"), whose first hit may still read from the
disk what the tier does not hold yet.

    ttft.py --geometry        # the kvfs format flags of the GPU model's stores
    ttft.py --tmpfs MOUNT --disk MOUNT [--dram MOUNT] [--tokens 4096,16384,32768] [--repeat 3]
    ttft.py --device cpu --tiny --mount MOUNT [--tokens 256] [--json out.json]
    ttft.py ... --phases      # also the steps of a full hit loaded in one call

It prints a Markdown table and, last, one line "JSON: {...}" (also written
to --json FILE).
"""

import argparse
import json
import os
import statistics
import sys
import time

try:
    import kvfs  # noqa: F401 - an installed client first
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

LAYERS, HEADS, KV_HEADS, HEAD_DIM, HIDDEN, MLP, VOCAB = 32, 32, 8, 128, 4096, 14336, 128256
BLOCK_TOKENS = 16
GEOMETRY = ["--layers", str(LAYERS), "--kv-heads", str(KV_HEADS), "--head-dim", str(HEAD_DIM),
            "--block-tokens", str(BLOCK_TOKENS), "--dtype", "bf16"]
TINY_VOCAB = 512
TORCH_DTYPES = {1: "bfloat16", 2: "float16", 3: "float32"}


def build_model(device, max_tokens, tiny_info=None):
    """The 8B-shaped model on device, or with tiny_info (a store's Info) a
    small one shaped like that store."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    if tiny_info is None:
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=MLP, num_hidden_layers=LAYERS,
                          num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                          max_position_embeddings=max(8192, max_tokens + 64), rope_theta=500000.0,
                          rms_norm_eps=1e-5, tie_word_embeddings=False)
        dtype = torch.bfloat16
    else:
        i = tiny_info
        head_dim = i.row_bytes // i.dtype_bytes
        heads = 2 * i.kv_heads
        cfg = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=heads * head_dim, intermediate_size=2 * heads * head_dim,
                          num_hidden_layers=i.layers, num_attention_heads=heads, num_key_value_heads=i.kv_heads,
                          head_dim=head_dim, max_position_embeddings=max(1024, max_tokens + 64),
                          tie_word_embeddings=False, initializer_range=0.1)
        dtype = getattr(torch, TORCH_DTYPES[i.dtype])
    cfg.bos_token_id = cfg.eos_token_id = None
    cfg.pad_token_id = 0
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model = model.to(dtype).eval()
    model.generation_config.eos_token_id = None  # decode exactly --new-tokens
    model.generation_config.pad_token_id = 0
    return model


class FirstToken:
    """A generate() streamer that notes when the first new token arrives
    (generate puts the prompt first, then each new token)."""

    def __init__(self):
        self.puts, self.at = 0, None

    def put(self, value):
        self.puts += 1
        if self.puts == 2 and self.at is None:
            self.at = time.perf_counter()

    def end(self):
        pass


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


class Unserved(Exception):
    """A hit run fell back to recompute (the load failed: kvfs.hf warned why)."""


class Run:
    """One store's mount and what the script measures through it."""

    def __init__(self, name, mount, drop):
        self.name, self.mount, self.drop = name, mount, drop


def generate(model, prompt, new_tokens, pc=None, cache=None):
    """(seconds to the first token, generated token ids, the cache) of one
    greedy generation, through pc (a PrefixCache) or model.generate."""
    import torch
    from kvfs.hf import cache_kwarg
    from transformers import DynamicCache
    st = FirstToken()
    kw = dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, streamer=st,
              attention_mask=torch.ones_like(prompt))
    sync()
    t0 = time.perf_counter()
    if pc is not None:
        out = pc.generate(prompt, **kw)
    else:
        cache = DynamicCache() if cache is None else cache
        with torch.no_grad():
            out = model.generate(prompt, **{cache_kwarg(model): cache}, **kw)
    sync()
    return st.at - t0, out[0, prompt.shape[1]:].tolist(), cache


def sync():
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def measure(args, model, runs, device, identity, bt):
    import torch
    import kvfs.hf as khf
    sizes = [int(x) for x in args.tokens.split(",")]
    rows, notes, mismatches = [], [], 0
    vocab = model.config.vocab_size
    # warm up kernels (untimed)
    generate(model, torch.randint(0, vocab, (1, min(512, sizes[0])), device=device), 1)
    for n in sizes:
        g = torch.Generator().manual_seed(n)
        prompt = torch.randint(0, vocab, (1, n), generator=g).to(device)
        rec, toks, cache = [], None, None
        for _ in range(args.repeat):
            t, toks, cache = generate(model, prompt, args.new_tokens)
            rec.append(t)
        row = {"tokens": n, "recompute_ms": statistics.median(rec) * 1e3, "recompute_tokens": toks}
        ref_cache = cache
        for col, keep in (("resident:full", n - bt), ("resident:half", n // 2)):
            times = []
            for _ in range(args.repeat):
                c = _prefix_cache(ref_cache, keep)
                with khf.suffix_attention(model, not args.stock_attention):
                    t, got, _ = generate(model, prompt, args.new_tokens, cache=c)
                times.append(t)
                del c
                if got != toks:
                    notes.append("%s at %d tokens: generated %s, recompute %s" % (col, n, got, toks))
            row[col + "_ms"] = statistics.median(times) * 1e3
        kvb = sum(k.numel() * k.element_size() * 2 for k, _ in _layers(ref_cache))
        row["kv_gb"] = kvb * (n - bt) / cache.get_seq_length() / 1e9
        for r in runs:
            modes = [("full:pin", True), ("full:cuda", False)] if device == "cuda" else [("full", False)]
            modes.append(("half:layerwise", None))
            for mode, pin in modes:
                col = "%s:%s" % (r.name, mode)
                half = pin is None
                # full:pin and full:cuda load the same blocks: stored once (the second store finds them)
                ident = "%s %s %s %d" % (identity, r.name, "half" if half else "full", n)
                # PrefixCache's defaults, as a user gets them: layer by layer through REGISTER_CUDA, one call with pin
                extra = {"layers_per_load": args.layers_per_load} if args.layers_per_load else {}
                extra["suffix_attention"] = not args.stock_attention
                if args.loads_in_flight:
                    extra["loads_in_flight"] = args.loads_in_flight
                pc = khf.PrefixCache(r.mount, model, identity=ident, pin=bool(pin), **extra)
                try:
                    pc.store(prompt[:, :n // 2] if half else prompt, ref_cache)
                    pc.store = lambda *a, **k: 0  # the timed runs leave the store as it is
                    times, dropped, waits, loads = [], True, [], []
                    for _ in range(args.repeat):
                        if r.drop:
                            dropped = drop_caches() and dropped
                        before = dict(pc.stats)
                        t, got, _ = generate(model, prompt, args.new_tokens, pc=pc)
                        times.append(t)
                        waits.append(pc.stats["layerwise_wait_s"] - before["layerwise_wait_s"])
                        loads.append(pc.stats["layerwise_load_s"] - before["layerwise_load_s"])
                        loaded = pc.stats["loaded_blocks"] - before["loaded_blocks"]
                        want = (n // 2) // pc.block_tokens if half else (n - 1) // pc.block_tokens
                        if pc.stats["fallbacks"] != before["fallbacks"]:
                            raise Unserved("%s: the load failed and generation recomputed (stats %s)"
                                           % (col, pc.stats))
                        if loaded != want:
                            raise RuntimeError("%s: %d blocks loaded of %d (stats %s)" % (col, loaded, want, pc.stats))
                        if pc.stats["layerwise_loads"] - before["layerwise_loads"] != int(pc.layerwise):
                            raise RuntimeError("%s: layer by layer %s, loaded otherwise (stats %s)"
                                               % (col, pc.layerwise, pc.stats))
                        if got != toks:
                            mismatches += 1
                            notes.append("%s at %d tokens: generated %s, recompute %s" % (col, n, got, toks))
                    if r.drop and not dropped:
                        notes.append("%s: page cache not dropped (no permission): loads may be cached" % col)
                    row[col + "_ms"] = statistics.median(times) * 1e3
                    if pc.layerwise:
                        # the loader threads' time (from their start to the last load's end), and the forward's wait for it
                        row.setdefault("layerwise", {})[col] = {"load_ms": statistics.median(loads) * 1e3,
                                                                "wait_ms": statistics.median(waits) * 1e3}
                except (Unserved, OSError) as e:
                    # REGISTER_CUDA is optional in a daemon: its column says n/a
                    if device == "cuda" and pin is False:
                        row[col + "_ms"] = None
                        notes.append("%s at %d tokens: n/a: %s" % (col, n, e))
                        continue
                    raise
                finally:
                    pc.close()
        if args.phases:
            row["phases"] = phases(model, runs[0], prompt, args, identity, ref_cache, device)
        rows.append(row)
        del ref_cache, cache
        if device == "cuda":
            torch.cuda.empty_cache()
        print("done %d tokens" % n, file=sys.stderr, flush=True)
    return rows, notes, mismatches


PHASES = ("ids+names", "lookup", "load_blocks", "cache", "first_token")


def phases(model, run, prompt, args, identity, ref_cache, device):
    """Median ms of each step of a full hit loaded in one call before the
    model runs (layerwise=False; pin=False, REGISTER_CUDA, on a GPU), each
    step synchronized: the prompt's ids and block names, LOOKUP,
    LOAD_BLOCKS into the load area, the DynamicCache's assembly (its one
    copy) and model.generate to the first token. Through run's store."""
    import torch
    import kvfs.hf as khf
    from transformers import DynamicCache
    pc = khf.PrefixCache(run.mount, model, identity="%s phases %d" % (identity, prompt.shape[1]), layerwise=False)
    times = {k: [] for k in PHASES}
    try:
        pc.store(prompt, ref_cache)
        c = pc._connect()
        for _ in range(args.repeat):
            if run.drop:
                drop_caches()
            sync()
            t = [time.perf_counter()]
            keys = khf.block_keys(pc.salt(), khf._token_raw(prompt)[0], pc.block_tokens,
                                  (prompt.shape[1] - 1) // pc.block_tokens)
            t.append(time.perf_counter())
            n = c.lookup([(k.block, k.tag) for k in keys]).run
            t.append(time.perf_counter())
            layers, n = pc._load_blocks(keys[:n], torch.device(device))
            sync()
            t.append(time.perf_counter())
            cache = DynamicCache()
            for l, (k, v) in enumerate(layers):
                khf._put(cache, l, k, v, copy=True)
            sync()
            t.append(time.perf_counter())
            st = FirstToken()
            with torch.no_grad(), khf.suffix_attention(model, not args.stock_attention):
                model.generate(prompt, **{khf.cache_kwarg(model): cache}, do_sample=False, max_new_tokens=1,
                               streamer=st, attention_mask=torch.ones_like(prompt))
            t.append(st.at)
            for i, k in enumerate(PHASES):
                times[k].append((t[i + 1] - t[i]) * 1e3)
            del cache, layers
    finally:
        pc.close()
    return {k: statistics.median(v) for k, v in times.items()}


def _prefix_cache(cache, tokens):
    """A DynamicCache of copies of cache's first tokens tokens."""
    from transformers import DynamicCache
    c = DynamicCache()
    for l, (k, v) in enumerate(_layers(cache)):
        c.update(k[:, :, :tokens].clone(), v[:, :, :tokens].clone(), l)
    sync()
    return c


def _layers(cache):
    from kvfs.torch import _hf_layers
    return _hf_layers(cache)


def table(rows, cols, repeat, bt):
    out = ["TTFT, ms (median of %d; × = recompute / this): recompute = prefill of all N tokens; full = load "
           "N − %d tokens' KV + prefill of the last block; half = load N/2; both layer by layer while the model "
           "prefills the rest; resident = the same with the KV already in the model's memory (no load)" % (repeat, bt),
           "| tokens | KV GB | recompute | " + " | ".join(cols) + " |",
           "|---" * (3 + len(cols)) + "|"]
    for r in rows:
        cells = [str(r["tokens"]), "%.3f" % r["kv_gb"], "%.1f" % r["recompute_ms"]]
        for c in cols:
            v = r.get(c + "_ms")
            cells.append("n/a" if v is None else "%.1f (×%.1f)" % (v, r["recompute_ms"] / v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a small random Llama shaped like the (first) store")
    p.add_argument("--mount", help="mount of a store (its page cache is left alone)")
    p.add_argument("--tmpfs", help="mount of the store on tmpfs")
    p.add_argument("--disk", help="mount of the store on disk (page cache dropped before each hit)")
    p.add_argument("--dram", help="mount of a store on disk mounted with kvfs mount --dram (page cache dropped "
                   "before each hit; a block the tier does not hold yet is read from the disk)")
    p.add_argument("--tokens", help="prompt lengths [4096,16384,32768; --tiny: 256]")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per cell (the median is reported)")
    p.add_argument("--new-tokens", type=int, default=4, help="tokens each run generates (the first is timed)")
    p.add_argument("--check", action="store_true", help="exit 1 when a hit generates other tokens than recompute "
                   "(the default with --tiny)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--geometry", action="store_true", help="print the kvfs format flags and exit")
    p.add_argument("--layers-per-load", type=int, default=0,
                   help="PrefixCache's layers_per_load for the hits (0: its default)")
    p.add_argument("--loads-in-flight", type=int, default=0,
                   help="PrefixCache's loads_in_flight for the hits (0: its default)")
    p.add_argument("--stock-attention", action="store_true",
                   help="hits and resident columns with transformers' sdpa as it is (PrefixCache(suffix_attention=False))")
    p.add_argument("--phases", action="store_true", help="also time the steps of a full hit loaded in one call "
                   "(through the first store given)")
    args = p.parse_args()
    if args.geometry:
        print(" ".join(GEOMETRY))
        return 0
    runs = [Run(n, m, n in ("disk", "dram")) for n, m in (("mount", args.mount), ("tmpfs", args.tmpfs),
                                                          ("disk", args.disk), ("dram", args.dram)) if m]
    if not runs:
        p.error("give at least one of --mount, --tmpfs, --disk, --dram")
    args.tokens = args.tokens or ("256" if args.tiny else "4096,16384,32768")
    check = args.check or args.tiny
    import torch
    import transformers
    import kvfs

    with kvfs.Client(runs[0].mount) as c:
        info = c.info()
    if any(int(x) % info.block_tokens or int(x) < 2 * info.block_tokens for x in args.tokens.split(",")):
        p.error("--tokens: each a multiple of the store's block_tokens (%d), at least two blocks" % info.block_tokens)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("ttft.py: no CUDA device (run with --device cpu --tiny on the CPU)", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (%d threads)" % torch.get_num_threads()
    print("torch %s, transformers %s, %s" % (torch.__version__, transformers.__version__, where), flush=True)
    model = build_model(args.device, max(int(x) for x in args.tokens.split(",")), info if args.tiny else None)
    print("model: %.4g M parameters, %s, %d layers, %d kv-heads" % (
        sum(q.numel() for q in model.parameters()) / 1e6, model.dtype, model.config.num_hidden_layers,
        model.config.num_key_value_heads), flush=True)
    identity = "ttft %s" % os.urandom(8).hex()
    rows, notes, mismatches = measure(args, model, runs, args.device, identity, info.block_tokens)
    cols = [c[:-3] for c in rows[0] if c.endswith("_ms") and c != "recompute_ms"]
    print()
    print(table(rows, cols, args.repeat, info.block_tokens))
    for note in notes:
        print("note: " + note)
    lw = [(r["tokens"], col, v) for r in rows for col, v in r.get("layerwise", {}).items()]
    if lw:
        print()
        print("Layer-by-layer hits: ms the loader's threads took, and the forward waited for them (median of %d):"
              % args.repeat)
        print("| tokens | hit | loads | waits |")
        print("|---|---|---|---|")
        for n, col, v in lw:
            print("| %d | %s | %.1f | %.1f |" % (n, col, v["load_ms"], v["wait_ms"]))
    if args.phases:
        print()
        print("A full hit loaded in one call, step by step (%s store, ms, median of %d):" % (runs[0].name, args.repeat))
        print("| tokens | " + " | ".join(PHASES) + " |")
        print("|---" * (1 + len(PHASES)) + "|")
        for r in rows:
            print("| %d | " % r["tokens"] + " | ".join("%.1f" % r["phases"][k] for k in PHASES) + " |")
    result = {"device": where, "torch": torch.__version__, "transformers": transformers.__version__,
              "model": "tiny" if args.tiny else "llama-3-8b-shaped", "dtype": str(model.dtype),
              "block_tokens": info.block_tokens, "repeat": args.repeat, "new_tokens": args.new_tokens, "rows": rows,
              "notes": notes, "tokens_match": mismatches == 0}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print("JSON: " + json.dumps(result))
    if check and mismatches:
        print("ttft.py: %d hit runs generated other tokens than recompute" % mismatches, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
