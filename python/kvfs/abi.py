"""The kvfs control ABI, version 1, minor 3 (docs/abi.md, include/kvfs.h).

Fixed-size little-endian structs and the ioctl numbers; pure stdlib.
"""

import struct

ABI_VERSION = 1
ABI_MINOR = 3
IOC_MAGIC = 0xB7

_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(direction, nr, size):
    return (direction << 30) | (size << 16) | (IOC_MAGIC << 8) | nr


def ioc_size(cmd):
    """The argument size an ioctl command encodes (_IOC_SIZE, the size _ioc put there)."""
    return (cmd >> 16) & 0x3FFF


# struct kvfs_info (192 bytes)
INFO = struct.Struct("<IIQ8IQ6IQQQ16s16sQQQII3Q")
INFO_FIELDS = (
    "abi", "size", "caps",
    "layers", "kv_heads", "head_dim", "block_tokens", "dtype", "dtype_bytes", "align", "group_bytes",
    "group_stride",
    "groups_per_block", "row_bytes", "max_entries", "max_entries_small", "max_buffers", "reserved0",
    "max_registered_bytes", "slots", "used_slots", "uuid", "engine",
    # minor 1 (zero from an older daemon; see CAP_LIMITS)
    "max_pinned_bytes", "max_pinned_per_uid", "pinned_bytes", "abi_minor",
    # minor 2 (zero from an older daemon; see CAP_BLOCKS)
    "max_block_entries",
)
# struct kvfs_register_host (4096 bytes)
REGISTER_HOST = struct.Struct("<IIQIIQ4064s")
PATH_MAX = 4064
# struct kvfs_register_fd (64 bytes): abi flags length buffer fd pinned reserved0 reserved[4]
REGISTER_FD = struct.Struct("<IIQIiII4Q")
# struct kvfs_unregister (8 bytes)
UNREGISTER = struct.Struct("<II")
# struct kvfs_batch_hdr (16 bytes) and struct kvfs_entry (32 bytes)
BATCH_HDR = struct.Struct("<IIII")
ENTRY = struct.Struct("<QQIIHHBBBB")
ENTRY_STATUS_OFF = 29
ENTRY_DETAIL_OFF = 30

BATCH_MAX = 511
BATCH_SMALL_MAX = 63
BATCH_SIZE = BATCH_HDR.size + BATCH_MAX * ENTRY.size  # 16368
BATCH_SMALL_SIZE = BATCH_HDR.size + BATCH_SMALL_MAX * ENTRY.size  # 2032

IOC_INFO = _ioc(_IOC_READ, 0x01, INFO.size)
IOC_REGISTER_HOST = _ioc(_IOC_READ | _IOC_WRITE, 0x02, REGISTER_HOST.size)
IOC_UNREGISTER = _ioc(_IOC_WRITE, 0x03, UNREGISTER.size)
IOC_REGISTER_FD = _ioc(_IOC_READ | _IOC_WRITE, 0x05, REGISTER_FD.size)
IOC_LOAD = _ioc(_IOC_READ | _IOC_WRITE, 0x10, BATCH_SIZE)
IOC_STORE = _ioc(_IOC_READ | _IOC_WRITE, 0x11, BATCH_SIZE)
IOC_LOAD_SMALL = _ioc(_IOC_READ | _IOC_WRITE, 0x12, BATCH_SMALL_SIZE)
IOC_STORE_SMALL = _ioc(_IOC_READ | _IOC_WRITE, 0x13, BATCH_SMALL_SIZE)

CAP_HOST = 1 << 0
CAP_STORE = 1 << 1
CAP_PITCH = 1 << 2
CAP_FIXED_BUFFERS = 1 << 3
CAP_CUDA = 1 << 4
CAP_REGISTER_FD = 1 << 5
CAP_LIMITS = 1 << 6
CAP_BLOCKS = 1 << 7
CAP_PREFIX = 1 << 8

DTYPES = {1: "bf16", 2: "fp16", 3: "fp32", 4: "fp8"}

# Entry statuses.
OK, ABSENT, CORRUPT, BAD_REQUEST, IO_ERROR, NO_SPACE = range(6)
STATUS_NAMES = {OK: "ok", ABSENT: "absent", CORRUPT: "corrupt", BAD_REQUEST: "bad-request",
                IO_ERROR: "io-error", NO_SPACE: "no-space"}
# Why an entry is BAD_REQUEST.
BAD_NONE, BAD_KEY, BAD_BUFFER, BAD_RANGE, BAD_PITCH, BAD_RESERVED, BAD_OVERLAP = range(7)
# Minor 3: BAD_PARENT and BAD_META come with BAD_REQUEST; TAG_MISMATCH with ABSENT.
BAD_PARENT, BAD_META, TAG_MISMATCH = 7, 8, 9
DETAIL_NAMES = {BAD_NONE: "", BAD_KEY: "layer, head or kind outside the geometry",
                BAD_BUFFER: "buffer not registered on this handle",
                BAD_RANGE: "tile outside the registered buffer",
                BAD_PITCH: "pitch smaller than a row", BAD_RESERVED: "reserved field not zero",
                BAD_OVERLAP: "destination overlaps another entry's in the same load",
                BAD_PARENT: "parent is the block itself or lacks its flag",
                BAD_META: "entries of one block disagree on tag or parent",
                TAG_MISMATCH: "block stored under another tag"}

assert INFO.size == 192 and REGISTER_HOST.size == 4096 and ENTRY.size == 32 and BATCH_SIZE == 16368
assert REGISTER_FD.size == 64 and IOC_REGISTER_FD == 0xc040b705

# Minor 2: KV-cache targets and block-granular LOAD/STORE (docs/abi.md "Targets").
# struct kvfs_target (16320 bytes): a 64-byte header, then 1016 regions of 16:
# abi flags target num_blocks block_stride head_stride row_pitch row_bytes
# layer_first layer_count head_first head_count reserved[2]
TARGET_HDR = struct.Struct("<IIIIQQIIHHHH2Q")
TARGET_REGION = struct.Struct("<QII")  # offset buffer reserved
TARGET_MAX_REGIONS = 1016
TARGET_MAX_LAYERS = TARGET_MAX_REGIONS // 2
TARGET_SIZE = TARGET_HDR.size + TARGET_MAX_REGIONS * TARGET_REGION.size  # 16320
TARGET_OUT_OFF = 8
# struct kvfs_unregister_target (8 bytes)
UNREGISTER_TARGET = struct.Struct("<II")
# struct kvfs_blocks (64 bytes): abi flags target count buffer n_ok offset groups reserved[3]
BLOCKS = struct.Struct("<IIIIIIQQ3Q")
# struct kvfs_block_entry (32 bytes): block cache_block layer_first layer_count
# head_first head_count kinds status detail reserved groups_ok reserved1
BLOCK_ENTRY = struct.Struct("<QIHHHHBBBBII")
BLOCK_STATUS_OFF, BLOCK_DETAIL_OFF, BLOCK_GROUPS_OK_OFF = 21, 22, 24
BLOCKS_MAX = 65536
BLOCKS_INLINE_MAX = (16383 - BLOCKS.size) // BLOCK_ENTRY.size  # 509
BLOCKS_INLINE_SIZE = BLOCKS.size + BLOCKS_INLINE_MAX * BLOCK_ENTRY.size  # 16352
KINDS_K, KINDS_V, KINDS_BOTH = 1, 2, 3

IOC_REGISTER_TARGET = _ioc(_IOC_READ | _IOC_WRITE, 0x20, TARGET_SIZE)
IOC_UNREGISTER_TARGET = _ioc(_IOC_WRITE, 0x21, UNREGISTER_TARGET.size)
IOC_LOAD_BLOCKS = _ioc(_IOC_READ | _IOC_WRITE, 0x22, BLOCKS.size)
IOC_STORE_BLOCKS = _ioc(_IOC_READ | _IOC_WRITE, 0x23, BLOCKS.size)
IOC_LOAD_BLOCKS_INLINE = _ioc(_IOC_READ | _IOC_WRITE, 0x24, BLOCKS_INLINE_SIZE)
IOC_STORE_BLOCKS_INLINE = _ioc(_IOC_READ | _IOC_WRITE, 0x25, BLOCKS_INLINE_SIZE)

assert TARGET_HDR.size == 64 and TARGET_SIZE == 16320 and BLOCKS.size == 64 and BLOCK_ENTRY.size == 32
assert IOC_REGISTER_TARGET == 0xffc0b720 and IOC_LOAD_BLOCKS == 0xc040b722 and IOC_LOAD_BLOCKS_INLINE == 0xffe0b724

# Minor 3: prefix identity (docs/abi.md "Minor 3"). With BLOCKS_TAGGED in
# kvfs_blocks.flags the entries are struct kvfs_block_entry_tagged (64 bytes):
# the minor-2 entry, tag[16], parent, meta_flags, reserved2.
BLOCKS_TAGGED = 1 << 0
META_PARENT = 1 << 0
TAG_SIZE = 16
BLOCK_ENTRY_TAGGED = struct.Struct("<QIHHHHBBBBII16sQII")
BLOCKS_INLINE_TAGGED_MAX = 254  # 64 + 254 * 64 = 16320 of the 16352-byte inline argument
# struct kvfs_lookup (64 bytes): abi flags count buffer offset present absent mismatch run reserved[3]
LOOKUP = struct.Struct("<IIIIQIIII3Q")
# struct kvfs_lookup_pair (32 bytes): block tag[16] status reserved[7]
LOOKUP_PAIR = struct.Struct("<Q16sB7x")
LOOKUP_PAIR_STATUS_OFF = 24
LOOKUP_MAX = 65536
LOOKUP_INLINE_MAX = 509
LOOKUP_INLINE_SIZE = LOOKUP.size + LOOKUP_INLINE_MAX * LOOKUP_PAIR.size  # 16352
LOOKUP_PRESENT, LOOKUP_ABSENT, LOOKUP_TAG_MISMATCH = 1, 2, 3
LOOKUP_NAMES = {LOOKUP_PRESENT: "present", LOOKUP_ABSENT: "absent", LOOKUP_TAG_MISMATCH: "tag-mismatch"}

IOC_LOOKUP = _ioc(_IOC_READ | _IOC_WRITE, 0x26, LOOKUP.size)
IOC_LOOKUP_INLINE = _ioc(_IOC_READ | _IOC_WRITE, 0x27, LOOKUP_INLINE_SIZE)

assert BLOCK_ENTRY_TAGGED.size == 64 and LOOKUP.size == 64 and LOOKUP_PAIR.size == 32
assert BLOCKS.size + BLOCKS_INLINE_TAGGED_MAX * BLOCK_ENTRY_TAGGED.size + 32 == BLOCKS_INLINE_SIZE
assert LOOKUP_INLINE_SIZE == 16352 and IOC_LOOKUP == 0xc040b726 and IOC_LOOKUP_INLINE == 0xffe0b727

# REGISTER_CUDA (0x04; ctl/abi/cuda.go, include/kvfs.h): struct kvfs_register_cuda (128 bytes):
# abi flags handle[64] offset length device buffer reserved[4]
REGISTER_CUDA = struct.Struct("<II64sQQII4Q")
REGISTER_CUDA_BUFFER_OFF = 92
REGISTER_CUDA_LENGTH_OFF = 80
IPC_HANDLE_SIZE = 64
IOC_REGISTER_CUDA = _ioc(_IOC_READ | _IOC_WRITE, 0x04, REGISTER_CUDA.size)

assert REGISTER_CUDA.size == 128 and IOC_REGISTER_CUDA == 0xc080b704


def pack_register_cuda(handle, offset, length, device):
    """The 128 bytes of a REGISTER_CUDA request (a bytearray, in/out)."""
    handle = bytes(handle)
    if len(handle) != IPC_HANDLE_SIZE:
        raise ValueError("a CUipcMemHandle is %d bytes, not %d" % (IPC_HANDLE_SIZE, len(handle)))
    if length <= 0 or offset < 0 or offset + length >= 1 << 64:
        raise ValueError("register-cuda range: length %d at offset %d" % (length, offset))
    if not 0 <= device < 1 << 32:
        raise ValueError("device ordinal %d" % device)
    return bytearray(REGISTER_CUDA.pack(ABI_VERSION, 0, handle, offset, length, device, 0, 0, 0, 0, 0))
