"""Load and store a PyTorch KV cache on the GPU through kvfs (docs/abi.md, "Python and PyTorch").

Importing kvfs never imports torch; importing kvfs.torch does not either
until a KVCache is built (the layout math below is plain Python, tested in
CI without torch or a GPU).

An inference engine describes its cache once, per layer the K and V tensors
of this rank, and then moves whole blocks by id::

    import kvfs, kvfs.torch as kt
    c = kvfs.Client("/mnt/kvcache")
    # vLLM / FlashAttention: per layer a [2, num_blocks, block_size, kv_heads, head_dim] tensor
    cache = kt.KVCache.nhd(c, kv_caches, tp_rank=rank, tp_size=world)
    st = cache.load(block_ids, cache_block_ids)     # one status per block: kvfs.OK, ABSENT, ...
    cache.store(block_ids, cache_block_ids)         # durable on return
    cache.close()

Layouts (one layer's K or V; kv_heads are this rank's heads):

=========  =====================================================  ==========================
``nhd``    ``[num_blocks, block_size, kv_heads, head_dim]``        vLLM, FlashAttention
``hnd``    ``[num_blocks, kv_heads, block_size, head_dim]``        FlashInfer (kv_layout="HND")
``hf``     ``[batch, kv_heads, seq, head_dim]``, one batch row     Hugging Face DynamicCache
=========  =====================================================  ==========================

block_size must be the store's block_tokens and head_dim × dtype size its
row_bytes. For ``hf``, cache block c is tokens [c·block_tokens, (c+1)·block_tokens)
of the sequence (tokens past the last whole block are not moved). The tensors
may be views with any strides as long as head_dim is contiguous: the strides
are read from the tensors.

Two paths move the bytes:

* ``pin=False`` (default): the tensors' allocations are registered with the
  daemon through CUDA IPC (REGISTER_CUDA; the base of the allocation from
  cuMemGetAddressRange, its cuIpcGetMemHandle, the tensor's offset in it) and
  the daemon copies straight between the store and GPU memory. Needs a daemon
  with KVFS_CAP_CUDA and memory from cudaMalloc (PyTorch's default
  allocator; not ``expandable_segments:True``, which CUDA IPC cannot export).
* ``pin=True``: a host staging buffer (a memfd registered with the daemon,
  pinned for the GPU with cuMemHostRegister, portable) receives whole blocks
  by the daemon's DMA; this process copies them to the GPU (one H2D per
  chunk, then one scatter kernel per layer and kind on ``stream``), double
  buffered so the daemon reads chunk i+1 while chunk i is copied. Works with
  any daemon.

Tensor parallelism: rank r of N holds kv-heads ``tp_head_range(kv_heads, r, N)``
(when N > kv_heads, heads are replicated and rank r holds head r·kv_heads//N).
Its target names that head range, so each rank loads only its shard of each
block; all ranks may share one daemon (one Client each).

The tensors must stay alive (and not move) while the KVCache is open; the
load and store calls synchronize with the current stream before they start
(store) and after they finish (load), so torch work queued before store() is
included and work queued after load() sees the data.
"""

import ctypes
import errno as _errno

from . import abi
from . import BlockEntry, KvfsError, OK, Target

__all__ = ["KVCache", "tp_head_range", "tensor_geometry", "staging_geometry", "CudaDriver"]

LAYOUTS = ("nhd", "hnd", "hf")
_CPU_FOR_TESTS = False  # python/tests (torch_on_cpu.py) drive the pin=True paths on CPU tensors


# -- layout math (plain Python) -------------------------------------------------


def tp_head_range(kv_heads, tp_rank=0, tp_size=1):
    """(head_first, head_count) of kv-heads held by tensor-parallel rank
    tp_rank of tp_size. kv_heads divisible by tp_size: an even split; tp_size
    a multiple of kv_heads: each head replicated on tp_size/kv_heads ranks."""
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError("tp rank %d of %d" % (tp_rank, tp_size))
    if kv_heads % tp_size == 0:
        n = kv_heads // tp_size
        return tp_rank * n, n
    if tp_size % kv_heads == 0:
        return tp_rank * kv_heads // tp_size, 1
    raise ValueError("%d kv-heads cannot be split over %d ranks" % (kv_heads, tp_size))


def tensor_geometry(layout, shape, strides, elem_size, block_tokens, row_bytes=None):
    """Byte strides of one (layer, kind) tensor for a kvfs target.

    shape and strides (in elements, as torch reports them) are those of the
    4-D tensor: nhd [num_blocks, block_size, heads, head_dim], hnd
    [num_blocks, heads, block_size, head_dim], hf [batch, heads, seq,
    head_dim] (or 3-D [heads, seq, head_dim]). Returns a dict: num_blocks,
    block_stride, head_stride, row_pitch, heads, row_bytes, batch_stride (hf).
    Raises ValueError for a tensor the store's geometry cannot describe."""
    if layout not in LAYOUTS:
        raise ValueError("layout %r is not one of %s" % (layout, ", ".join(LAYOUTS)))
    shape, strides = tuple(shape), tuple(strides)
    if layout == "hf" and len(shape) == 3:
        shape, strides = (1,) + shape, (0,) + strides
    if len(shape) != 4 or len(strides) != 4:
        raise ValueError("%s cache tensors are 4-D, got shape %s" % (layout, shape))
    if strides[3] != 1 and shape[3] > 1:
        raise ValueError("head_dim must be contiguous (stride 1), got strides %s" % (strides,))
    rb = shape[3] * elem_size
    if row_bytes is not None and rb != row_bytes:
        raise ValueError("head_dim %d x %d bytes = %d, the store's rows are %d bytes"
                         % (shape[3], elem_size, rb, row_bytes))
    e = elem_size
    g = {"row_bytes": rb, "batch_stride": 0}
    if layout == "nhd":
        nb, bs, h = shape[0], shape[1], shape[2]
        g.update(num_blocks=nb, block_stride=strides[0] * e, row_pitch=strides[1] * e,
                 head_stride=strides[2] * e, heads=h)
    elif layout == "hnd":
        nb, h, bs = shape[0], shape[1], shape[2]
        g.update(num_blocks=nb, block_stride=strides[0] * e, head_stride=strides[1] * e,
                 row_pitch=strides[2] * e, heads=h)
    else:
        h, seq, bs = shape[1], shape[2], block_tokens
        if seq < block_tokens:
            raise ValueError("sequence of %d tokens holds no whole block of %d" % (seq, block_tokens))
        g.update(num_blocks=seq // block_tokens, block_stride=block_tokens * strides[2] * e,
                 head_stride=strides[1] * e, row_pitch=strides[2] * e, heads=h, batch_stride=strides[0] * e)
    if bs != block_tokens:
        raise ValueError("block_size %d, the store's blocks are %d tokens" % (bs, block_tokens))
    return g


def region_extent(g, block_tokens):
    """Bytes a target region with geometry g spans from its offset (docs/abi.md)."""
    dims = [(g["row_pitch"], block_tokens), (g["head_stride"], g["heads"]), (g["block_stride"], g["num_blocks"])]
    return g["row_bytes"] + sum((n - 1) * s for s, n in dims if n > 1)


def staging_geometry(layers, heads, block_tokens, row_bytes, slots):
    """The host staging target of pin=True: slot s holds one block of this
    rank, [layers, 2, heads, block_tokens, head_dim] contiguous (a record of
    2·layers·heads·block_tokens·row_bytes bytes), so one slot is one H2D
    source and region (l, k) starts at (2l+k)·heads·block_tokens·row_bytes.
    Returns (geometry dict as tensor_geometry, region offsets, total bytes)."""
    tile = heads * block_tokens * row_bytes
    record = 2 * layers * tile
    g = {"num_blocks": slots, "block_stride": record, "head_stride": block_tokens * row_bytes,
         "row_pitch": row_bytes, "heads": heads, "row_bytes": row_bytes, "batch_stride": 0}
    return g, [i * tile for i in range(2 * layers)], record * slots


# -- CUDA driver through ctypes -------------------------------------------------

CU_MEMHOSTREGISTER_PORTABLE = 1


class CudaDriver:
    """The few libcuda.so.1 calls kvfs.torch needs (no cgo, no CUDA toolkit)."""

    _lib = None

    def __init__(self):
        if CudaDriver._lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise OSError(_errno.ENODEV, "kvfs.torch: cannot load libcuda.so.1: %s" % e) from None
            CudaDriver._lib = lib
        self.lib = CudaDriver._lib

    def _call(self, name, *args):
        fn = getattr(self.lib, name)
        r = fn(*args)
        if r != 0:
            s = ctypes.c_char_p()
            try:
                self.lib.cuGetErrorName(r, ctypes.byref(s))
                msg = s.value.decode() if s.value else ""
            except Exception:  # pragma: no cover
                msg = ""
            raise OSError(_errno.EIO, "kvfs.torch: %s failed: CUDA error %d %s" % (name, r, msg))

    def address_range(self, ptr):
        """(base, size) of the allocation holding device pointer ptr."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._call("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        return base.value, size.value

    def ipc_handle(self, base):
        """The raw 64-byte CUipcMemHandle of the allocation at base."""
        h = (ctypes.c_ubyte * abi.IPC_HANDLE_SIZE)()
        self._call("cuIpcGetMemHandle", ctypes.byref(h), ctypes.c_uint64(base))
        return bytes(h)

    def host_register(self, ptr, size):
        self._call("cuMemHostRegister_v2", ctypes.c_void_p(ptr), ctypes.c_size_t(size),
                   ctypes.c_uint(CU_MEMHOSTREGISTER_PORTABLE))

    def host_unregister(self, ptr):
        self._call("cuMemHostUnregister", ctypes.c_void_p(ptr))


# -- the cache --------------------------------------------------------------------


def _hf_layers(cache):
    """[(K, V)] per layer of a transformers cache (DynamicCache of any
    version: .layers[i].keys, .key_cache[i], or the legacy tuple)."""
    layers = getattr(cache, "layers", None)
    if layers is not None and len(layers) and hasattr(layers[0], "keys"):
        return [(l.keys, l.values) for l in layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    if hasattr(cache, "to_legacy_cache"):
        return [tuple(kv[:2]) for kv in cache.to_legacy_cache()]
    return [tuple(kv[:2]) for kv in cache]


def _pairs(kv_caches, kv_dim=None):
    """Per-layer (K, V) from a list of pairs, or of 5-D tensors with K/V on
    kv_dim: vLLM's FlashAttention [2, num_blocks, ...] has it on dim 0,
    FlashInfer's [num_pages, 2, ...] on dim 1; None finds the dim of size 2
    (and refuses when both are)."""
    out = []
    for t in kv_caches:
        if isinstance(t, (tuple, list)):
            out.append((t[0], t[1]))
            continue
        d = kv_dim
        if d is None:
            cands = [i for i in (0, 1) if t.dim() == 5 and t.shape[i] == 2]
            if len(cands) != 1:
                raise ValueError("cannot tell the K/V dim of a tensor of shape %s: pass kv_dim=0 or 1"
                                 % (tuple(t.shape),))
            d = cands[0]
        if t.dim() != 5 or t.shape[d] != 2:
            raise ValueError("a per-layer tensor needs K/V of size 2 on dim %d, shape %s" % (d, tuple(t.shape)))
        out.append((t.select(d, 0), t.select(d, 1)))
    return out


def _metas(n, tags, parents):
    """Per block the tag and parent keywords of a BlockEntry (all None: the
    minor-2 entry)."""
    tags = [None] * n if tags is None else list(tags)
    parents = [None] * n if parents is None else list(parents)
    if len(tags) != n or len(parents) != n:
        raise ValueError("%d blocks, %d tags and %d parents" % (n, len(tags), len(parents)))
    return [dict(tag=t, parent=p) for t, p in zip(tags, parents)]


class KVCache:
    """A KV cache of this process's GPU registered with a kvfs daemon as one
    target. Build it with KVCache.nhd, .hnd or .hf; then load()/store().

    layers: per layer a (K, V) pair of CUDA tensors of one layout (this
    rank's kv-heads). layer_first: the model layer of layers[0] (pipeline
    stages). tp_rank/tp_size: which kv-heads these tensors hold. pin: the
    staging path (see the module doc); staging_blocks: blocks per staging
    chunk (two chunks are pinned). stream: the torch stream for pin=True
    copies (default: the current stream)."""

    def __init__(self, client, layout, layers, layer_first=0, tp_rank=0, tp_size=1, pin=False,
                 staging_blocks=64, stream=None, batch_row=0):
        import torch
        self._torch = torch
        self.client = client
        self.info = info = client.info()
        if not info.caps & abi.CAP_BLOCKS:
            raise KvfsError("register-target", _errno.ENOTTY, ": the daemon has no KV-cache targets (minor 2)")
        self.layout = layout
        self.layers = [(k, v) for k, v in layers]
        if not self.layers:
            raise ValueError("no layers")
        self.layer_first = layer_first
        if layer_first + len(self.layers) > info.layers:
            raise ValueError("layers %d..%d outside the store's %d" % (layer_first, layer_first + len(self.layers) - 1,
                                                                       info.layers))
        self.head_first, self.head_count = tp_head_range(info.kv_heads, tp_rank, tp_size)
        k0 = self.layers[0][0]
        self.device = k0.device
        self.dtype = k0.dtype
        if self.device.type != "cuda" and not _CPU_FOR_TESTS:
            raise ValueError("kvfs.torch moves CUDA tensors; these are on %s" % self.device)
        es = k0.element_size()
        geos = []
        for k, v in self.layers:
            for t in (k, v):
                if t.device != self.device or t.dtype != self.dtype:
                    raise ValueError("every tensor must be on %s as %s" % (self.device, self.dtype))
                g = tensor_geometry(layout, t.shape, t.stride(), es, info.block_tokens, info.row_bytes)
                if g["heads"] != self.head_count:
                    raise ValueError("tensor holds %d kv-heads, rank %d of %d holds %d"
                                     % (g["heads"], tp_rank, tp_size, self.head_count))
                geos.append(g)
        g0 = geos[0]
        self.uniform = all((g["block_stride"], g["head_stride"], g["row_pitch"]) ==
                           (g0["block_stride"], g0["head_stride"], g0["row_pitch"]) for g in geos)
        if any(g["num_blocks"] != g0["num_blocks"] for g in geos):
            raise ValueError("every K and V tensor needs the same number of cache blocks")
        if not pin and not self.uniform:
            raise ValueError("pin=False needs one set of strides for every K and V tensor (a kvfs target "
                             "has one); these differ (Hugging Face's V is often a transposed view): "
                             "pass contiguous copies, or use pin=True")
        if layout == "hf" and not 0 <= batch_row < (k0.shape[0] if k0.dim() == 4 else 1):
            raise ValueError("batch row %d outside the cache's batch" % batch_row)
        self.geometry = g0
        self.num_blocks = g0["num_blocks"]
        self.batch_row = batch_row
        self.pin = pin
        self._buffers = []      # REGISTER_CUDA ids
        self._targets = []
        self._host = None
        self._pinned_ptr = None
        self._events = []
        self._views = []        # [(K view, V view)] as [num_blocks, heads, block_tokens, head_dim]
        bt, hd = info.block_tokens, info.row_bytes // es
        gi = iter(geos)
        for k, v in self.layers:
            pair = []
            for t in (k, v):
                g = next(gi)
                off_el = t.storage_offset() + batch_row * g["batch_stride"] // es
                pair.append(t.as_strided((self.num_blocks, self.head_count, bt, hd),
                                         (g["block_stride"] // es, g["head_stride"] // es, g["row_pitch"] // es, 1),
                                         off_el))
            self._views.append(tuple(pair))
        try:
            if pin:
                self._setup_pinned(staging_blocks, stream)
            else:
                self._setup_cuda()
        except BaseException:
            self.close()
            raise

    # constructors

    @classmethod
    def nhd(cls, client, kv_caches, kv_dim=None, **kw):
        """vLLM / FlashAttention NHD: kv_caches per layer a (K, V) pair of
        [num_blocks, block_size, kv_heads, head_dim] tensors, or one tensor
        with K/V on kv_dim: [2, num_blocks, block_size, kv_heads, head_dim]
        (vLLM FlashAttention, kv_dim 0) or [num_blocks, 2, block_size,
        kv_heads, head_dim] (vLLM FlashInfer NHD, kv_dim 1); None: the dim of
        size 2. kw as KVCache."""
        return cls(client, "nhd", _pairs(kv_caches, kv_dim), **kw)

    @classmethod
    def hnd(cls, client, kv_caches, kv_dim=None, **kw):
        """FlashInfer HND: per layer a (K, V) pair of [num_pages, kv_heads,
        page_size, head_dim] tensors, or one [num_pages, 2, kv_heads,
        page_size, head_dim] tensor (kv_dim 1; None: the dim of size 2)."""
        return cls(client, "hnd", _pairs(kv_caches, kv_dim), **kw)

    @classmethod
    def hf(cls, client, past_key_values, batch_row=0, **kw):
        """A Hugging Face cache (DynamicCache, or a tuple of (K, V) per layer,
        [batch, kv_heads, seq, head_dim]): one batch row; cache block c is
        that row's tokens [c·block_tokens, (c+1)·block_tokens)."""
        return cls(client, "hf", _hf_layers(past_key_values), batch_row=batch_row, **kw)

    # setup

    def _target(self, g, regions):
        t = Target(g["num_blocks"], g["block_stride"], g["head_stride"], g["row_pitch"],
                   self.layer_first, len(self.layers), self.head_first, self.head_count, regions)
        tid = self.client.register_target(t)
        self._targets.append(tid)
        return t, tid

    def _setup_cuda(self):
        if not self.info.caps & abi.CAP_CUDA:
            raise KvfsError("register-cuda", _errno.ENOTTY)
        drv = CudaDriver()
        torch = self._torch
        allocs = {}  # base -> (buffer id)
        regions = []
        dev = self.device.index if self.device.index is not None else torch.cuda.current_device()
        with torch.cuda.device(self.device):
            torch.cuda.synchronize()
            spans = [(v.data_ptr(),) + drv.address_range(v.data_ptr()) for pair in self._views for v in pair]
            bases = {b: n for _, b, n in spans}
            # one buffer stays free for the entry array of calls of more than 509 blocks
            if len(bases) > self.info.max_buffers - 1:
                raise KvfsError("register-cuda", _errno.EMFILE,
                                ": the cache spans %d CUDA allocations and the daemon takes %d buffers per open "
                                "file (one kept for entry arrays); allocate the cache in fewer tensors (e.g. one "
                                "tensor for all layers, views per layer)" % (len(bases), self.info.max_buffers))
            for ptr, base, size in spans:
                if base not in allocs:
                    bid = self.client.register_cuda(drv.ipc_handle(base), 0, size, dev)
                    self._buffers.append(bid)
                    allocs[base] = bid
                regions.append((allocs[base], ptr - base))
        self._target_t, self._tid = self._target(self.geometry, regions)

    def _setup_pinned(self, staging_blocks, stream):
        torch = self._torch
        info = self.info
        self._chunk = max(1, min(staging_blocks, abi.BLOCKS_INLINE_MAX))
        g, offs, total = staging_geometry(len(self.layers), self.head_count, info.block_tokens, info.row_bytes,
                                          2 * self._chunk)
        self._host = self.client.create_host_buffer(total)
        mm = self._host.mm
        self._host_u8 = torch.frombuffer(mm, dtype=torch.uint8)
        self._pinned_ptr = self._host_u8.data_ptr()
        drv = CudaDriver()
        with torch.cuda.device(self.device):
            drv.host_register(self._pinned_ptr, total)
        bt, hd = info.block_tokens, info.row_bytes // self._views[0][0].element_size()
        shape = (2 * self._chunk, len(self.layers), 2, self.head_count, bt, hd)
        self._host_t = self._host_u8.view(self.dtype).view(shape)
        self._dev_stage = torch.empty((2 * self._chunk,) + shape[1:], dtype=self.dtype, device=self.device)
        self._stream = stream
        self._events = [None, None]
        self._host_target_t, self._host_tid = self._target(g, [(self._host.id, o) for o in offs])

    @property
    def target_id(self):
        """The target over the tensors themselves (pin=False), for
        Client.load_blocks and store_blocks with a BlockArray (entries packed
        once, all ranges given); None with pin=True."""
        return None if self.pin else self._tid

    def wait_idle(self):
        """Wait until the work queued on the current stream is done: call
        before moving bytes through target_id (load() and store() do)."""
        torch = self._torch
        with torch.cuda.device(self.device):
            torch.cuda.current_stream().synchronize()

    # moving blocks

    def _entries(self, block_ids, cache_block_ids, load):
        block_ids, cache = list(block_ids), [int(c) for c in cache_block_ids]
        if len(block_ids) != len(cache):
            raise ValueError("%d block ids for %d cache blocks" % (len(block_ids), len(cache)))
        for c in cache:
            if not 0 <= c < self.num_blocks:
                raise ValueError("cache block %d outside 0..%d" % (c, self.num_blocks - 1))
        if load and len(set(cache)) != len(cache):
            raise ValueError("a load names the same cache block twice")
        return block_ids, cache

    def _range(self):
        return dict(layer_first=self.layer_first, layer_count=len(self.layers),
                    head_first=self.head_first, head_count=self.head_count)

    def load(self, block_ids, cache_block_ids, tags=None):
        """Load blocks block_ids[i] of the store into cache blocks
        cache_block_ids[i] (this rank's heads, every layer, K and V).
        tags: None, or per block the 16-byte tag it must be stored under
        (minor 3; a block under another tag is ABSENT, none of its bytes
        loaded). Returns one status per block (kvfs.OK, ABSENT, CORRUPT,
        ...); a block that is not OK leaves its cache block unspecified
        (pin=False: the daemon zeroes what failed its CRC; pin=True:
        untouched)."""
        block_ids, cache = self._entries(block_ids, cache_block_ids, True)
        metas = _metas(len(block_ids), tags, None)
        r = self._range()
        if not self.pin:
            torch = self._torch
            with torch.cuda.device(self.device):
                torch.cuda.current_stream().synchronize()  # nothing queued may still write the cache
            es = [BlockEntry(b, c, **r, **m) for b, c, m in zip(block_ids, cache, metas)]
            return self.client.load_blocks(self._tid, es)
        return self._load_pinned(block_ids, cache, r, metas)

    def store(self, block_ids, cache_block_ids, tags=None, parents=None):
        """Store cache blocks cache_block_ids[i] as blocks block_ids[i],
        durably (this rank's heads: with tensor parallelism every rank stores
        its shard). Work queued on the current stream before the call is
        included. tags, parents: None, or per block its 16-byte tag and the
        id of the block before it in its sequence (None: first), recorded
        with it (minor 3). Returns one status per block."""
        block_ids, cache = self._entries(block_ids, cache_block_ids, False)
        metas = _metas(len(block_ids), tags, parents)
        r = self._range()
        torch = self._torch
        if not self.pin:
            with torch.cuda.device(self.device):
                torch.cuda.current_stream().synchronize()
            es = [BlockEntry(b, c, **r, **m) for b, c, m in zip(block_ids, cache, metas)]
            return self.client.store_blocks(self._tid, es)
        return self._store_pinned(block_ids, cache, r, metas)

    def _load_pinned(self, block_ids, cache, r, metas):
        torch = self._torch
        out = []
        n_chunk = self._chunk
        with torch.cuda.device(self.device):
            stream = self._stream or torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                for i, lo in enumerate(range(0, len(block_ids), n_chunk)):
                    half = i % 2
                    s0 = half * n_chunk
                    ev = self._events[half]
                    if ev is not None:
                        ev.synchronize()  # the GPU has finished reading this half
                    ids = block_ids[lo:lo + n_chunk]
                    cb = cache[lo:lo + n_chunk]
                    es = [BlockEntry(b, s0 + j, **r, **metas[lo + j]) for j, b in enumerate(ids)]
                    st = self.client.load_blocks(self._host_tid, es)
                    out.extend(st)
                    ok = [j for j, s in enumerate(st) if s == OK]
                    if ok:
                        n = len(ids)
                        dev = self._dev_stage[s0:s0 + n]
                        dev.copy_(self._host_t[s0:s0 + n], non_blocking=True)
                        src_idx = torch.tensor(ok, device=self.device) + s0 if len(ok) < n else None
                        dst = torch.tensor([cb[j] for j in ok], device=self.device)
                        for li, (kv, vv) in enumerate(self._views):
                            for k, view in enumerate((kv, vv)):
                                src = self._dev_stage[s0:s0 + n, li, k] if src_idx is None \
                                    else self._dev_stage[:, li, k].index_select(0, src_idx)
                                view.index_copy_(0, dst, src)
                    e = torch.cuda.Event()
                    e.record(stream)
                    self._events[half] = e
            stream.synchronize()
        return out

    def _store_pinned(self, block_ids, cache, r, metas):
        torch = self._torch
        out = []
        n_chunk = self._chunk
        with torch.cuda.device(self.device):
            cur = torch.cuda.current_stream()
            stream = self._stream or cur
            if stream is not cur:
                stream.wait_stream(cur)
            with torch.cuda.stream(stream):
                for lo in range(0, len(block_ids), n_chunk):
                    ids = block_ids[lo:lo + n_chunk]
                    n = len(ids)
                    idx = torch.tensor(cache[lo:lo + n], device=self.device)
                    for li, (kv, vv) in enumerate(self._views):
                        for k, view in enumerate((kv, vv)):
                            self._dev_stage[:n, li, k].copy_(view.index_select(0, idx))
                    self._host_t[:n].copy_(self._dev_stage[:n], non_blocking=True)
                    stream.synchronize()
                    es = [BlockEntry(b, j, **r, **metas[lo + j]) for j, b in enumerate(ids)]
                    out.extend(self.client.store_blocks(self._host_tid, es))
        return out

    def close(self):
        """Drop the targets and registrations (the tensors stay yours)."""
        for tid in self._targets:
            try:
                self.client.unregister_target(tid)
            except KvfsError:
                pass
        self._targets = []
        for b in self._buffers:
            try:
                self.client.unregister(b)
            except KvfsError:
                pass
        self._buffers = []
        if self._host is not None:
            for e in self._events:
                if e is not None:
                    e.synchronize()
            if self._pinned_ptr is not None:
                try:
                    with self._torch.cuda.device(self.device):
                        CudaDriver().host_unregister(self._pinned_ptr)
                except OSError:
                    pass
                self._pinned_ptr = None
            self._host_t = self._host_u8 = None
            self._host.close()
            self._host = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
