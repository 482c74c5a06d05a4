"""Python client of the kvfs control ioctls (docs/abi.md).

Pure standard library (ctypes, mmap, struct). Open a kvfs mount's control
file, register host memory (a memfd, or a file of /dev/shm, mapped by both
sides), and load or store many KV-cache groups per ioctl straight between
the store and that memory::

    import kvfs
    with kvfs.Client("/mnt/kvcache") as c:
        info = c.info()
        buf = c.create_host_buffer(64 << 20)       # a memfd, mapped, registered
        st = c.load([kvfs.Entry(block=0xabc, layer=0, head=0, kind="K",
                                buffer=buf.id, offset=0)])
        assert st == [kvfs.OK]
        tile = buf.view[0:info.group_bytes]        # memoryview, no copy
        arr = buf.numpy("uint16")                  # optional, needs numpy

Registrations belong to the Client's open file: closing it (or the process
dying) releases them in the daemon. Client.close() also closes the host
buffers the client created or opened; a created buffer has no name in any
file system (a memfd; with an older daemon a /dev/shm file unlinked as soon
as it is registered), so a killed client leaves nothing behind.
"""

import array
import collections
import contextlib
import ctypes
import errno as _errno
import mmap
import os
import secrets
import struct
import threading

from . import abi
from .abi import (OK, ABSENT, CORRUPT, BAD_REQUEST, IO_ERROR, NO_SPACE,  # noqa: F401
                  BAD_NONE, BAD_KEY, BAD_BUFFER, BAD_RANGE, BAD_PITCH, BAD_RESERVED,
                  BAD_PARENT, BAD_META, TAG_MISMATCH, LOOKUP_PRESENT, LOOKUP_ABSENT, LOOKUP_TAG_MISMATCH,
                  STATUS_NAMES, DETAIL_NAMES, ABI_VERSION)

__all__ = ["Client", "Entry", "Info", "HostBuffer", "KvfsError", "status_name", "Target", "BlockEntry",
           "BlockArray", "LookupResult", "OK", "ABSENT", "CORRUPT", "BAD_REQUEST", "IO_ERROR", "NO_SPACE",
           "TAG_MISMATCH", "LOOKUP_PRESENT", "LOOKUP_ABSENT", "LOOKUP_TAG_MISMATCH"]

CTL_PATH = ".kvfs/ctl"
SHM_DIR = "/dev/shm"

Entry = collections.namedtuple("Entry", "block layer head kind buffer offset pitch", defaults=(0,))
Entry.__doc__ = """One group to move: (block, layer, head, kind) <-> buffer at offset.

kind is 0/1 or "K"/"V". pitch 0 means the tile's group_bytes are contiguous;
otherwise row r starts at offset + r*pitch and is row_bytes long."""

Info = collections.namedtuple("Info", abi.INFO_FIELDS)

Target = collections.namedtuple(
    "Target", "num_blocks block_stride head_stride row_pitch layer_first layer_count head_first head_count regions")
Target.__doc__ = """A paged KV cache (docs/abi.md, "Targets"): the tile of cache block c,
head h of (layer l, kind k) starts at regions[2*(l-layer_first)+k] = (buffer, offset)
+ c*block_stride + (h-head_first)*head_stride, its token row r at + r*row_pitch.
Client.nhd_target, hnd_target and hf_target fill in the strides."""

BlockEntry = collections.namedtuple(
    "BlockEntry", "block cache_block layer_first layer_count head_first head_count kinds tag parent",
    defaults=(None, None, None, None, abi.KINDS_BOTH, None, None))
BlockEntry.__doc__ = """One block: block's groups of the layer, head and kind ranges to or
from cache block cache_block of a target. None ranges mean the target's.

Minor 3 (KVFS_CAP_PREFIX): tag, 16 bytes or None, is recorded by a store and
expected by a load (a block stored under another tag loads as ABSENT with
detail TAG_MISMATCH); parent, a block id or None, is recorded by a store as
the block before this one in its sequence. A call where any entry has a tag
or parent sends the 64-byte tagged entries (docs/abi.md, "Tagged block
entries"); a tagged store always sets both, None meaning the zero tag and
no parent."""

LookupResult = collections.namedtuple("LookupResult", "statuses present absent mismatch run")
LookupResult.__doc__ = """LOOKUP's answer: statuses, one per pair (LOOKUP_PRESENT, LOOKUP_ABSENT,
LOOKUP_TAG_MISMATCH); the counts of each; run, the leading pairs present
(the blocks of the sequence a request can reuse)."""


class BlockArray:
    """Block entries packed once in the ABI's tagged form (64 bytes each), for
    calls that move the same blocks again and again: one LOAD_BLOCKS per
    layer of a prefix, say. Client.load_blocks and store_blocks take it in
    place of a list of BlockEntry and skip packing each entry; set_layers
    changes the layer range of every entry in one pass.

    blocks, cache_blocks: one per entry; tags: None, or per entry 16 bytes
    or None; parents: None, or per entry a block id or None. The layer, head
    and kind ranges are those of every entry (all given: a BlockArray needs
    no target to fill them in)."""

    def __init__(self, blocks, cache_blocks, layer_first, layer_count, head_first, head_count,
                 kinds=abi.KINDS_BOTH, tags=None, parents=None):
        blocks = list(blocks)
        cache_blocks = list(cache_blocks)
        n = len(blocks)
        tags = [None] * n if tags is None else list(tags)
        parents = [None] * n if parents is None else list(parents)
        if not len(cache_blocks) == len(tags) == len(parents) == n:
            raise ValueError("%d blocks, %d cache blocks, %d tags and %d parents"
                             % (n, len(cache_blocks), len(tags), len(parents)))
        zero = bytes(abi.TAG_SIZE)
        pack = abi.BLOCK_ENTRY_TAGGED.pack
        out = []
        for b, c, t, p in zip(blocks, cache_blocks, tags, parents):
            t = zero if t is None else bytes(t)
            if len(t) != abi.TAG_SIZE:
                raise ValueError("a tag is %d bytes, not %d" % (abi.TAG_SIZE, len(t)))
            out.append(pack(b, c, layer_first, layer_count, head_first, head_count, kinds, 0, 0, 0, 0, 0,
                            t, p or 0, abi.META_PARENT if p is not None else 0, 0))
        self.buf = bytearray(b"".join(out))
        self.count = n
        self.tagged = any(t is not None for t in tags) or any(p is not None for p in parents)
        self.layer_first, self.layer_count = layer_first, layer_count

    def set_layers(self, layer_first, layer_count):
        """Make every entry cover layers layer_first .. + layer_count."""
        if not (0 <= layer_first < 1 << 16 and 0 <= layer_count < 1 << 16):
            raise ValueError("layers %d + %d" % (layer_first, layer_count))
        if self.count:
            h = memoryview(self.buf).cast("H")
            per = abi.BLOCK_ENTRY_TAGGED.size // 2
            h[_LAYER_FIRST_OFF // 2::per] = array.array("H", [layer_first]) * self.count
            h[_LAYER_FIRST_OFF // 2 + 1::per] = array.array("H", [layer_count]) * self.count
            h.release()
        self.layer_first, self.layer_count = layer_first, layer_count
        return self

    def copy(self):
        """Another BlockArray of the same entries, whose layers change apart."""
        c = object.__new__(BlockArray)
        c.buf, c.count, c.tagged = bytearray(self.buf), self.count, self.tagged
        c.layer_first, c.layer_count = self.layer_first, self.layer_count
        return c


_LAYER_FIRST_OFF = 12  # of layer_first (u16) and then layer_count in a block entry

# ioctl(2) through ctypes: the GIL is released for the call (Client.ioctl)
_libc = ctypes.CDLL(None, use_errno=True)
_libc_ioctl = _libc.ioctl
_libc_ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
_libc_ioctl.restype = ctypes.c_int


def status_name(s):
    return abi.STATUS_NAMES.get(s, "status(%d)" % s)


_REASONS = {
    _errno.EPROTO: "daemon speaks another ABI version",
    _errno.ENOTTY: "not a kvfs control file, or unknown command",
    _errno.EBADF: "session closed",
    _errno.EFAULT: "registered memory faulted (was the file shrunk?)",
    _errno.EROFS: "store is read-only",
}
_REGISTER_REASONS = {
    _errno.EPERM: "file is not inside " + SHM_DIR,
    _errno.ELOOP: "path has a symbolic link",
    _errno.EACCES: "caller may not open the file read-write",
    _errno.EINVAL: "not a regular file, or malformed request",
    _errno.EXDEV: "file is not on tmpfs or hugetlbfs",
    _errno.ERANGE: "length is zero or beyond the end of the file",
    _errno.EMFILE: "too many buffers registered on this handle",
    _errno.EDQUOT: "registered-bytes limit of this handle",
    _errno.ENOENT: "no such file",
    _errno.ESRCH: "the daemon cannot see this process (another pid namespace?)",
    _errno.ENOMEM: "over the pinned-memory limit (RLIMIT_MEMLOCK, or the daemon's per-uid or total cap)",
    _errno.EBADF: "not an open descriptor (O_PATH or closed)",
}
_CUDA_REASONS = {
    _errno.ENOTTY: "the daemon has no CUDA support (KVFS_CAP_CUDA not set)",
    _errno.ENODEV: "no usable GPU in the daemon (no driver or device, no such ordinal, or kvfs mount --gpu=false)",
    _errno.ESRCH: "the daemon cannot see this process (another pid namespace?)",
    _errno.EACCES: "caller may not open /dev/nvidiactl and /dev/nvidia-uvm read-write",
    _errno.EINVAL: "the driver refused the handle (not the base of an allocation, exporter gone), or malformed request",
    _errno.ERANGE: "offset + length beyond the allocation",
    _errno.EMFILE: "too many buffers registered on this handle",
    _errno.EDQUOT: "registered-bytes limit of this handle",
}


class KvfsError(OSError):
    """A failed control ioctl; .errno is the errno, .op the operation."""

    def __init__(self, op, err, extra=""):
        reason = ((op in ("register", "register-fd") and _REGISTER_REASONS.get(err))
                  or (op == "register-cuda" and _CUDA_REASONS.get(err)) or _REASONS.get(err)
                  or os.strerror(err))
        super().__init__(err, "kvfs %s: %s%s" % (op, reason, extra))
        self.op = op


def _allocate(fd, size):
    """Size a new tmpfs file and allocate its pages, so the daemon can pin
    them without allocating anything itself."""
    os.ftruncate(fd, size)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (_errno.EOPNOTSUPP, _errno.EINVAL):
            raise


def _kind(k):
    if k in (0, 1):
        return k
    if k in ("K", "k"):
        return 0
    if k in ("V", "v"):
        return 1
    raise ValueError("kind %r is not K or V" % (k,))


class HostBuffer:
    """Shared memory mapped here and registered with the daemon.

    .view is a writable memoryview of the whole registered range; release any
    views you take (and numpy arrays over it) before close(). .pinned tells
    whether the daemon's engine pinned it for zero-copy I/O."""

    def __init__(self, client, fd, size, path):
        self._client = client
        self.path = path
        self.size = size
        self.pinned = False
        self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            if client.info().caps & abi.CAP_REGISTER_FD:
                self.id, self.pinned = client._register_fd(fd, size)
            else:
                self.id = client.register_host(path, size)
        except BaseException:
            self.mm.close()
            raise
        self.view = memoryview(self.mm)

    def numpy(self, dtype="uint8", shape=None, offset=0, count=-1):
        """A numpy array over the buffer (no copy). Needs numpy."""
        try:
            import numpy as np
        except ImportError as e:  # pragma: no cover - numpy is optional
            raise ImportError("HostBuffer.numpy needs numpy; use .view (a memoryview) without it") from e
        a = np.frombuffer(self.mm, dtype=dtype, count=count, offset=offset)
        return a.reshape(shape) if shape is not None else a

    def close(self):
        if self.mm is None:
            return
        self._client._disown(self)
        try:
            self._client.unregister(self.id)
        except KvfsError as e:
            if e.errno != _errno.EBADF:
                raise
        finally:
            self.view.release()
            mm, self.mm = self.mm, None
            mm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Client:
    """An open control file of a kvfs mount. Thread-safe."""

    def __init__(self, mountpoint=None, ctl_path=None):
        path = ctl_path or os.path.join(mountpoint, CTL_PATH)
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self._local = threading.local()
        self._owned = set()
        self._owned_lock = threading.RLock()
        self._free_arrays = []  # registered entry arrays no call holds (_entry_array)
        self._targets = set()
        try:
            self._info = self._read_info()
        except BaseException:
            os.close(self._fd)
            raise
        if self._info.abi != abi.ABI_VERSION:
            os.close(self._fd)
            raise KvfsError("open", _errno.EPROTO, ": daemon ABI %d, client %d" % (self._info.abi, abi.ABI_VERSION))

    # -- raw ----------------------------------------------------------------

    def fileno(self):
        return self._fd

    def ioctl(self, cmd, buf, op="ioctl"):
        """Issue a raw ioctl with a bytearray of _IOC_SIZE(cmd) bytes (or None).

        The call runs with the GIL released (a ctypes call), whatever the
        buffer's size: fcntl.ioctl keeps the GIL through an ioctl whose
        buffer is over 1,024 bytes (the inline calls), and a load on one
        thread would then stall every other thread of the process, a
        model's forward too, for the whole call. A buffer shorter than
        _IOC_SIZE(cmd) is copied into one of that size first, so the daemon
        never reads or writes past it."""
        if self._fd < 0:
            raise KvfsError(op, _errno.EBADF)
        arg, tmp = None, None
        if buf is not None:
            size = abi.ioc_size(cmd)
            if isinstance(buf, bytearray) and len(buf) >= size:
                arg = (ctypes.c_char * len(buf)).from_buffer(buf)
            else:
                tmp = bytearray(max(size, len(buf)))
                tmp[:len(buf)] = buf
                arg = (ctypes.c_char * len(tmp)).from_buffer(tmp)
        while True:
            ret = _libc_ioctl(self._fd, cmd, arg)
            if ret >= 0:
                break
            e = ctypes.get_errno()
            if e != _errno.EINTR:
                raise KvfsError(op, e)
        if tmp is not None and isinstance(buf, bytearray):
            buf[:] = tmp[:len(buf)]
        return ret

    # -- commands -----------------------------------------------------------

    def _read_info(self):
        b = bytearray(abi.INFO.size)
        self.ioctl(abi.IOC_INFO, b, "info")
        v = list(abi.INFO.unpack(b))
        fields = v[:len(abi.INFO_FIELDS)]
        fields[abi.INFO_FIELDS.index("engine")] = fields[abi.INFO_FIELDS.index("engine")].rstrip(b"\0").decode()
        return Info(*fields)

    def info(self):
        """The daemon's Info (geometry, group_bytes, row_bytes, limits, caps)."""
        return self._info

    def register_host(self, path, size=0):
        """Register the first size bytes (0: all) of a /dev/shm file; returns the buffer id."""
        p = os.fsencode(path)
        if len(p) >= abi.PATH_MAX:
            raise KvfsError("register", _errno.ENAMETOOLONG)
        b = bytearray(abi.REGISTER_HOST.pack(abi.ABI_VERSION, 0, size, 0, 0, 0, p))
        self.ioctl(abi.IOC_REGISTER_HOST, b, "register")
        return abi.REGISTER_HOST.unpack(b)[3]

    def register_fd(self, fd, size=0):
        """Register the first size bytes (0: all) of the file open read-write as
        fd in this process (a memfd, a /dev/shm file; tmpfs or hugetlbfs). The
        daemon takes the descriptor itself, so fd may be closed afterwards.
        Returns the buffer id."""
        return self._register_fd(fd, size)[0]

    def _register_fd(self, fd, size):
        b = bytearray(abi.REGISTER_FD.pack(abi.ABI_VERSION, 0, size, 0, fd, 0, 0, 0, 0, 0, 0))
        self.ioctl(abi.IOC_REGISTER_FD, b, "register-fd")
        v = abi.REGISTER_FD.unpack(b)
        return v[3], bool(v[5])

    def register_cuda(self, handle, offset, length, device=0):
        """Register bytes [offset, offset+length) of a CUDA allocation of this
        process (REGISTER_CUDA): handle is the raw 64-byte CUipcMemHandle of
        the allocation's base (cuIpcGetMemHandle; not PyTorch's _share_cuda_
        bytes), device the ordinal as the daemon's driver numbers devices
        (same CUDA_VISIBLE_DEVICES on both sides, or unset in both).
        Returns the buffer id; unregister() drops it. kvfs.torch does all of
        this for tensors."""
        b = abi.pack_register_cuda(handle, offset, length, device)
        if not self._info.caps & abi.CAP_CUDA:
            raise KvfsError("register-cuda", _errno.ENOTTY)
        self.ioctl(abi.IOC_REGISTER_CUDA, b, "register-cuda")
        return struct.unpack_from("<I", b, abi.REGISTER_CUDA_BUFFER_OFF)[0]

    def _own(self, buf):
        with self._owned_lock:
            if self._fd < 0:
                buf.close()
                raise KvfsError("register", _errno.EBADF)
            self._owned.add(buf)
        return buf

    def _disown(self, buf):
        with self._owned_lock:
            self._owned.discard(buf)

    def unregister(self, buffer_id):
        b = bytearray(abi.UNREGISTER.pack(abi.ABI_VERSION, buffer_id))
        self.ioctl(abi.IOC_UNREGISTER, b, "unregister")

    def create_host_buffer(self, size, name=None):
        """Create size bytes of shared memory, allocate them, map and register
        them. Nothing is left in any file system: a memfd, or with a daemon
        without REGISTER_FD a /dev/shm file unlinked as soon as it is
        registered. close(), or closing the client, frees it."""
        if size <= 0:
            raise ValueError("size must be positive")
        name = name or "kvfs-%d-%s" % (os.getpid(), secrets.token_hex(8))
        if self._info.caps & abi.CAP_REGISTER_FD:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            try:
                _allocate(fd, size)
                return self._own(HostBuffer(self, fd, size, "memfd:" + name))
            finally:
                os.close(fd)
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            _allocate(fd, size)
            return self._own(HostBuffer(self, fd, size, path))
        finally:
            os.close(fd)
            os.unlink(path)

    def open_host_buffer(self, path, size=0):
        """Map and register an existing tmpfs file, e.g. in /dev/shm (size 0: all
        of it); it is opened here, read-write. close() keeps the file."""
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if size == 0:
                size = os.fstat(fd).st_size
            return self._own(HostBuffer(self, fd, size, path))
        finally:
            os.close(fd)

    def load(self, entries, details=False):
        """Load groups into registered buffers. Returns one status per entry
        (or (status, detail) pairs with details=True)."""
        return self._batch(True, entries, details)

    def store(self, entries, details=False):
        """Store groups from registered buffers, durably. Statuses as load."""
        return self._batch(False, entries, details)

    def _buffers(self):
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = self._local.bufs = (bytearray(abi.BATCH_SIZE), bytearray(abi.BATCH_SMALL_SIZE))
        return bufs

    def _batch(self, load, entries, details):
        big, small = self._buffers()
        out = []
        op = "load" if load else "store"
        pack = abi.ENTRY.pack_into
        esz, hsz = abi.ENTRY.size, abi.BATCH_HDR.size
        entries = list(entries)
        for lo in range(0, len(entries), abi.BATCH_MAX):
            chunk = entries[lo:lo + abi.BATCH_MAX]
            n = len(chunk)
            if n <= abi.BATCH_SMALL_MAX:
                buf, cmd = small, (abi.IOC_LOAD_SMALL if load else abi.IOC_STORE_SMALL)
            else:
                buf, cmd = big, (abi.IOC_LOAD if load else abi.IOC_STORE)
            abi.BATCH_HDR.pack_into(buf, 0, abi.ABI_VERSION, n, 0, 0)
            for i, e in enumerate(chunk):
                block, layer, head, kind, buffer, offset, pitch = e
                pack(buf, hsz + i * esz, block, offset, buffer, pitch, layer, head, _kind(kind), 0, 0, 0)
            self.ioctl(cmd, buf, op)
            so, do = abi.ENTRY_STATUS_OFF, abi.ENTRY_DETAIL_OFF
            if details:
                out.extend((buf[hsz + i * esz + so], buf[hsz + i * esz + do]) for i in range(n))
            else:
                out.extend(buf[hsz + i * esz + so] for i in range(n))
        return out

    # -- KV-cache targets (minor 2) -----------------------------------------

    def _layout(self, kind, blocks_or_seq, regions, layer_first, layers, head_first, heads):
        i = self._info
        heads = i.kv_heads - head_first if heads is None else heads
        layers = i.layers - layer_first if layers is None else layers
        rb, bt = i.row_bytes, i.block_tokens
        if kind == "nhd":
            nb, bs, hs, rp = blocks_or_seq, bt * heads * rb, rb, heads * rb
        elif kind == "hnd":
            nb, bs, hs, rp = blocks_or_seq, heads * bt * rb, bt * rb, rb
        else:
            nb, bs, hs, rp = blocks_or_seq // bt, bt * rb, blocks_or_seq * rb, rb
        return Target(nb, bs, hs, rp, layer_first, layers, head_first, heads, list(regions))

    def nhd_target(self, num_blocks, regions, layer_first=0, layers=None, head_first=0, heads=None):
        """vLLM / FlashAttention [num_blocks, block_tokens, heads, head_dim] per
        (layer, kind); regions: (buffer_id, offset) per (layer, kind), K first."""
        return self._layout("nhd", num_blocks, regions, layer_first, layers, head_first, heads)

    def hnd_target(self, num_blocks, regions, layer_first=0, layers=None, head_first=0, heads=None):
        """FlashInfer [num_blocks, heads, block_tokens, head_dim] per (layer, kind)."""
        return self._layout("hnd", num_blocks, regions, layer_first, layers, head_first, heads)

    def hf_target(self, seq_tokens, regions, layer_first=0, layers=None, head_first=0, heads=None):
        """One sequence of a Hugging Face cache, [heads, seq_tokens, head_dim] per
        (layer, kind); cache block c is tokens [c*block_tokens, (c+1)*block_tokens)."""
        return self._layout("hf", seq_tokens, regions, layer_first, layers, head_first, heads)

    @staticmethod
    def region_bytes(info, target):
        """Bytes one (layer, kind) region of target spans from its offset."""
        dims = sorted([(target.row_pitch, info.block_tokens), (target.head_stride, target.head_count),
                       (target.block_stride, target.num_blocks)])
        return info.row_bytes + sum((n - 1) * s for s, n in dims if n > 1)

    def register_target(self, target):
        """Register a Target; returns its id. The daemon validates it once."""
        if not self._info.caps & abi.CAP_BLOCKS:
            raise KvfsError("register-target", _errno.ENOTTY)
        if len(target.regions) != 2 * target.layer_count or len(target.regions) > abi.TARGET_MAX_REGIONS:
            raise KvfsError("register-target", _errno.EINVAL, ": %d regions for %d layers"
                            % (len(target.regions), target.layer_count))
        b = bytearray(abi.TARGET_SIZE)
        abi.TARGET_HDR.pack_into(b, 0, abi.ABI_VERSION, 0, 0, target.num_blocks, target.block_stride,
                                 target.head_stride, target.row_pitch, self._info.row_bytes, target.layer_first,
                                 target.layer_count, target.head_first, target.head_count, 0, 0)
        for i, (buf, off) in enumerate(target.regions):
            abi.TARGET_REGION.pack_into(b, abi.TARGET_HDR.size + i * abi.TARGET_REGION.size, off, buf, 0)
        self.ioctl(abi.IOC_REGISTER_TARGET, b, "register-target")
        tid = struct.unpack_from("<I", b, abi.TARGET_OUT_OFF)[0]
        with self._owned_lock:
            self._targets.add(tid)
        return tid

    def unregister_target(self, target_id):
        """Drop a target (its buffers can then be unregistered)."""
        with self._owned_lock:
            self._targets.discard(target_id)
        self.ioctl(abi.IOC_UNREGISTER_TARGET, bytearray(abi.UNREGISTER_TARGET.pack(abi.ABI_VERSION, target_id)),
                   "unregister-target")

    def load_blocks(self, target, entries, details=False):
        """Load whole blocks (BlockEntry; None ranges = the target's) into a
        target. Returns one status per entry, or (status, detail, groups_ok)
        with details=True. target is a Target (for the None ranges) and id
        pair, or an id when every range is given. entries may be a
        BlockArray (packed once, sent as it is)."""
        return self._blocks(True, target, entries, details)

    def store_blocks(self, target, entries, details=False):
        """Store whole blocks from a target, durably. As load_blocks."""
        return self._blocks(False, target, entries, details)

    def _blocks(self, load, target, entries, details):
        if isinstance(target, tuple):
            t, tid = target
        else:
            t, tid = None, target
        op = "load-blocks" if load else "store-blocks"
        if isinstance(entries, BlockArray):
            return self._block_array(load, tid, entries, details, op)
        packed, tagged = [], False
        for e in entries:
            e = BlockEntry(*e)
            lf, lc, hf, hc = e.layer_first, e.layer_count, e.head_first, e.head_count
            if None in (lf, lc, hf, hc):
                if t is None:
                    raise ValueError("ranges left to the target need (target, id)")
                lf = t.layer_first if lf is None else lf
                lc = t.layer_count if lc is None else lc
                hf = t.head_first if hf is None else hf
                hc = t.head_count if hc is None else hc
            tag = bytes(e.tag) if e.tag is not None else bytes(abi.TAG_SIZE)
            if len(tag) != abi.TAG_SIZE:
                raise ValueError("a tag is %d bytes, not %d" % (abi.TAG_SIZE, len(tag)))
            tagged = tagged or e.tag is not None or e.parent is not None
            packed.append(((e.block, e.cache_block, lf, lc, hf, hc, e.kinds),
                           (tag, e.parent or 0, abi.META_PARENT if e.parent is not None else 0)))
        if tagged and not self._info.caps & abi.CAP_PREFIX:
            raise KvfsError(op, _errno.ENOTTY, ": the daemon has no block tags (minor 3)")
        esz = abi.BLOCK_ENTRY_TAGGED.size if tagged else abi.BLOCK_ENTRY.size
        flags = abi.BLOCKS_TAGGED if tagged else 0

        def pack(b, off, p):
            if tagged:
                abi.BLOCK_ENTRY_TAGGED.pack_into(b, off, *p[0], 0, 0, 0, 0, 0, *p[1], 0)
            else:
                abi.BLOCK_ENTRY.pack_into(b, off, *p[0], 0, 0, 0, 0, 0)

        out = []
        inline_max = abi.BLOCKS_INLINE_TAGGED_MAX if tagged else abi.BLOCKS_INLINE_MAX
        if len(packed) <= inline_max:
            b = bytearray(abi.BLOCKS_INLINE_SIZE)
            abi.BLOCKS.pack_into(b, 0, abi.ABI_VERSION, flags, tid, len(packed), 0, 0, 0, 0, 0, 0, 0)
            for i, p in enumerate(packed):
                pack(b, abi.BLOCKS.size + i * esz, p)
            self.ioctl(abi.IOC_LOAD_BLOCKS_INLINE if load else abi.IOC_STORE_BLOCKS_INLINE, b, op)
            return self._block_results(b, abi.BLOCKS.size, len(packed), details, esz)
        with self._entry_array() as arr:
            per = min(abi.BLOCKS_MAX, arr.size // esz)
            for lo in range(0, len(packed), per):
                chunk = packed[lo:lo + per]
                for i, p in enumerate(chunk):
                    pack(arr.mm, i * esz, p)
                h = bytearray(abi.BLOCKS.pack(abi.ABI_VERSION, flags, tid, len(chunk), arr.id, 0, 0, 0, 0, 0, 0))
                self.ioctl(abi.IOC_LOAD_BLOCKS if load else abi.IOC_STORE_BLOCKS, h, op)
                out.extend(self._block_results(arr.mm, 0, len(chunk), details, esz))
        return out

    def _block_array(self, load, tid, ba, details, op):
        """LOAD_BLOCKS or STORE_BLOCKS of a BlockArray: its bytes copied as they are."""
        if not ba.count:
            return []
        data, esz, flags = ba.buf, abi.BLOCK_ENTRY_TAGGED.size, abi.BLOCKS_TAGGED
        if not self._info.caps & abi.CAP_PREFIX:
            if ba.tagged:
                raise KvfsError(op, _errno.ENOTTY, ": the daemon has no block tags (minor 3)")
            # a minor-2 daemon: the 32-byte entries the tagged ones begin with
            n, esz, flags = abi.BLOCK_ENTRY.size, abi.BLOCK_ENTRY.size, 0
            data = b"".join(ba.buf[i:i + n] for i in range(0, len(ba.buf), abi.BLOCK_ENTRY_TAGGED.size))
        inline_max = abi.BLOCKS_INLINE_TAGGED_MAX if flags else abi.BLOCKS_INLINE_MAX
        if ba.count <= inline_max:
            b = bytearray(abi.BLOCKS_INLINE_SIZE)
            abi.BLOCKS.pack_into(b, 0, abi.ABI_VERSION, flags, tid, ba.count, 0, 0, 0, 0, 0, 0, 0)
            b[abi.BLOCKS.size:abi.BLOCKS.size + len(data)] = data
            self.ioctl(abi.IOC_LOAD_BLOCKS_INLINE if load else abi.IOC_STORE_BLOCKS_INLINE, b, op)
            return self._block_results(b, abi.BLOCKS.size, ba.count, details, esz)
        out = []
        with self._entry_array() as arr:
            per = min(abi.BLOCKS_MAX, arr.size // esz)
            for lo in range(0, ba.count, per):
                n = min(per, ba.count - lo)
                arr.mm[:n * esz] = data[lo * esz:(lo + n) * esz]
                h = bytearray(abi.BLOCKS.pack(abi.ABI_VERSION, flags, tid, n, arr.id, 0, 0, 0, 0, 0, 0))
                self.ioctl(abi.IOC_LOAD_BLOCKS if load else abi.IOC_STORE_BLOCKS, h, op)
                out.extend(self._block_results(arr.mm, 0, n, details, esz))
        return out

    @contextlib.contextmanager
    def _entry_array(self):
        """A registered buffer that carries entry and pair arrays too long for
        an inline call, held by one call at a time: a free one, or one made
        now. Each call holding its own, calls from several threads run at
        once (a layer-by-layer load keeps two in flight)."""
        arr = None
        with self._owned_lock:
            while self._free_arrays and arr is None:
                arr = self._free_arrays.pop()
                if arr.mm is None:  # closed with the client's buffers
                    arr = None
        if arr is None:
            arr = self.create_host_buffer(abi.BLOCKS_MAX * abi.BLOCK_ENTRY.size, "kvfs-block-entries")
        try:
            yield arr
        finally:
            with self._owned_lock:
                if arr.mm is not None:
                    self._free_arrays.append(arr)

    def lookup(self, pairs):
        """LOOKUP (minor 3): which blocks of a sequence are stored whole under
        their tags, reading no payload. pairs: block ids, or (block, tag)
        with tag 16 bytes (None or zeros: any tag), in sequence order.
        Returns a LookupResult; its run is the leading pairs present. Up to
        509 pairs go in one inline call, more through a registered array with
        the run carried across calls. The answer is a snapshot: a block may
        be evicted before the load that follows."""
        if not self._info.caps & abi.CAP_PREFIX:
            raise KvfsError("lookup", _errno.ENOTTY, ": the daemon has no LOOKUP (minor 3)")
        ps = []
        for p in pairs:
            block, tag = p if isinstance(p, (tuple, list)) else (p, None)
            tag = bytes(tag) if tag is not None else bytes(abi.TAG_SIZE)
            if len(tag) != abi.TAG_SIZE:
                raise ValueError("a tag is %d bytes, not %d" % (abi.TAG_SIZE, len(tag)))
            ps.append((block, tag))
        statuses = []
        psz, so = abi.LOOKUP_PAIR.size, abi.LOOKUP_PAIR_STATUS_OFF
        pack = abi.LOOKUP_PAIR.pack
        packed = b"".join(pack(blk, tag, 0) for blk, tag in ps)
        if len(ps) <= abi.LOOKUP_INLINE_MAX:
            if ps:
                b = bytearray(abi.LOOKUP_INLINE_SIZE)
                abi.LOOKUP.pack_into(b, 0, abi.ABI_VERSION, 0, len(ps), 0, 0, 0, 0, 0, 0, 0, 0, 0)
                b[abi.LOOKUP.size:abi.LOOKUP.size + len(packed)] = packed
                self.ioctl(abi.IOC_LOOKUP_INLINE, b, "lookup")
                o = abi.LOOKUP.size + so
                statuses = list(b[o:o + (len(ps) - 1) * psz + 1:psz])
        else:
            with self._entry_array() as arr:
                per = min(abi.LOOKUP_MAX, arr.size // psz)
                for lo in range(0, len(ps), per):
                    n = min(per, len(ps) - lo)
                    arr.mm[:n * psz] = packed[lo * psz:(lo + n) * psz]
                    h = bytearray(abi.LOOKUP.pack(abi.ABI_VERSION, 0, n, arr.id, 0, 0, 0, 0, 0, 0, 0, 0))
                    self.ioctl(abi.IOC_LOOKUP, h, "lookup")
                    statuses.extend(arr.mm[so:so + (n - 1) * psz + 1:psz])
        run = 0
        while run < len(statuses) and statuses[run] == abi.LOOKUP_PRESENT:
            run += 1
        return LookupResult(statuses, statuses.count(abi.LOOKUP_PRESENT), statuses.count(abi.LOOKUP_ABSENT),
                            statuses.count(abi.LOOKUP_TAG_MISMATCH), run)

    @staticmethod
    def _block_results(b, base, n, details, esz=abi.BLOCK_ENTRY.size):
        if not details:
            so = base + abi.BLOCK_STATUS_OFF
            return list(b[so:so + (n - 1) * esz + 1:esz]) if n else []
        res = []
        for i in range(n):
            o = base + i * esz
            st = b[o + abi.BLOCK_STATUS_OFF]
            if details:
                res.append((st, b[o + abi.BLOCK_DETAIL_OFF],
                            struct.unpack_from("<I", b, o + abi.BLOCK_GROUPS_OK_OFF)[0]))
            else:
                res.append(st)
        return res

    # -- names --------------------------------------------------------------

    def group_path(self, mountpoint, block, layer, head, kind):
        """The file of a group under the mount: layer-<L>/block-<id>/head-<H>/K|V."""
        i = self._info
        lw, hw = len(str(i.layers - 1)), len(str(i.kv_heads - 1))
        return os.path.join(mountpoint, "layer-%0*d" % (lw, layer), "block-%016x" % block,
                            "head-%0*d" % (hw, head), "KV"[_kind(kind)])

    def close(self):
        """Close the host buffers this client created or opened, then the
        control file (the daemon drops every registration of it)."""
        with self._owned_lock:
            targets, self._targets = list(self._targets), set()
        for t in targets:
            try:
                self.unregister_target(t)
            except KvfsError:
                pass
        with self._owned_lock:
            bufs, self._owned = list(self._owned), set()
        for b in bufs:
            try:
                b.close()
            except BufferError:
                pass  # views still exported: the mapping goes with them
        with self._owned_lock:
            if self._fd >= 0:
                fd, self._fd = self._fd, -1
                os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
