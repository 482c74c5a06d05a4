"""A prefix cache for Hugging Face transformers through kvfs (docs/abi.md, "Python and PyTorch").

Any process on the node that computed a prompt's KV cache leaves its whole
blocks in the store; the next prompt sharing that prefix loads them instead
of recomputing them::

    import kvfs.hf
    pc = kvfs.hf.PrefixCache("/mnt/kvcache", model)
    out = pc.generate(input_ids, max_new_tokens=64)   # model.generate, reusing stored prefixes

    # an engine that owns its loop
    pc.cached_tokens(input_ids)        # [n]: tokens stored, per sequence (one LOOKUP, nothing loaded)
    cache, n = pc.load(input_ids)      # a DynamicCache of the first n tokens (whole blocks)
    out = model(input_ids[:, n:], cache=cache, use_cache=True)
    pc.store(input_ids, cache)         # the whole blocks not stored yet, with their parents

Naming. The prompt is cut into blocks of the store's block_tokens. Block i
is named by a chained hash, blake2b over block i-1's hash and block i's
token ids, starting from a salt of everything that makes the KV differ: the
model's config (name_or_path included), a sample of its weights, the cache
dtype, the tensor-parallel shard (kv-head range) and the layer range, the
store's geometry and any ``identity`` the caller adds. The first 8 bytes of
the hash are the block id, the next 16 its tag (docs/abi.md, "Minor 3"):
the store serves a block only under the tag it was stored with, and each
block is stored with its parent so prefix-aware eviction keeps roots.

Storing. store() stores the whole blocks a cache holds that the store has
not, durably; generate() stores the prompt's and, with store_generated
(the default), those of the tokens it generated, so a conversation's next
turn (prompt, answer, new message) finds the answer's KV stored too.

Never a wrong answer. LOOKUP gives the leading run of stored blocks; they
are loaded in one call with their tags checked. The usable prefix ends at
the first block that is not OK (evicted since the lookup, failed its CRC,
stored under another tag); the rest is recomputed. At least one token of
the prompt is never loaded, so the model computes the logits of the next
token. A daemon that is down (no control file, a dead mount, any error of
the control file) makes load() return an empty cache and store() store
nothing, with one warning per outage (warnings.warn, RuntimeWarning):
generation goes on by recomputing. With a mountpoint (not a Client) the
control file is reopened on the next call, so a restarted daemon is used
again.

Memory. On the CPU the blocks are loaded into a registered host buffer
laid out as the cache ([heads, tokens, head_dim] per layer and kind). On a
GPU they land in a load area, one allocation kept from load to load:
REGISTER_CUDA lets the daemon copy into it directly; pin=True goes through
pinned host memory (kvfs.torch's staging for load(), a ring of per-layer
slots for generate()). load() gives the cache copies of its own;
generate() hands the model views of that memory, which its first forward
concatenates onto (a new tensor per layer), so the bytes are copied once.

Bit for bit. KV computed in one forward over many tokens may differ in the
lowest bits from KV computed block by block (the matmuls and attention run
with other shapes). prefill_blocks=1 computes every uncached block in its
own forward, so the KV of block i is the same computation whether blocks
before it came from the store or not: generation with and without kvfs is
then identical (without kvfs under suffix_attention, the attention
PrefixCache runs: see below). The default (None) lets model.generate
prefill the uncached rest in one forward, the fastest.

Attention. PrefixCache runs its forwards under suffix_attention(model)
(suffix_attention=True; a model of transformers' sdpa attention): the
rest of a prompt attends its loaded prefix through SDPA with a
lower-right causal bias and grouped kv-heads (FlashAttention's kernel on
a GPU) instead of transformers' materialized mask over repeated kv-heads;
every other forward is transformers' sdpa as it is.

Layer by layer. generate() (layerwise=True, the default but with pin=True,
whose layer-by-layer path through pinned host slots is slower than its one
call: docs/performance.md, "TTFT with a real model") loads layer 0 of
the hit first (the model reads the cache's length from it) and the other
layers on threads while the model runs, layers_per_load layers (8) per
LOAD_BLOCKS, the first and last loads fewer; a pre-forward hook
on decoder layer i waits only for layer i's data. A full
hit thus overlaps its load with the last block's prefill, a partial one
with the prefill of the rest. A layer that loads fewer blocks than layer 0
stops the forward, and generation starts again from the blocks every
layer holds. layerwise=False loads every layer in one call first.

Batches. input_ids of a batch of B equal-length sequences (a [B, n] tensor,
or B lists of n ids) is B prompts, each named by its own blocks: load()
gives a DynamicCache of batch B holding the blocks every sequence has
stored (the shortest of their stored prefixes), store() stores each
sequence's new blocks, generate() does both around model.generate. A
left-padded batch (attention_mask zeros, then ones, per row, as tokenizers
pad for generation) is named by each row's tokens after its pads: row b's
stored blocks land in the columns after its pads, every row is cut at the
first column some row has no KV for, and the pads' columns are zeros the
mask hides. Layer-by-layer loading is for one sequence (a batch loads all
layers at once). With num_beams or num_return_sequences, model.generate runs that
many rows per sequence: generate() gives it a cache of each sequence's
prefix repeated (load and store take expand= for an engine's own loop).

Limits: decoder-only models whose every layer is a full-attention
DynamicLayer (no sliding window, no linear attention).
"""

import array
import ctypes
import errno
import functools
import hashlib
import inspect
import os
import sys
import threading
import time
import warnings

from . import abi
from . import BlockArray, BlockEntry, Client, OK, LOOKUP_PRESENT

__all__ = ["PrefixCache", "model_salt", "block_keys", "BlockKey", "suffix_attention"]

TORCH_DTYPES = {1: "bfloat16", 2: "float16", 3: "float32"}


class BlockKey(tuple):
    """(block id, 16-byte tag, parent id or None) of one prompt block."""
    __slots__ = ()

    def __new__(cls, block, tag, parent):
        return tuple.__new__(cls, (block, tag, parent))

    block = property(lambda s: s[0])
    tag = property(lambda s: s[1])
    parent = property(lambda s: s[2])


def block_keys(salt, token_ids, block_tokens, n_blocks=None):
    """The BlockKey of each whole block of token_ids (the first n_blocks).

    h_0 = salt; h_i = blake2b(h_(i-1) || token ids of block i as int64 LE);
    block id = h_i[0:8] (little-endian), tag = h_i[8:24]. A block's name
    fixes every token before it, so equal names mean equal prefixes.
    token_ids: ints, or their int64 little-endian bytes."""
    raw = token_ids if isinstance(token_ids, (bytes, bytearray, memoryview)) else _ids_bytes(token_ids)
    return _chain(salt, raw, block_tokens, n_blocks)


def _ids_bytes(ids):
    """Token ids as int64 little-endian bytes."""
    a = array.array("q", [int(x) for x in ids])
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        a.byteswap()
    return a.tobytes()


def _chain(salt, raw, block_tokens, n_blocks):
    total = len(raw) // 8
    if n_blocks is None:
        n_blocks = total // block_tokens
    if n_blocks * block_tokens > total:
        raise ValueError("%d blocks of %d tokens from %d tokens" % (n_blocks, block_tokens, total))
    raw = memoryview(raw)
    step = block_tokens * 8
    h = bytes(salt)
    out, parent = [], None
    zero = bytes(abi.TAG_SIZE)
    for i in range(n_blocks):
        d = hashlib.blake2b(h, digest_size=32)
        d.update(raw[i * step:(i + 1) * step])
        h = d.digest()
        block = int.from_bytes(h[:8], "little")
        tag = h[8:24]
        if tag == zero:  # the zero tag means "no tag"
            tag = b"\x01" + tag[1:]
        if block == parent:  # a block cannot be its own parent
            block ^= 1
        out.append(BlockKey(block, tag, parent))
        parent = block
    return out


def _weights_sample(model, per_tensor=16):
    """Bytes of the first and last elements of every parameter and buffer:
    two models of one config with other weights (another fine-tune, another
    random initialisation) get another salt."""
    import torch
    h = hashlib.blake2b(digest_size=32)
    with torch.no_grad():
        for name, t in sorted(list(model.named_parameters()) + list(model.named_buffers()), key=lambda x: x[0]):
            flat = t.detach().reshape(-1)
            n = flat.numel()
            idx = list(range(min(per_tensor, n))) + list(range(max(per_tensor, n - per_tensor), n))
            sample = flat[idx].to("cpu").contiguous()
            h.update(("%s %s %s;" % (name, tuple(t.shape), t.dtype)).encode())
            h.update(bytes(sample.view(torch.uint8).tolist()) if sample.numel() else b"")
    return h.digest()


def model_salt(model, info=None, head_first=0, head_count=None, layer_first=0, identity=None, weights=True):
    """The 32-byte salt of block names: the model's config (name_or_path
    included), a sample of its weights (weights=True), its dtype, the
    kv-head and layer range this process holds, the store's geometry (info)
    and identity (bytes or str, anything else the caller knows makes KV
    differ, e.g. a LoRA adapter)."""
    cfg = model.config
    try:
        cfg_json = cfg.to_json_string(use_diff=False)
    except TypeError:  # pragma: no cover - very old transformers
        cfg_json = cfg.to_json_string()
    h = hashlib.blake2b(digest_size=32, person=b"kvfs.hf salt")
    parts = ["config=" + cfg_json, "name=" + str(getattr(cfg, "name_or_path", "") or ""),
             "dtype=" + str(getattr(model, "dtype", "")), "heads=%s+%s" % (head_first, head_count),
             "layers=%d" % layer_first]
    if info is not None:
        parts.append("store=%d,%d,%d,%d,%d" % (info.layers, info.kv_heads, info.row_bytes, info.block_tokens,
                                               info.dtype))
    for p in parts:
        h.update(p.encode() + b"\0")
    if weights:
        h.update(_weights_sample(model))
    if identity is not None:
        h.update(b"identity\0" + (identity.encode() if isinstance(identity, str) else bytes(identity)))
    return h.digest()


def _token_rows(input_ids):
    """The sequences of input_ids as lists of ints: a [B, n] or [n] tensor,
    B lists of ids, or one list. The sequences of a batch must be of one
    length (a padded batch is one length, its mask saying where each row starts)."""
    if hasattr(input_ids, "dim"):
        rows = input_ids.tolist() if input_ids.dim() == 2 else [input_ids.tolist()]
    else:
        ids = list(input_ids)
        rows = [list(r) for r in ids] if ids and isinstance(ids[0], (list, tuple)) else [ids]
    rows = [[int(x) for x in r] for r in rows]
    if len({len(r) for r in rows}) > 1:
        raise ValueError("kvfs.hf takes sequences of one length (pad them on the left, with an attention_mask); "
                         "these are %s tokens long" % sorted({len(r) for r in rows}))
    return rows


def _token_raw(input_ids):
    """The sequences of input_ids as int64 little-endian bytes, one per
    sequence (of one length, as _token_rows); a tensor is converted
    without a list of Python ints."""
    if not hasattr(input_ids, "dim") or sys.byteorder != "little":
        return [_ids_bytes(r) for r in _token_rows(input_ids)]
    import torch
    t = input_ids.detach()
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2:
        raise ValueError("input_ids: a [B, n] or [n] tensor, not %s" % (tuple(t.shape),))
    t = t.to("cpu", torch.int64).contiguous()
    n = t.shape[1] * 8
    raw = ctypes.string_at(t.data_ptr(), t.shape[0] * n) if t.numel() else b""
    return [raw[b * n:(b + 1) * n] for b in range(t.shape[0])]


def cache_kwarg(model):
    """The name of the cache argument of model.forward (transformers 5:
    "cache"; before: "past_key_values")."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _exclusive(method):
    """A PrefixCache method that takes the cache's buffers: a call from a
    second thread while one runs is refused (RuntimeError), not let to
    load into memory the first call's model still reads."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("kvfs.hf: PrefixCache.%s while another thread is in this PrefixCache; "
                               "use one PrefixCache per thread" % method.__name__)
        try:
            return method(self, *args, **kwargs)
        finally:
            self._busy.release()
    return call


class PrefixCache:
    """Reuses stored prompt prefixes for one model (see the module doc).

    client: a kvfs.Client, or a mountpoint (opened on first use, reopened
    after the daemon was down). model: a transformers causal LM. tp_rank,
    tp_size: which kv-heads this process holds (kvfs.torch.tp_head_range).
    layer_first: the model layer of the cache's layer 0 (pipeline stages).
    identity: added to the salt (bytes or str). pin: the GPU path of
    kvfs.torch. prefill_blocks: blocks per prefill forward in generate() and
    prefill() (None: one forward for the uncached rest). layerwise: whether
    generate() loads a hit layer by layer while the model runs (one
    sequence; a batch loads every layer at once; None, the default: unless
    pin, whose layer-by-layer path is slower than its one call), layers_per_load layers a
    LOAD_BLOCKS after layer 0 (the first and last few fewer), loads_in_flight of those
    LOAD_BLOCKS at once (pin's layer-by-layer path: one; 8 and 2 gave the
    shortest 32K hit on an H100, docs/performance.md). suffix_attention:
    whether the model's forwards run kvfs.hf.suffix_attention (fused
    attention of the prompt's rest over the loaded prefix; a model of
    sdpa attention). store_generated: whether
    generate() also stores the whole blocks of the tokens it generated (a
    conversation's next turn then finds its last answer stored; not with
    beam search, whose cache rows are not the sequences it returns).

    One PrefixCache serves one thread at a time (one per engine worker): a
    call from a second thread while one runs raises RuntimeError.

    .stats counts what happened: lookups, hit_blocks (the leading run
    LOOKUP reported), loaded_blocks (usable after the load), stored_blocks,
    failed_blocks (not OK in a load: evicted, corrupt, another tag) and
    fallbacks (calls that recomputed because the daemon was down). For a
    batch the blocks count once per sequence (hit_blocks: the run all its
    sequences have, times their number)."""

    def __init__(self, client, model, tp_rank=0, tp_size=1, layer_first=0, identity=None, pin=False,
                 prefill_blocks=None, weights_salt=True, layerwise=None, store_generated=True, layers_per_load=8,
                 loads_in_flight=2, suffix_attention=True):
        self.model = model
        self.tp_rank, self.tp_size, self.layer_first = tp_rank, tp_size, layer_first
        self.identity = identity
        self.pin = pin
        self.prefill_blocks = prefill_blocks
        self.weights_salt = weights_salt
        # pin=True's layer-by-layer path (pinned ring slots, a copy each)
        # measured slower on an H200 than its one call: 1.36 s against
        # 0.41 s for a 32K full hit (docs/performance.md)
        self.layerwise = (not pin) if layerwise is None else layerwise
        self.store_generated = store_generated
        if layers_per_load < 1:
            raise ValueError("layers_per_load %d: want 1 or more" % layers_per_load)
        self.layers_per_load = layers_per_load
        if loads_in_flight < 1:
            raise ValueError("loads_in_flight %d: want 1 or more" % loads_in_flight)
        self.loads_in_flight = loads_in_flight
        self.suffix_attention = suffix_attention
        self.stats = dict(lookups=0, hit_blocks=0, loaded_blocks=0, stored_blocks=0, failed_blocks=0, fallbacks=0,
                          layerwise_loads=0, layerwise_retries=0, layerwise_load_s=0.0, layerwise_wait_s=0.0)
        self._check_model()
        self._own_client = not isinstance(client, Client)
        self._mount = None if not self._own_client else os.fspath(client)
        self._client = None if self._own_client else client
        self._info = None
        self._salt = None
        self._host = None      # (HostBuffer, target id, capacity in blocks, torch view)
        self._area = None      # _Area: where GPU loads land (_load_area)
        self._ring = None      # _Ring: pinned host slots of pin=True's layer-by-layer loads
        self._down = False
        self._busy = threading.RLock()  # _exclusive: generate() calls load() and store() itself
        if self._client is not None:
            self._bind(self._client)

    # -- setup --------------------------------------------------------------

    def _check_model(self):
        cfg = self.model.config
        cfg = getattr(cfg, "get_text_config", lambda: cfg)()
        # Sliding-window layers keep every token in a plain DynamicCache (the
        # mask applies the window), so their blocks are whole; recurrent or
        # linear-attention layers have no per-token KV to store.
        types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        other = types - {"full_attention", "sliding_attention"}
        if other:
            raise ValueError("kvfs.hf caches attention layers only; this model has %s" % ", ".join(sorted(other)))
        # A model spread over devices (accelerate's device_map) keeps each
        # layer's cache on that layer's device; kvfs.hf loads every layer to
        # one device.
        devices = set(str(d) for d in (getattr(self.model, "hf_device_map", None) or {}).values())
        if len(devices) > 1:
            raise ValueError("kvfs.hf loads a cache onto one device; this model is spread over %s (device_map): "
                             "load it onto one device, or give each pipeline stage its own PrefixCache "
                             "(layer_first)" % ", ".join(sorted(devices)))
        self.layers = cfg.num_hidden_layers
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.dtype = self.model.dtype

    def _bind(self, client):
        """Check the store against the model and derive the salt (once)."""
        from .torch import tp_head_range
        info = client.info()
        if not info.caps & abi.CAP_PREFIX:
            raise OSError(errno.EOPNOTSUPP, "kvfs.hf: the daemon has no block tags or LOOKUP (ABI minor 3)")
        want = TORCH_DTYPES.get(info.dtype)
        es = self.dtype.itemsize if hasattr(self.dtype, "itemsize") else None
        problems = []
        if want is None or str(self.dtype) != "torch." + want:
            problems.append("the store holds %s, the model computes %s"
                            % (abi.DTYPES.get(info.dtype, info.dtype), self.dtype))
        if self.layer_first + self.layers > info.layers:
            problems.append("the model's layers %d..%d are outside the store's %d"
                            % (self.layer_first, self.layer_first + self.layers - 1, info.layers))
        if self.kv_heads != info.kv_heads:
            problems.append("the model has %d kv-heads, the store %d" % (self.kv_heads, info.kv_heads))
        if es is not None and self.head_dim * es != info.row_bytes:
            problems.append("head_dim %d x %d bytes, the store's rows are %d bytes"
                            % (self.head_dim, es, info.row_bytes))
        if problems:
            raise ValueError("kvfs.hf: the store does not fit the model: " + "; ".join(problems))
        hf, hc = tp_head_range(info.kv_heads, self.tp_rank, self.tp_size)
        if self._info is None:
            self._salt = model_salt(self.model, info, hf, hc, self.layer_first, self.identity, self.weights_salt)
        self._info = info
        self.head_first, self.head_count = hf, hc
        self.block_tokens = info.block_tokens

    def _connect(self):
        if self._client is None:
            c = Client(self._mount)
            try:
                self._bind(c)
            except BaseException:
                c.close()
                raise
            self._client = c
        return self._client

    def _failed(self, what, err):
        """The daemon is down or refused: drop what belongs to the old
        connection, warn once per outage."""
        self.stats["fallbacks"] += 1
        self.close()
        if not self._down:
            self._down = True
            warnings.warn("kvfs.hf: %s failed, recomputing without the kvfs cache: %s" % (what, err),
                          RuntimeWarning, stacklevel=3)

    def salt(self):
        """The salt of block names (connects first if needed)."""
        self._connect()
        return self._salt

    def keys(self, input_ids, n_blocks=None):
        """The BlockKeys of input_ids' whole blocks (connects first if needed):
        of its one sequence, or for a batch a list of each sequence's."""
        self._connect()
        rows = _token_raw(input_ids)
        keys = [block_keys(self._salt, r, self.block_tokens, n_blocks) for r in rows]
        return keys[0] if len(rows) == 1 and not _batched(input_ids) else keys

    # -- host memory --------------------------------------------------------

    def _host_view(self, n_blocks):
        """A registered host buffer and target for n_blocks cache blocks,
        [layers, 2, heads, blocks·block_tokens, head_dim]; grown by powers
        of two."""
        import torch
        if self._host is not None and self._host[2] >= n_blocks:
            return self._host
        self._drop_host()
        c, i = self._client, self._info
        cap = 1
        while cap < n_blocks:
            cap *= 2
        tokens = cap * i.block_tokens
        region = self.head_count * tokens * i.row_bytes
        buf = c.create_host_buffer(2 * self.layers * region)
        try:
            t = c.hf_target(tokens, [(buf.id, r * region) for r in range(2 * self.layers)], self.layer_first,
                            self.layers, self.head_first, self.head_count)
            tid = c.register_target(t)
        except BaseException:
            buf.close()
            raise
        view = torch.frombuffer(buf.mm, dtype=torch.uint8).view(self.dtype).view(
            self.layers, 2, self.head_count, tokens, self.head_dim)
        self._host = (buf, tid, cap, view)
        return self._host

    def _drop_host(self):
        if self._host is None:
            return
        buf, tid, _, view = self._host
        self._host = None
        del view  # the tensor over the mapping goes first, or the mapping cannot close
        try:
            self._client.unregister_target(tid)
        except OSError:
            pass
        try:
            buf.close()
        except (OSError, BufferError):
            pass

    # -- the API ------------------------------------------------------------

    @_exclusive
    def load(self, input_ids, device=None, expand=1, attention_mask=None):
        """A DynamicCache holding the stored leading blocks of input_ids, and
        how many tokens it holds (a multiple of block_tokens, at most
        len(input_ids) - 1). For a batch, the blocks every sequence has
        (each its own), a cache of the batch's size. Nothing stored, or the
        daemon down: an empty DynamicCache and 0. device: of the cache
        (default: the model's). expand: rows per sequence (beam search's
        num_beams; sequence b in rows b·expand ..). attention_mask: of a
        left-padded batch (generate()'s "left padding"; the count returned
        is then of columns, pads included). The cache owns its tensors."""
        from transformers import DynamicCache
        pads = _mask_pads(attention_mask)
        if pads is not None:
            return self._load_padded(input_ids, pads, expand, device)
        rows = _token_raw(input_ids)
        device = device or self._model_device()
        try:
            c = self._connect()
            keys, run = self._lookup(c, rows)
            layers, n = self._load_blocks([ks[:run] for ks in keys], device) if run else (None, 0)
        except OSError as e:
            self._failed("load", e)
            return DynamicCache(), 0
        self._down = False
        self.stats["loaded_blocks"] += n * len(rows)
        self.stats["failed_blocks"] += (run - n) * len(rows)
        cache = DynamicCache()
        if n:
            for l, (k, v) in enumerate(layers):
                if expand > 1:
                    _put(cache, l, k.repeat_interleave(expand, 0), v.repeat_interleave(expand, 0), copy=False)
                else:
                    _put(cache, l, k, v, copy=True)
        return cache, n * self.block_tokens

    @_exclusive
    def cached_tokens(self, input_ids, attention_mask=None):
        """How many leading tokens of each sequence of input_ids the store
        holds KV for, in one LOOKUP, loading nothing: per sequence a
        multiple of block_tokens, at most its length - 1 (what load() would
        load, were no block evicted meanwhile). attention_mask: of a
        left-padded batch (tokens counted after each row's pads). The
        daemon down: zeros, with load()'s warning."""
        rows = _after_pads(_token_raw(input_ids), _mask_pads(attention_mask))
        try:
            c = self._connect()
            _, runs = self._lookup_runs(c, rows)
        except OSError as e:
            self._failed("lookup", e)
            return [0] * len(rows)
        self._down = False
        return [r * self.block_tokens for r in runs]

    def _lookup(self, c, rows):
        """The keys of each sequence's whole blocks but the one holding its
        last token, and the leading run stored for all of them (LOOKUP)."""
        keys, runs = self._lookup_runs(c, rows)
        run = min(runs)
        self.stats["hit_blocks"] += run * len(rows)
        return keys, run

    def _lookup_runs(self, c, rows):
        """_lookup's keys, and each sequence's own leading run (the
        sequences of any lengths)."""
        bt = self.block_tokens
        keys = [block_keys(self._salt, r, bt, max(0, (len(r) // 8 - 1) // bt)) for r in rows]
        if not any(keys):
            return keys, [0] * len(rows)
        self.stats["lookups"] += 1
        return keys, [_leading(st, LOOKUP_PRESENT) for st in _lookup_each(c, keys)]

    def _load_padded(self, input_ids, pads, expand=1, device=None):
        """load() of a left-padded batch (pads: per sequence, the padding
        tokens before its first attended one): sequence b's stored blocks
        (of its tokens after the pads) in columns pads[b].. of its rows,
        every row cut at the first column some row has no KV for (at most
        the last token's), the pads' columns zero (the mask hides them).
        Returns the cache and its length in columns."""
        from transformers import DynamicCache
        import torch
        device = device or self._model_device()
        rows = _after_pads(_token_raw(input_ids), pads)
        end = input_ids.shape[1] - 1
        try:
            c = self._connect()
            bt = self.block_tokens
            keys, runs = self._lookup_runs(c, rows)
            self.stats["hit_blocks"] += sum(runs)
            end = min([end] + [p + r * bt for p, r in zip(pads, runs)])
            if end <= min(pads):
                return DynamicCache(), 0
            shape = (len(rows) * expand, self.head_count, end, self.head_dim)
            kv = [(torch.zeros(shape, dtype=self.dtype, device=device), torch.zeros(shape, dtype=self.dtype,
                                                                                   device=device))
                  for _ in range(self.layers)]
            for b, (ks, p) in enumerate(zip(keys, pads)):
                want = -(-max(0, end - p) // bt)
                if want == 0:
                    continue
                layers, n = self._load_blocks(ks[:want], device)
                self.stats["loaded_blocks"] += n
                self.stats["failed_blocks"] += want - n
                end = min(end, p + n * bt)  # a row that came up short cuts every row there
                t = max(0, end - p)
                for (k, v), (lk, lv) in zip(kv, layers or ()):
                    k[b * expand:(b + 1) * expand, :, p:end] = lk[:, :, :t]
                    v[b * expand:(b + 1) * expand, :, p:end] = lv[:, :, :t]
        except OSError as e:
            self._failed("load", e)
            return DynamicCache(), 0
        self._down = False
        cache = DynamicCache()
        if end <= min(pads):
            return cache, 0
        for l, (k, v) in enumerate(kv):
            _put(cache, l, k[:, :, :end], v[:, :, :end], copy=False)
        return cache, end

    def _entries(self, keys, cache_first=0, layer_first=None, layer_count=None):
        """A BlockArray loading keys into cache blocks cache_first.. (every
        layer of this process's range unless given, its heads, K and V)."""
        return BlockArray([k.block for k in keys], range(cache_first, cache_first + len(keys)),
                          self.layer_first if layer_first is None else layer_first,
                          self.layers if layer_count is None else layer_count, self.head_first, self.head_count,
                          abi.KINDS_BOTH, [k.tag for k in keys])

    def _load_blocks(self, keys, device):
        """Per layer (K, V) [B, heads, n·block_tokens, head_dim] of the
        leading blocks that load OK in every sequence's keys (keys: B lists
        of one length, or one sequence's), and n: views of the memory they
        landed in, which the next load reuses. On the CPU sequence b's block
        j goes to cache block b·run + j of the host buffer."""
        bt = self.block_tokens
        keys = _per_sequence(keys)
        if self._gpu(device):
            return self._load_torch(keys, device)
        B, run = len(keys), len(keys[0])
        buf, tid, _, view = self._host_view(B * run)
        st = self._client.load_blocks(tid, self._entries([k for ks in keys for k in ks]))
        n = min(_leading_ok(st[b * run:(b + 1) * run]) for b in range(B))
        if n == 0:
            return None, 0
        t = n * bt

        def rows(l, kind):
            # [heads, B·run·bt, dim] -> [B, heads, t, dim]
            v = view[l, kind, :, :B * run * bt].unflatten(1, (B, run * bt))[:, :, :t]
            return v.transpose(0, 1).to(device)
        return [(rows(l, 0), rows(l, 1)) for l in range(self.layers)], n

    def _load_torch(self, keys, device):
        """Load keys (B lists of one length) into the GPU load area
        (_load_area), one call per sequence: REGISTER_CUDA, straight into it,
        or pin=True, through kvfs.torch's pinned staging; as _load_blocks."""
        keys = _per_sequence(keys)
        B, run = len(keys), len(keys[0])
        area = self._load_area(B, run * self.block_tokens, device, kcs=True)
        n = run
        for b, ks in enumerate(keys):
            kc = area.kcs[b]
            if kc.target_id is not None:
                kc.wait_idle()
                st = self._client.load_blocks(kc.target_id, self._entries(ks[:n]))
            else:
                st = kc.load([k.block for k in ks[:n]], range(n), tags=[k.tag for k in ks[:n]])
            n = min(n, _leading_ok(st))
            if n == 0:
                return None, 0
        t = n * self.block_tokens
        return [(k[:, :, :t], v[:, :, :t]) for k, v in area.layers], n

    def _load_area(self, B, tokens, device, kcs=False):
        """The load area for a batch of B sequences of up to tokens tokens on
        device: one GPU allocation [layers, 2, B, heads, capacity, head_dim],
        kept from load to load and grown by powers of two; with kcs its
        kvfs.torch caches too (one REGISTER_CUDA, or pin=True's pinned
        staging, and a target per sequence). Registering a fresh allocation
        with the daemon (which maps it with cuIpcOpenMemHandle) costs more
        than a 32K-token prefix takes to load (docs/performance.md, "TTFT
        with a real model")."""
        import torch
        from . import torch as kt
        a = self._area
        if not (a is not None and a.B == B and a.tokens >= tokens and a.device == device
                and a.client is self._client):
            self._drop_area()
            cap = self._capacity(tokens)
            whole = torch.empty((self.layers, 2, B, self.head_count, cap, self.head_dim), dtype=self.dtype,
                                device=device)
            a = self._area = _Area(B, cap, device, self._client, whole,
                                   [(whole[l, 0], whole[l, 1]) for l in range(self.layers)])
        if kcs and a.kcs is None:
            made = []
            try:
                for b in range(B):
                    made.append(kt.KVCache.hf(self._client, a.layers, batch_row=b, layer_first=self.layer_first,
                                              tp_rank=self.tp_rank, tp_size=self.tp_size, pin=self.pin))
            except BaseException:
                for kc in made:
                    kc.close()
                raise
            a.kcs = made
        return a

    def _capacity(self, tokens):
        """Tokens a kept buffer for tokens tokens holds: the next power of
        two, whole blocks (buffers grow by doubling, not on every load)."""
        bt = self.block_tokens
        return -(-max(bt, 1 << (max(1, tokens) - 1).bit_length()) // bt) * bt

    def _drop_area(self):
        a, self._area = self._area, None
        if a is not None:
            for kc in a.kcs or ():
                kc.close()
        self._drop_ring()

    def _pinned_ring(self, tokens, device):
        """_Ring.SLOTS layers' worth (K and V, this process's heads, up to
        tokens tokens) of host memory registered with the daemon and pinned
        for the GPU: where pin=True's layer-by-layer loads land before their
        copy to the load area, layer l in slot l mod SLOTS (_Ring.target).
        Kept from load to load, grown by powers of two."""
        import torch
        from .torch import CudaDriver
        r = self._ring
        if r is not None and r.tokens >= tokens and r.client is self._client and r.device == device:
            return r
        self._drop_ring()
        c, cap = self._client, self._capacity(tokens)
        region = self.head_count * cap * self._info.row_bytes
        slots = min(_Ring.SLOTS, self.layers)
        buf = c.create_host_buffer(2 * slots * region)
        pinned = None
        try:
            u8 = torch.frombuffer(buf.mm, dtype=torch.uint8)
            with torch.cuda.device(device):
                CudaDriver().host_register(u8.data_ptr(), len(buf.mm))
            pinned = u8.data_ptr()
            view = u8.view(self.dtype).view(slots, 2, self.head_count, cap, self.head_dim)
        except BaseException:
            if pinned is not None:
                with torch.cuda.device(device):
                    CudaDriver().host_unregister(pinned)
            u8 = None
            buf.close()
            raise
        self._ring = _Ring(c, buf, region, cap, slots, view, pinned, self, device)
        return self._ring

    def _drop_ring(self):
        r, self._ring = getattr(self, "_ring", None), None
        if r is None:
            return
        import torch
        from .torch import CudaDriver
        r.view = None
        try:
            with torch.cuda.device(r.device):
                CudaDriver().host_unregister(r.pinned)
        except OSError:
            pass
        try:
            r.buf.close()
        except (OSError, BufferError):
            pass

    @_exclusive
    def store(self, input_ids, cache, expand=1, attention_mask=None):
        """Store the whole blocks of input_ids that cache holds (cache covers
        input_ids from token 0) and the store does not have yet, each with
        its tag and parent, durably. Returns how many blocks were stored (0
        with the daemon down). expand: rows of the cache per sequence, as
        load's (sequence b in rows b·expand .. b·expand + expand - 1: row
        b·expand is stored). attention_mask: of a left-padded batch, as
        load's (each sequence its tokens after its pads, its KV in the
        columns after them)."""
        from .torch import _hf_layers
        pads = _mask_pads(attention_mask)
        rows = _after_pads(_token_raw(input_ids), pads)
        pads = pads or [0] * len(rows)
        layers = _hf_layers(cache)
        if not layers or layers[0][0] is None or layers[0][0].numel() == 0:
            return 0  # nothing computed yet
        if len(layers) != self.layers:
            raise ValueError("the cache has %d layers, the model %d" % (len(layers), self.layers))
        k0 = layers[0][0]
        if k0.dim() != 4 or k0.shape[0] != len(rows) * expand:
            raise ValueError("kvfs.hf stores a cache of the prompt's %d sequences: tensors [%d, heads, seq, "
                             "head_dim], got %s" % (len(rows), len(rows) * expand, tuple(k0.shape)))
        try:
            c = self._connect()
            bt = self.block_tokens
            keys = [block_keys(self._salt, r, bt, max(0, min(k0.shape[2] - p, len(r) // 8)) // bt)
                    for r, p in zip(rows, pads)]
            if not any(keys):
                return 0
            if k0.shape[1] != self.head_count:
                raise ValueError("the cache holds %d kv-heads, this shard %d" % (k0.shape[1], self.head_count))
            n, queued = 0, set()
            for b, (ks, st) in enumerate(zip(keys, _lookup_each(c, keys))):
                # a block two sequences share (a common prefix) is stored once, from the first
                todo = [j for j, s in enumerate(st) if s != LOOKUP_PRESENT and ks[j].block not in queued]
                queued.update(ks[j].block for j in todo)
                if todo:
                    n += self._store_blocks(ks, todo, layers, b * expand, pads[b])
        except OSError as e:
            self._failed("store", e)
            return 0
        self._down = False
        self.stats["stored_blocks"] += n
        return n

    def _store_blocks(self, keys, todo, layers, row=0, col=0):
        """Store blocks todo of sequence row of the cache, whose token 0 is
        in column col (keys: its)."""
        bt = self.block_tokens
        lo, hi = todo[0], todo[-1] + 1
        if self._gpu(layers[0][0].device):
            return self._store_torch(keys, todo, [(k[:, :, col:], v[:, :, col:]) for k, v in layers], row)
        buf, tid, _, view = self._host_view(hi - lo)
        for l, (k, v) in enumerate(layers):
            view[l, 0, :, :(hi - lo) * bt].copy_(k[row, :, col + lo * bt:col + hi * bt])
            view[l, 1, :, :(hi - lo) * bt].copy_(v[row, :, col + lo * bt:col + hi * bt])
        es = [BlockEntry(keys[j].block, j - lo, self.layer_first, self.layers, self.head_first, self.head_count,
                         abi.KINDS_BOTH, keys[j].tag, keys[j].parent) for j in todo]
        return self._client.store_blocks(tid, es).count(OK)

    def _store_torch(self, keys, todo, layers, row=0):
        """Store blocks todo of sequence row of GPU cache tensors through
        kvfs.torch's pinned staging buffer (the cache's tensors are many
        allocations; staging needs no REGISTER_CUDA of them)."""
        from . import torch as kt
        t = (todo[-1] + 1) * self.block_tokens
        with kt.KVCache.hf(self._client, [(k[:, :, :t], v[:, :, :t]) for k, v in layers], batch_row=row,
                           layer_first=self.layer_first, tp_rank=self.tp_rank, tp_size=self.tp_size,
                           pin=True) as kc:
            st = kc.store([keys[j].block for j in todo], todo, tags=[keys[j].tag for j in todo],
                          parents=[keys[j].parent for j in todo])
        return st.count(OK)

    @_exclusive
    def prefill(self, input_ids, cache, n_cached, chunk_blocks=None):
        """Run the model over the uncached whole blocks of input_ids, up to
        but not including the block holding the last token, chunk_blocks
        blocks per forward (default prefill_blocks; None: one forward).
        Returns the number of tokens the cache now holds."""
        import torch
        chunk_blocks = chunk_blocks or self.prefill_blocks
        ids = input_ids if hasattr(input_ids, "dim") else torch.tensor(_token_rows(input_ids))
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        bt = self._block_tokens_or_none()
        if bt is None:
            return n_cached
        end = ((ids.shape[1] - 1) // bt) * bt
        step = chunk_blocks * bt if chunk_blocks else max(end - n_cached, 1)
        kw = cache_kwarg(self.model)
        with torch.no_grad(), suffix_attention(self.model, self.suffix_attention):
            for a in range(n_cached, end, step):
                b = min(a + step, end)
                self.model(input_ids=ids[:, a:b].to(self._model_device()), use_cache=True, **{kw: cache})
        return max(n_cached, end)

    def _block_tokens_or_none(self):
        """The store's block_tokens: known once connected, kept while the
        daemon is down, so a prefill is cut the same way either way."""
        if self._info is not None:
            return self.block_tokens
        try:
            self._connect()
        except OSError as e:
            self._failed("open", e)
            return None
        return self.block_tokens

    @_exclusive
    def generate(self, input_ids, **kwargs):
        """model.generate(input_ids, **kwargs) from the stored prefix of
        input_ids (one sequence, or a batch: each sequence's stored prefix,
        cut where the shortest ends); the prompt's new whole blocks, and
        those of the tokens generated, are stored afterwards. Returns what
        model.generate returns.

        Every token of input_ids is attended (attention_mask defaults to
        ones). A left-padded batch (a mask of zeros, then ones, per row) is
        named by each sequence's tokens after its pads; any other mask that
        hides tokens, or use_cache=False, makes it model.generate's own,
        kvfs unused. With num_beams or num_return_sequences, model.generate
        runs that many rows per sequence: the cache holds each sequence's
        prefix that many times. generate() makes the cache: a cache of the
        caller's (past_key_values=) or a cache_implementation is refused,
        a model's default cache_implementation replaced. With layerwise (the
        default; one sequence) layer 0 of a hit is loaded first and the
        others on a thread while the model runs, layer i waiting only for
        layer i's data."""
        import torch
        kw = cache_kwarg(self.model)
        for given in {kw, "past_key_values"} & set(kwargs):
            raise ValueError("PrefixCache.generate hands model.generate a cache of the stored prefix: a cache of "
                             "the caller's (%s=) cannot be used with it; call model.generate for that one" % given)
        if kwargs.get("cache_implementation") is not None:
            raise ValueError("PrefixCache.generate fills a DynamicCache; cache_implementation=%r cannot be used "
                             "with it (call model.generate for that cache)" % kwargs["cache_implementation"])
        if _generation_setting(self.model, kwargs, "cache_implementation", None) is not None:
            # a model's default cache (Gemma's "hybrid", say): the DynamicCache
            # generate() hands model.generate takes its place (it keeps every
            # token, and the mask applies any sliding window)
            kwargs["cache_implementation"] = None
        mask, pads, holes = kwargs.get("attention_mask"), None, False
        if mask is None and hasattr(input_ids, "dim"):
            # every token counts; without a mask, generate would take pad_token_id
            # tokens in the prompt for padding, which the stored blocks were not
            kwargs["attention_mask"] = torch.ones_like(input_ids)
        elif mask is not None and not bool(mask.all()):
            pads = _left_pads(mask)
            holes = pads is None
        if holes or not _generation_setting(self.model, kwargs, "use_cache"):
            # a mask with holes or right padding: KV computed under it is not the
            # tokens' own; use_cache=False: every step recomputes all tokens, and
            # a cache given would be attended twice
            with torch.no_grad():
                return self.model.generate(input_ids, **kwargs)
        # model.generate runs num_beams (or num_return_sequences) rows per
        # sequence and takes a cache of that batch: each sequence's rows repeated
        expand = _expand_size(self.model, kwargs)
        ids = input_ids.repeat_interleave(expand, 0) if expand > 1 else input_ids
        loader, cache, n = None, None, 0
        if pads is not None:
            cache, n = self._load_padded(input_ids, pads, expand)
        elif self.layerwise and _batch_size(input_ids) == 1:
            loader, cache, n = self._begin_layerwise(input_ids, expand)
        if cache is None:
            cache, n = self.load(input_ids, expand=expand)
        # prefill() runs unmasked forwards: not for a padded batch
        prefill = self.prefill_blocks and pads is None
        try:
            try:
                if prefill:
                    n = self.prefill(ids, cache, n)
                with torch.no_grad(), suffix_attention(self.model, self.suffix_attention):
                    out = self.model.generate(input_ids, **{kw: cache}, **kwargs)
            except _Shrunk:
                # a layer loaded fewer blocks than layer 0 (evicted, corrupt,
                # the daemon gone): start again from what every layer has
                cache, n = loader.settle()
                self.stats["layerwise_retries"] += 1
                if prefill:
                    n = self.prefill(ids, cache, n)
                with torch.no_grad(), suffix_attention(self.model, self.suffix_attention):
                    out = self.model.generate(input_ids, **{kw: cache}, **kwargs)
        finally:
            if loader is not None:
                loader.close(cache)
        seqs = getattr(out, "sequences", out)
        beams = _generation_setting(self.model, kwargs, "num_beams") > 1
        if (self.store_generated and not beams and hasattr(seqs, "dim") and seqs.dim() == 2
                and seqs.shape[0] == _batch_size(input_ids) * expand):
            # row r of the cache holds the KV of sequence r's tokens but its last
            if pads is not None:  # the mask of each row's sequence: its pads, then every token
                m = mask.repeat_interleave(expand, 0)
                mask = torch.cat([m, m.new_ones((m.shape[0], seqs.shape[1] - m.shape[1]))], dim=1)
            self.store(seqs, cache, attention_mask=mask)
        else:
            self.store(input_ids, cache, expand=expand, attention_mask=mask)
        return out

    def _begin_layerwise(self, input_ids, expand=1):
        """Look the prompt up, load layer 0 of its leading stored blocks and
        start a _LayerLoader for the rest: (loader, its cache, tokens), the
        cache's rows the prompt's repeated expand times.
        (None, an empty cache, 0) when nothing is stored or the daemon is
        down; (None, None, 0) when the model's decoder layers cannot be
        hooked (load() then loads every layer at once)."""
        from transformers import DynamicCache
        layers = _decoder_layers(self.model)
        if layers is None or len(layers) != self.layers:
            return None, None, 0
        rows = _token_raw(input_ids)
        if len(rows) != 1:
            raise ValueError("one sequence wanted; input_ids has a batch of %d" % len(rows))
        try:
            c = self._connect()
            keys, run = self._lookup(c, rows)
            keys = keys[0]
            if run == 0:
                self._down = False
                return None, DynamicCache(), 0
            loader = _LayerLoader(self, keys[:run], self._model_device(), layers, expand)
        except OSError as e:
            self._failed("load", e)
            return None, DynamicCache(), 0
        self._down = False
        self.stats["layerwise_loads"] += 1
        return loader, loader.cache, loader.tokens

    def _gpu(self, device):
        """Whether loads and stores for tensors on device take the GPU path
        (kvfs.torch); python/tests drive pin=True's on CPU tensors."""
        from . import torch as kt
        return device.type == "cuda" or (kt._CPU_FOR_TESTS and self.pin)

    def _model_device(self):
        import torch
        d = getattr(self.model, "device", None)
        return d if isinstance(d, torch.device) else torch.device("cpu")

    @_exclusive
    def close(self):
        """Drop the host buffer, the GPU load area and, when opened from a
        mountpoint, the control file."""
        self._drop_host()
        self._drop_area()
        if self._own_client and self._client is not None:
            try:
                self._client.close()
            except (OSError, BufferError):
                pass
            self._client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Area:
    """PrefixCache's GPU load area (_load_area)."""

    def __init__(self, B, tokens, device, client, whole, layers):
        self.B, self.tokens, self.device, self.client = B, tokens, device, client
        self.whole, self.layers, self.kcs = whole, layers, None


class _Ring:
    """PrefixCache's pinned host slots for pin=True's layer-by-layer loads (_pinned_ring)."""

    SLOTS = 4

    def __init__(self, client, buf, region, tokens, slots, view, pinned, pc, device):
        self.client, self.buf, self.region, self.tokens = client, buf, region, tokens
        self.slots, self.view, self.pinned, self.device = slots, view, pinned, device
        self.head_first, self.head_count = pc.head_first, pc.head_count

    def target(self, layer, slots):
        """Register a target of model layers layer .. + len(slots) - 1 over
        slots (one each; a target's tiles may not overlap, so the slots
        cannot be one target of every layer); the caller unregisters it
        after its load."""
        t = self.client.hf_target(self.tokens, [(self.buf.id, (2 * slot + k) * self.region)
                                                for slot in slots for k in (0, 1)],
                                  layer, len(slots), self.head_first, self.head_count)
        return self.client.register_target(t)


def _shares(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _put(cache, l, k, v, copy):
    """Make layer l of an empty DynamicCache hold (k, v). copy: tensors of
    its own (DynamicLayer.update concatenates onto an empty tensor: the one
    copy). Without: the views themselves, until the model's first forward
    concatenates its tokens onto them (a new tensor); for memory that is
    not reused before that forward."""
    if copy:
        cache.update(k, v, l)
        layer = cache.layers[l] if hasattr(cache, "layers") else None
        if layer is not None and (_shares(layer.keys, k) or _shares(layer.values, v)):
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        return
    cache.update(k[..., :0, :], v[..., :0, :], l)
    layer = cache.layers[l]
    layer.keys, layer.values = k, v


class _Shrunk(Exception):
    """A layer's blocks did not all load: the forward must start again."""


def _decoder_layers(model):
    """The model's decoder layers (model.model.layers for Llama-like models), or None."""
    for m in (getattr(model, "model", None), getattr(getattr(model, "model", None), "language_model", None), model):
        layers = getattr(m, "layers", None)
        if layers is not None and hasattr(layers, "__len__") and len(layers):
            return layers
    return None


def _layer_groups(layers, per):
    """The layer ranges (first, count) a layer-by-layer load fetches after
    layer 0: per layers a LOAD_BLOCKS, the first and the last loads fewer
    (1, 2, 4, ... up to per, and back down to 1), so that the forward, which
    starts once layer 0 is in, soon finds layer 1 in, and once the last load
    is in waits for one layer only. A call of one layer of many blocks moves
    them at 0.81-0.88x the rate of one call of every layer, of 4 layers at
    0.88-1.02x on the VM (docs/performance.md, "Layer by layer")."""
    left, head, tail = layers - 1, [], []
    s = 1
    while s < per and left > 0:
        for side in (head, tail):
            take = min(s, left)
            if take:
                side.append(take)
                left -= take
        s *= 2
    mid = []
    while left > 0:
        mid.append(min(per, left))
        left -= mid[-1]
    out, first = [], 1
    for n in head + mid + tail[::-1]:
        out.append((first, n))
        first += n
    return out


class _LayerLoader:
    """Loads a prefix layer by layer (a BlockArray packed once): layer 0 at
    once (the model reads the cache's length from it before the first layer
    runs), the others on PrefixCache.loads_in_flight threads, each taking
    the next PrefixCache.layers_per_load layers (_layer_groups) in order, one
    LOAD_BLOCKS each: with more than one, while the daemon locates one
    call's blocks and checks what landed, another call's copies can move
    (docs/abi.md, "Layer by layer"); all threads but one start while layer
    0 loads, so that many calls are in flight from the start. A forward
    pre-hook on decoder layer i waits for layer i and puts it into the
    cache; a layer with fewer blocks than layer 0 raises _Shrunk there, and
    generate() starts again from settle().

    Where a layer lands: on a GPU with REGISTER_CUDA, straight in the load
    area; with pin=True, in a slot of the pinned ring, then copied to the
    load area on a copy stream with an event per layer (the hook makes the
    model's stream wait for it, the CPU does not); on the CPU, in the host
    buffer. The cache holds views of that memory until the model's first
    forward concatenates onto them, so nothing is copied twice; close()
    gives the cache copies of any layer still on that memory."""

    def __init__(self, pc, keys, device, decoder_layers, expand=1):
        from transformers import DynamicCache
        import torch
        self.pc, self.keys, self.device, self.torch = pc, keys, device, torch
        self.expand = expand
        self.n_layers = pc.layers
        self.ok = [0] * self.n_layers
        self.kv = [None] * self.n_layers
        self.events = [None] * self.n_layers
        self.error = None
        self.load_s = 0.0  # the threads' loads, from the first's start to the last load's end
        self.ready = [threading.Event() for _ in range(self.n_layers)]
        self.cache = DynamicCache()
        self._hooks = []
        self._threads = []
        n, bt = len(keys), pc.block_tokens
        self.mode = "host" if not pc._gpu(device) else ("ring" if pc.pin else "area")
        if self.mode == "host":
            _, self.tid, _, self.view = pc._host_view(n)
        else:
            # nothing queued may still read the load area (the last forward's concatenation)
            torch.cuda.current_stream(device).synchronize()
            self.area = pc._load_area(1, n * bt, device, kcs=self.mode == "area")
            if self.mode == "area":
                self.tid = self.area.kcs[0].target_id
            else:
                self.ring = pc._pinned_ring(n * bt, device)
                self.tid = None  # a target per load (_Ring.target)
                self.stream = torch.cuda.Stream(device)
        per = pc.layers_per_load
        if self.mode == "ring":
            per = min(per, self.ring.slots // 2)  # a load's slots free while the last one's copy runs
        self.groups = _layer_groups(self.n_layers, per)
        self.entries = pc._entries(keys, layer_count=1)
        # the ring's slots are reused in load order: one load at a time there
        threads = 1 if self.mode == "ring" else min(pc.loads_in_flight, len(self.groups))
        self._next = 0
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        # with several loads in flight, all but one thread start with layer
        # 0's load (the calls in flight stay loads_in_flight); the last one
        # once layer 0 is in
        early = max(threads - 1, 0)
        for j in range(early):
            self._start(j, self.entries.copy())
        try:
            self._load(0, 1)
        except BaseException:
            self._stop()
            raise
        self.blocks = self.ok[0]
        self.tokens = self.blocks * bt
        pc.stats["loaded_blocks"] += self.blocks
        pc.stats["failed_blocks"] += n - self.blocks
        if self.blocks == 0:
            self._stop()
            return
        if self.blocks < n:
            self.entries = pc._entries(keys[:self.blocks], layer_count=1)
        self._put(0)
        for i in range(1, self.n_layers):
            self._hooks.append(decoder_layers[i].register_forward_pre_hook(self._hook(i)))
        for j in range(early, threads):
            self._start(j, self.entries if j == early else self.entries.copy())

    def _start(self, j, entries):
        t = threading.Thread(target=self._run, args=(entries,), name="kvfs.hf layers %d" % j, daemon=True)
        self._threads.append(t)
        t.start()

    def _stop(self):
        """No more loads: the threads finish the one they are in."""
        with self._lock:
            self._next = len(self.groups)
        self._join()

    def _load(self, first, count, entries=None):
        """Load layers first .. first + count - 1 in one LOAD_BLOCKS (of
        entries, the loader's own unless a thread gives its copy)."""
        pc, torch = self.pc, self.torch
        layers = range(first, first + count)
        es = (entries or self.entries).set_layers(pc.layer_first + first, count)
        if self.mode == "ring":
            slots = self.ring.slots
            for l in layers:
                if l >= slots:
                    self.events[l - slots].synchronize()  # the slot's last copy to the GPU is done
            tid = self.ring.target(pc.layer_first + first, [l % slots for l in layers])
            try:
                st = pc._client.load_blocks(tid, es)
            finally:
                pc._client.unregister_target(tid)
        else:
            st = pc._client.load_blocks(self.tid, es)
        ok = _leading_ok(st)  # an entry is OK when each of its layers is
        t = ok * pc.block_tokens
        for l in layers:
            if self.mode == "host":
                self.kv[l] = tuple(self.view[l, kind, :, :t].unsqueeze(0).to(self.device) for kind in (0, 1))
            else:
                k, v = self.area.layers[l]
                self.kv[l] = (k[:, :, :t], v[:, :, :t])
                if self.mode == "ring":
                    slot = self.ring.view[l % self.ring.slots]
                    with torch.cuda.stream(self.stream):
                        for kind in (0, 1):
                            self.kv[l][kind][0].copy_(slot[kind, :, :t], non_blocking=True)
                        self.events[l] = torch.cuda.Event()
                        self.events[l].record(self.stream)
            self.ok[l] = ok

    def _put(self, i):
        if self.events[i] is not None:
            self.torch.cuda.current_stream(self.device).wait_event(self.events[i])
        k, v = self.kv[i]
        t = self.tokens
        # expand rows: views with a batch stride of 0; the forward's concatenation makes them whole
        e = (self.expand, -1, -1, -1)
        _put(self.cache, i, k[:, :, :t].expand(*e), v[:, :, :t].expand(*e), copy=False)

    def _run(self, entries):
        """One loading thread: the next layer group not yet taken, until none
        is left (after an error, the rest are only marked ready)."""
        while True:
            with self._lock:
                if self._next >= len(self.groups):
                    return
                first, count = self.groups[self._next]
                self._next += 1
            try:
                if self.error is None:
                    self._load(first, count, entries)
                    with self._lock:
                        self.load_s = max(self.load_s, time.perf_counter() - self._t0)
            except BaseException as e:  # the hooks report it in the caller's thread
                self.error = e
            finally:
                for l in range(first, first + count):
                    self.ready[l].set()

    def _hook(self, i):
        def hook(module, args):
            if len(self.cache.layers) > i:
                return None  # a later forward: layer i is in
            t0 = time.perf_counter()
            self.ready[i].wait()
            self.pc.stats["layerwise_wait_s"] += time.perf_counter() - t0
            if self.error is not None or self.ok[i] < self.blocks:
                raise _Shrunk()
            self._put(i)
            return None
        return hook

    def settle(self):
        """A DynamicCache of the blocks every layer loaded, once all are in."""
        from transformers import DynamicCache
        self._join()
        if self.error is not None:
            self.pc._failed("load", self.error)
        n = min(self.ok) if self.error is None else 0
        self.pc.stats["loaded_blocks"] -= self.blocks - n
        self.pc.stats["failed_blocks"] += self.blocks - n
        self.cache = DynamicCache()
        self.tokens = n * self.pc.block_tokens
        if n:
            for l in range(self.n_layers):
                self._put(l)
        return self.cache, self.tokens

    def _join(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._threads:
            for t in self._threads:
                t.join()
            self._threads = []
            self.pc.stats["layerwise_load_s"] += self.load_s

    def close(self, cache=None):
        """Stop, and give cache (one this loader filled) copies of the layers
        that still are views of the memory loads land in."""
        self._join()
        for e in self.events:
            if e is not None:
                e.synchronize()
        if cache is not None and hasattr(cache, "layers"):
            for l, layer in enumerate(cache.layers):
                kv = self.kv[l] if l < len(self.kv) else None
                keys = getattr(layer, "keys", None)
                if kv is not None and keys is not None and keys.numel() and _shares(keys, kv[0]):
                    layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        self.kv = [None] * self.n_layers
        self.view = None


def _leading(statuses, want):
    n = 0
    while n < len(statuses) and statuses[n] == want:
        n += 1
    return n


def _leading_ok(statuses):
    return _leading(statuses, OK)


def _lookup_each(c, keys):
    """One LOOKUP of every sequence's keys (lists of BlockKey): per sequence,
    its statuses."""
    st = c.lookup([(k.block, k.tag) for ks in keys for k in ks]).statuses
    out, at = [], 0
    for ks in keys:
        out.append(st[at:at + len(ks)])
        at += len(ks)
    return out


def _after_pads(raws, pads):
    """_token_raw's sequences without their first pads[b] tokens (pads None:
    as they are)."""
    return raws if pads is None else [r[8 * p:] for r, p in zip(raws, pads)]


def _mask_pads(mask):
    """_left_pads of a mask given to load() or store(): None for no mask or
    one of all ones; a ValueError for one that is not left padding."""
    if mask is None or bool(mask.all()):
        return None
    pads = _left_pads(mask)
    if pads is None:
        raise ValueError("kvfs.hf takes left padding only (each row of attention_mask zeros, then ones)")
    return pads


def _left_pads(mask):
    """Per row of an attention mask [B, n] that is left padding (each row
    zeros, then ones, at least one), how many zeros; None for any other."""
    import torch
    m = mask.detach().to("cpu") != 0
    if m.dim() != 2:
        return None
    pads = m.shape[1] - m.sum(1)
    left = torch.arange(m.shape[1])[None, :] >= pads[:, None]
    if not torch.equal(m, left) or bool((pads == m.shape[1]).any()):
        return None
    return pads.tolist()


def _generation_setting(model, kwargs, name, unset=1):
    """A setting of a generate call (num_beams, num_return_sequences,
    use_cache, cache_implementation): kwargs over their generation_config
    over the model's; unset when none sets it (counts and flags as ints)."""
    v = kwargs.get(name)
    if v is None:
        gc = kwargs.get("generation_config") or getattr(model, "generation_config", None)
        v = getattr(gc, name, None)
    if v is None:
        return unset
    return v if isinstance(v, str) else int(v)


def _expand_size(model, kwargs):
    """How many rows model.generate runs per sequence of the prompt:
    max(num_beams, num_return_sequences)."""
    return max(1, _generation_setting(model, kwargs, "num_beams"),
               _generation_setting(model, kwargs, "num_return_sequences"))


def _batch_size(input_ids):
    """How many sequences input_ids holds (no conversion of a tensor's ids)."""
    if hasattr(input_ids, "dim"):
        return 1 if input_ids.dim() == 1 else input_ids.shape[0]
    return len(_token_rows(input_ids))


def _per_sequence(keys):
    """keys as a list of each sequence's BlockKeys (one sequence's given flat)."""
    return [keys] if keys and isinstance(keys[0], BlockKey) else keys


def _batched(input_ids):
    """Whether input_ids is given as a batch ([B, n] tensor, or lists of ids)."""
    if hasattr(input_ids, "dim"):
        return input_ids.dim() == 2 and input_ids.shape[0] != 1
    ids = list(input_ids)
    return bool(ids) and isinstance(ids[0], (list, tuple)) and len(ids) != 1


# -- attention over a stored prefix ------------------------------------------

SUFFIX_ATTENTION = "kvfs_sdpa"
_suffix_registered = False


def _suffix_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, local_size=None, allow_is_causal_skip=True, device="cpu", **kwargs):
    """The mask of SUFFIX_ATTENTION: None where the queries are the last
    q_length of kv_length keys, causal and unpadded (_suffix_sdpa then
    gives SDPA a lower-right causal bias, fused kernels on a GPU);
    otherwise transformers' sdpa mask, materialized whenever a query run
    shorter than its keys would otherwise be left to sdpa's upper-left
    is_causal."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask
    lower_right = 1 < q_length < kv_length
    if (lower_right and allow_is_causal_skip and mask_function is causal_mask_function and local_size is None
            and kv_offset == 0 and isinstance(q_offset, int) and q_offset + q_length == kv_length
            and (attention_mask is None or (attention_mask.shape[-1] == kv_length and bool(attention_mask.all())))):
        return None
    if lower_right:
        allow_is_causal_skip = False
        kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function or causal_mask_function,
                     attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=allow_is_causal_skip, device=device, **kwargs)


def _suffix_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' sdpa attention, but for queries that follow cached keys
    (no mask: _suffix_mask left it out): SDPA with a lower-right causal
    bias, which runs FlashAttention's kernel with grouped kv-heads as they
    are, instead of a materialized [q, kv] mask over kv-heads repeated for
    every query head."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    q, kv = query.shape[2], key.shape[2]
    if (attention_mask is None and 1 < q < kv and is_causal is not False and getattr(module, "is_causal", True)
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None):
        import torch
        from torch.nn.attention.bias import causal_lower_right
        groups = getattr(module, "num_key_value_groups", 1)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=causal_lower_right(q, kv), dropout_p=dropout, scale=scaling,
            enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def _register_suffix_attention():
    global _suffix_registered
    if not _suffix_registered:
        from transformers import AttentionInterface, AttentionMaskInterface
        AttentionInterface.register(SUFFIX_ATTENTION, _suffix_sdpa)
        AttentionMaskInterface.register(SUFFIX_ATTENTION, _suffix_mask)
        _suffix_registered = True


class suffix_attention:
    """with suffix_attention(model): a model of transformers' sdpa attention
    runs SUFFIX_ATTENTION while inside: the same computation, but a forward
    over a cache that holds earlier tokens (the rest of a prompt after its
    loaded prefix) runs SDPA's fused kernels on the GPU instead of a masked
    attention over repeated kv-heads. Its own implementation is back on
    exit. PrefixCache(suffix_attention=True), the default, runs its
    forwards so; on=False, or a model of another implementation, changes
    nothing."""

    def __init__(self, model, on=True):
        # the config the decoder layers read (a composite model's text
        # config); set as {"": name}, which leaves its sub-configs' (a vision
        # tower's) implementations as they are
        cfg = model.config
        cfg = getattr(cfg, "get_text_config", lambda: cfg)()
        self.config = cfg if on and getattr(cfg, "_attn_implementation", None) == "sdpa" else None

    def __enter__(self):
        if self.config is not None:
            _register_suffix_attention()
            self.config._attn_implementation = {"": SUFFIX_ATTENTION}
        return self

    def __exit__(self, *exc):
        if self.config is not None:
            self.config._attn_implementation = {"": "sdpa"}
