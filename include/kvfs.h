/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvfs.h — the control ABI of kvfs, version 1 (minor 3).
 *
 * A kvfs daemon mounts a KV-cache store (default /mnt/kvcache). The file
 * <mountpoint>/.kvfs/ctl answers the ioctls below. FUSE forwards only
 * "restricted" ioctls: the kernel copies exactly _IOC_SIZE(cmd) bytes in
 * (for _IOW/_IOWR) and out (for _IOR/_IOWR) and follows no pointers, so every
 * request is one fixed-size struct and bulk data moves through memory the
 * caller registered beforehand (REGISTER_HOST).
 *
 * All integers are little-endian. Every struct has explicit padding, no
 * implicit holes, and a size that is a multiple of 8. Reserved fields must be
 * zero on input. See docs/abi.md for the rules and the error codes.
 *
 * Typical use:
 *
 *     int fd = open("/mnt/kvcache/.kvfs/ctl", O_RDWR | O_CLOEXEC);
 *     struct kvfs_info info;
 *     ioctl(fd, KVFS_IOC_INFO, &info);            // check info.abi
 *     // memfd_create + ftruncate + fallocate, mmap it MAP_SHARED, then:
 *     struct kvfs_register_fd r = { .abi = KVFS_ABI_VERSION, .length = len, .fd = mfd };
 *     ioctl(fd, KVFS_IOC_REGISTER_FD, &r);        // r.buffer is the id; close(mfd) is fine now
 *     static struct kvfs_batch b;                 // 16368 bytes
 *     b.hdr.abi = KVFS_ABI_VERSION; b.hdr.count = n; // fill b.e[0..n-1]
 *     int ok = ioctl(fd, KVFS_IOC_LOAD, &b);      // entries with status OK
 */
#ifndef KVFS_H
#define KVFS_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define KVFS_ABI_VERSION 1u
#define KVFS_ABI_MINOR   3u /* kvfs_info.abi_minor: 1 adds REGISTER_FD, pinning limits, BAD_OVERLAP;
                             * 2 adds KV-cache targets and LOAD_BLOCKS/STORE_BLOCKS;
                             * 3 adds block tags and parents, TAG_MISMATCH and LOOKUP */

/* ioctl type byte. Unused by the VFS (do_vfs_ioctl) and by FUSE itself. */
#define KVFS_IOC_MAGIC 0xB7

/* Capabilities (kvfs_info.caps). */
#define KVFS_CAP_HOST          (1ull << 0) /* REGISTER_HOST */
#define KVFS_CAP_STORE         (1ull << 1) /* STORE (clear: read-only store) */
#define KVFS_CAP_PITCH         (1ull << 2) /* entries with a row pitch */
#define KVFS_CAP_FIXED_BUFFERS (1ull << 3) /* engine registers host buffers (zero copy) */
#define KVFS_CAP_CUDA          (1ull << 4) /* REGISTER_CUDA works: the daemon has a CUDA driver and device */
#define KVFS_CAP_REGISTER_FD   (1ull << 5) /* REGISTER_FD */
#define KVFS_CAP_LIMITS        (1ull << 6) /* kvfs_info.abi_minor and max_pinned_* are filled in */
#define KVFS_CAP_BLOCKS        (1ull << 7) /* REGISTER_TARGET, LOAD_BLOCKS, STORE_BLOCKS (minor 2) */
#define KVFS_CAP_PREFIX        (1ull << 8) /* tagged block entries, KVFS_TAG_MISMATCH, LOOKUP (minor 3) */

/* dtype values (kvfs_info.dtype), as stored on disk. */
#define KVFS_DTYPE_BF16 1u
#define KVFS_DTYPE_FP16 2u
#define KVFS_DTYPE_FP32 3u
#define KVFS_DTYPE_FP8  4u

/* kind values (kvfs_entry.kind). */
#define KVFS_KIND_K 0u
#define KVFS_KIND_V 1u

/* Per-entry status (kvfs_entry.status, out). */
#define KVFS_OK          0u /* group moved, checksum verified */
#define KVFS_ABSENT      1u /* LOAD: the group is not in the store */
#define KVFS_CORRUPT     2u /* LOAD: checksum mismatch; destination zeroed */
#define KVFS_BAD_REQUEST 3u /* the entry is invalid (see detail); nothing touched */
#define KVFS_IO_ERROR    4u /* the device failed */
#define KVFS_NO_SPACE    5u /* STORE: no slot could be freed for the block */

/* Why an entry is KVFS_BAD_REQUEST (kvfs_entry.detail, out). */
#define KVFS_BAD_NONE     0u
#define KVFS_BAD_KEY      1u /* layer, head or kind outside the geometry */
#define KVFS_BAD_BUFFER   2u /* buffer id not registered on this open file */
#define KVFS_BAD_RANGE    3u /* the tile would reach outside the registered buffer */
#define KVFS_BAD_PITCH    4u /* 0 < pitch < row_bytes (rows would overlap) */
#define KVFS_BAD_RESERVED 5u /* a reserved field is not zero */
#define KVFS_BAD_OVERLAP  6u /* LOAD: the destination overlaps another entry's in the batch */
#define KVFS_BAD_PARENT   7u /* minor 3: parent is the block itself, or set without KVFS_META_PARENT */
#define KVFS_BAD_META     8u /* minor 3: STORE entries give one block different tags or parents */
#define KVFS_TAG_MISMATCH 9u /* minor 3, with status KVFS_ABSENT: the block is stored under another tag */

/* INFO: what the daemon serves. 192 bytes, out only. */
struct kvfs_info {
	__u32 abi;                   /*   0 KVFS_ABI_VERSION of the daemon */
	__u32 size;                  /*   4 sizeof(struct kvfs_info) */
	__u64 caps;                  /*   8 KVFS_CAP_* */
	__u32 layers;                /*  16 */
	__u32 kv_heads;              /*  20 */
	__u32 head_dim;              /*  24 */
	__u32 block_tokens;          /*  28 rows of a tile */
	__u32 dtype;                 /*  32 KVFS_DTYPE_* */
	__u32 dtype_bytes;           /*  36 */
	__u32 align;                 /*  40 store alignment */
	__u32 group_bytes;           /*  44 bytes of one tile: block_tokens * row_bytes */
	__u64 group_stride;          /*  48 distance of groups inside a slot */
	__u32 groups_per_block;      /*  56 layers * kv_heads * 2 */
	__u32 row_bytes;             /*  60 head_dim * dtype_bytes */
	__u32 max_entries;           /*  64 entries of struct kvfs_batch */
	__u32 max_entries_small;     /*  68 entries of struct kvfs_batch_small */
	__u32 max_buffers;           /*  72 registrations per open file */
	__u32 reserved0;             /*  76 */
	__u64 max_registered_bytes;  /*  80 bytes registered per open file */
	__u64 slots;                 /*  88 */
	__u64 used_slots;            /*  96 */
	__u8  uuid[16];              /* 104 store UUID */
	char  engine[16];            /* 120 I/O engine name, NUL padded */
	__u64 max_pinned_bytes;      /* 136 daemon-wide cap on pinned registrations (0: engine pins nothing) */
	__u64 max_pinned_per_uid;    /* 144 share of one uid */
	__u64 pinned_bytes;          /* 152 pinned now, all callers */
	__u32 abi_minor;             /* 160 KVFS_ABI_MINOR of the daemon (0: older daemon) */
	__u32 max_block_entries;     /* 164 entries per LOAD_BLOCKS/STORE_BLOCKS (minor 2; 0 before) */
	__u64 reserved[3];           /* 168 */
};                               /* 192 */

/* REGISTER_HOST: map a file of /dev/shm into the daemon. 4096 bytes. */
struct kvfs_register_host {
	__u32 abi;                   /*   0 in: KVFS_ABI_VERSION */
	__u32 flags;                 /*   4 in: 0 */
	__u64 length;                /*   8 in: bytes from offset 0, 0 = whole file; out: bytes registered */
	__u32 buffer;                /*  16 out: buffer id (never 0) */
	__u32 reserved0;             /*  20 */
	__u64 reserved1;             /*  24 */
	char  path[4064];            /*  32 in: absolute path, NUL terminated */
};                               /* 4096 */

/* REGISTER_FD: register a descriptor the caller holds, open O_RDWR, of a
 * regular file on tmpfs or hugetlbfs (a memfd, a /dev/shm file). The daemon
 * takes the descriptor with pidfd_getfd, so the kernel's decision when the
 * caller opened the file is the access check. 64 bytes, in/out. */
struct kvfs_register_fd {
	__u32 abi;                   /*   0 in: KVFS_ABI_VERSION */
	__u32 flags;                 /*   4 in: 0 */
	__u64 length;                /*   8 in: bytes from offset 0, 0 = whole file; out: bytes registered */
	__u32 buffer;                /*  16 out: buffer id (never 0); 0 on input */
	__s32 fd;                    /*  20 in: the caller's descriptor */
	__u32 pinned;                /*  24 out: 1 when pinned for fixed-buffer I/O; 0 on input */
	__u32 reserved0;             /*  28 */
	__u64 reserved[4];           /*  32 */
};                               /*  64 */

/* REGISTER_CUDA: register bytes [offset, offset+length) of a CUDA
 * allocation of the caller, named by the raw CUipcMemHandle of the
 * allocation's base (cuIpcGetMemHandle; cuMemGetAddressRange gives the base
 * of a pointer). The daemon opens it with cuIpcOpenMemHandle on device
 * ordinal `device` and closes it at UNREGISTER or when this file closes.
 * INFO reports KVFS_CAP_CUDA only where the daemon's driver works.
 * Errors: ENODEV no usable GPU or ordinal; EACCES the caller may not open
 * /dev/nvidiactl or /dev/nvidia-uvm itself; EINVAL the driver refused the
 * handle; ERANGE offset+length beyond the allocation; EACCES also when the
 * handle records another exporting process than the caller. The handle is
 * still a bearer capability (the recorded pid can be forged: docs/abi.md,
 * "What is trusted"). 128 bytes. */
struct kvfs_register_cuda {
	__u32 abi;                   /*   0 in: KVFS_ABI_VERSION */
	__u32 flags;                 /*   4 in: 0 */
	__u8  handle[64];            /*   8 in: CUipcMemHandle of the allocation's base */
	__u64 offset;                /*  72 in: first byte, from the allocation's base */
	__u64 length;                /*  80 in: bytes (> 0); out: bytes registered */
	__u32 device;                /*  88 in: device ordinal */
	__u32 buffer;                /*  92 out: buffer id (never 0); 0 on input */
	__u64 reserved[4];           /*  96 */
};                               /* 128 */

/* UNREGISTER: drop a registration of this open file. 8 bytes, in only. */
struct kvfs_unregister {
	__u32 abi;                   /*   0 KVFS_ABI_VERSION */
	__u32 buffer;                /*   4 buffer id */
};                               /*   8 */

/* LOAD / STORE batch header. */
struct kvfs_batch_hdr {
	__u32 abi;                   /*   0 in: KVFS_ABI_VERSION */
	__u32 count;                 /*   4 in: entries used, 0..max */
	__u32 flags;                 /*   8 in: 0 */
	__u32 n_ok;                  /*  12 out: entries with status KVFS_OK */
};                               /*  16 */

/* One group to move between the store and a registered buffer. */
struct kvfs_entry {
	__u64 block;                 /*   0 block id */
	__u64 offset;                /*   8 byte offset of the tile's first row in the buffer */
	__u32 buffer;                /*  16 buffer id */
	__u32 pitch;                 /*  20 0: rows packed (group_bytes contiguous);
	                              *     else bytes from one row to the next (>= row_bytes) */
	__u16 layer;                 /*  24 */
	__u16 head;                  /*  26 kv head */
	__u8  kind;                  /*  28 KVFS_KIND_K or KVFS_KIND_V */
	__u8  status;                /*  29 out: KVFS_OK ... (ignored on input) */
	__u8  detail;                /*  30 out: KVFS_BAD_* (ignored on input) */
	__u8  reserved;              /*  31 in: 0 */
};                               /*  32 */

#define KVFS_BATCH_MAX       511 /* 16 + 511 * 32 = 16368 <= 16383 (_IOC_SIZE limit) */
#define KVFS_BATCH_SMALL_MAX 63  /* 16 +  63 * 32 =  2032 */

struct kvfs_batch {
	struct kvfs_batch_hdr hdr;
	struct kvfs_entry     e[KVFS_BATCH_MAX];
};

struct kvfs_batch_small {
	struct kvfs_batch_hdr hdr;
	struct kvfs_entry     e[KVFS_BATCH_SMALL_MAX];
};

#define KVFS_IOC_INFO          _IOR(KVFS_IOC_MAGIC,  0x01, struct kvfs_info)          /* 0x80c0b701 */
#define KVFS_IOC_REGISTER_HOST _IOWR(KVFS_IOC_MAGIC, 0x02, struct kvfs_register_host) /* 0xd000b702 */
#define KVFS_IOC_UNREGISTER    _IOW(KVFS_IOC_MAGIC,  0x03, struct kvfs_unregister)    /* 0x4008b703 */
#define KVFS_IOC_REGISTER_CUDA _IOWR(KVFS_IOC_MAGIC, 0x04, struct kvfs_register_cuda) /* 0xc080b704 */
#define KVFS_IOC_REGISTER_FD   _IOWR(KVFS_IOC_MAGIC, 0x05, struct kvfs_register_fd)   /* 0xc040b705 */
#define KVFS_IOC_LOAD          _IOWR(KVFS_IOC_MAGIC, 0x10, struct kvfs_batch)         /* 0xfff0b710 */
#define KVFS_IOC_STORE         _IOWR(KVFS_IOC_MAGIC, 0x11, struct kvfs_batch)         /* 0xfff0b711 */
#define KVFS_IOC_LOAD_SMALL    _IOWR(KVFS_IOC_MAGIC, 0x12, struct kvfs_batch_small)   /* 0xc7f0b712 */
#define KVFS_IOC_STORE_SMALL   _IOWR(KVFS_IOC_MAGIC, 0x13, struct kvfs_batch_small)   /* 0xc7f0b713 */

/*
 * Minor 2: KV-cache targets and block-granular LOAD/STORE (KVFS_CAP_BLOCKS).
 *
 * A target describes, once, where the blocks of a paged KV cache live: for
 * each (layer, kind) of layers [layer_first, layer_first + layer_count) a
 * registered buffer and the offset of cache block 0, head head_first, row 0
 * (regions[2 * (layer - layer_first) + kind]); and the strides of the
 * layout. The tile of cache block c, head h starts at
 *     offset + c * block_stride + (h - head_first) * head_stride
 * and its token row r at + r * row_pitch, row_bytes long. For a layer's K
 * (or V) tensor of dtype size s:
 *   vLLM / FlashAttention NHD [num_blocks, block_size, kv_heads, head_dim]:
 *     block_stride = block_size*kv_heads*head_dim*s, head_stride = head_dim*s,
 *     row_pitch = kv_heads*head_dim*s
 *   FlashInfer HND [num_blocks, kv_heads, block_size, head_dim]:
 *     block_stride = kv_heads*block_size*head_dim*s,
 *     head_stride = block_size*head_dim*s, row_pitch = head_dim*s
 *   Hugging Face [batch, kv_heads, seq, head_dim], one sequence (offset =
 *   its batch row), cache block = token block of the sequence:
 *     block_stride = block_size*head_dim*s, head_stride = seq*head_dim*s,
 *     row_pitch = head_dim*s
 * The daemon validates the whole target at REGISTER_TARGET (every region
 * inside its buffer, no two tiles or rows sharing a byte) and then checks
 * each block entry in O(1).
 */
#define KVFS_TARGET_MAX_REGIONS 1016
#define KVFS_TARGET_MAX_LAYERS  508
#define KVFS_BLOCKS_MAX         65536 /* block entries in a registered buffer */
#define KVFS_BLOCKS_INLINE_MAX  509   /* 64 + 509 * 32 = 16352 */

/* kinds of a block entry (bit mask). */
#define KVFS_KINDS_K    1u
#define KVFS_KINDS_V    2u
#define KVFS_KINDS_BOTH 3u

struct kvfs_target_region {
	__u64 offset;                /*   0 of cache block 0, head head_first, row 0 */
	__u32 buffer;                /*   8 registered buffer id */
	__u32 reserved;              /*  12 0 */
};                               /*  16 */

/* REGISTER_TARGET. 16320 bytes, in/out. */
struct kvfs_target {
	__u32 abi;                   /*   0 in: KVFS_ABI_VERSION */
	__u32 flags;                 /*   4 in: 0 */
	__u32 target;                /*   8 out: target id (never 0); 0 on input */
	__u32 num_blocks;            /*  12 cache blocks in the layout */
	__u64 block_stride;          /*  16 bytes from cache block c to c + 1 */
	__u64 head_stride;           /*  24 bytes from head h to h + 1 */
	__u32 row_pitch;             /*  32 bytes from token row r to r + 1 */
	__u32 row_bytes;             /*  36 kvfs_info.row_bytes (head_dim * dtype) */
	__u16 layer_first;           /*  40 */
	__u16 layer_count;           /*  42 1..KVFS_TARGET_MAX_LAYERS */
	__u16 head_first;            /*  44 kv heads held: [head_first, head_first + head_count) */
	__u16 head_count;            /*  46 */
	__u64 reserved[2];           /*  48 0 */
	struct kvfs_target_region regions[KVFS_TARGET_MAX_REGIONS]; /* 64; unused ones 0 */
};                               /* 16320 */

/* UNREGISTER_TARGET. 8 bytes, in. */
struct kvfs_unregister_target {
	__u32 abi;                   /*   0 KVFS_ABI_VERSION */
	__u32 target;                /*   4 target id */
};                               /*   8 */

/* One block: block id's groups of the layer, head and kind ranges, to or
 * from cache block cache_block of the target. 32 bytes. */
struct kvfs_block_entry {
	__u64 block;                 /*   0 block id in the store */
	__u32 cache_block;           /*   8 cache block index, < num_blocks */
	__u16 layer_first;           /*  12 */
	__u16 layer_count;           /*  14 >= 1, inside the target's layers */
	__u16 head_first;            /*  16 */
	__u16 head_count;            /*  18 >= 1, inside the target's heads */
	__u8  kinds;                 /*  20 KVFS_KINDS_* */
	__u8  status;                /*  21 out: KVFS_OK when every group is OK, else the worst group's */
	__u8  detail;                /*  22 out: KVFS_BAD_* */
	__u8  reserved;              /*  23 0 */
	__u32 groups_ok;             /*  24 out: groups of the entry with status OK */
	__u32 reserved1;             /*  28 0 */
};                               /*  32 */

/* LOAD_BLOCKS / STORE_BLOCKS: count entries at offset of registered buffer
 * buffer (statuses are written back there). The _INLINE forms carry the
 * entries after the header (buffer = offset = 0). */
struct kvfs_blocks {
	__u32 abi;                   /*   0 in: KVFS_ABI_VERSION */
	__u32 flags;                 /*   4 in: 0 */
	__u32 target;                /*   8 in: target id */
	__u32 count;                 /*  12 in: entries, <= KVFS_BLOCKS_MAX (inline: KVFS_BLOCKS_INLINE_MAX) */
	__u32 buffer;                /*  16 in: buffer holding the entries (0 inline) */
	__u32 n_ok;                  /*  20 out: entries with status KVFS_OK */
	__u64 offset;                /*  24 in: of the entry array, a multiple of 8 (0 inline) */
	__u64 groups;                /*  32 out: groups moved with status KVFS_OK */
	__u64 reserved[3];           /*  40 0 */
};                               /*  64 */

struct kvfs_blocks_inline {
	struct kvfs_blocks      hdr;
	struct kvfs_block_entry e[KVFS_BLOCKS_INLINE_MAX];
};                               /* 16352 */

#define KVFS_IOC_REGISTER_TARGET    _IOWR(KVFS_IOC_MAGIC, 0x20, struct kvfs_target)           /* 0xffc0b720 */
#define KVFS_IOC_UNREGISTER_TARGET  _IOW(KVFS_IOC_MAGIC,  0x21, struct kvfs_unregister_target) /* 0x4008b721 */
#define KVFS_IOC_LOAD_BLOCKS        _IOWR(KVFS_IOC_MAGIC, 0x22, struct kvfs_blocks)           /* 0xc040b722 */
#define KVFS_IOC_STORE_BLOCKS       _IOWR(KVFS_IOC_MAGIC, 0x23, struct kvfs_blocks)           /* 0xc040b723 */
#define KVFS_IOC_LOAD_BLOCKS_INLINE  _IOWR(KVFS_IOC_MAGIC, 0x24, struct kvfs_blocks_inline)   /* 0xffe0b724 */
#define KVFS_IOC_STORE_BLOCKS_INLINE _IOWR(KVFS_IOC_MAGIC, 0x25, struct kvfs_blocks_inline)   /* 0xffe0b725 */

/*
 * Minor 3: prefix identity (KVFS_CAP_PREFIX).
 *
 * With KVFS_BLOCKS_TAGGED in kvfs_blocks.flags, LOAD_BLOCKS/STORE_BLOCKS
 * entries are struct kvfs_block_entry_tagged (64 bytes): the minor-2 entry
 * followed by a 16-byte tag and a parent. STORE records the tag and parent
 * in the block (a zero tag is no tag; a STORE of another tag replaces the
 * block); LOAD expects the tag (zeros: unchecked): a block stored under
 * another tag is KVFS_ABSENT with detail KVFS_TAG_MISMATCH and none of its
 * bytes reach the cache. 32-byte entries (no flag) behave as in minor 2 and
 * leave a stored block's tag and parent as they are.
 *
 * LOOKUP answers up to 65,536 (block id, tag) pairs — present, absent or
 * tag mismatch — and the length of the leading present run (also its return
 * value). It reads no payload and pins nothing.
 */
#define KVFS_BLOCKS_TAGGED             (1u << 0) /* kvfs_blocks.flags: 64-byte entries */
#define KVFS_META_PARENT               (1u << 0) /* kvfs_block_entry_tagged.meta_flags: parent is set */
#define KVFS_TAG_SIZE                  16
#define KVFS_BLOCKS_INLINE_TAGGED_MAX  254   /* 64 + 254 * 64 = 16320 of the 16352-byte inline argument */
#define KVFS_LOOKUP_MAX                65536 /* pairs in a registered buffer */
#define KVFS_LOOKUP_INLINE_MAX         509   /* 64 + 509 * 32 = 16352 */

/* LOOKUP pair statuses (kvfs_lookup_pair.status, out; 0 is never written). */
#define KVFS_LOOKUP_PRESENT      1u /* stored whole, under the pair's tag (or the tag is zero) */
#define KVFS_LOOKUP_ABSENT       2u /* not stored, or not every group of it */
#define KVFS_LOOKUP_TAG_MISMATCH 3u /* stored under another tag */

struct kvfs_block_entry_tagged {
	struct kvfs_block_entry entry; /*   0 as in minor 2 */
	__u8  tag[KVFS_TAG_SIZE];    /*  32 STORE: recorded; LOAD: expected (zeros: unchecked) */
	__u64 parent;                /*  48 STORE: the block before this one in its sequence */
	__u32 meta_flags;            /*  56 KVFS_META_PARENT when parent is set (never the block itself) */
	__u32 reserved2;             /*  60 0 */
};                               /*  64 */

struct kvfs_blocks_inline_tagged {
	struct kvfs_blocks             hdr; /* flags = KVFS_BLOCKS_TAGGED */
	struct kvfs_block_entry_tagged e[KVFS_BLOCKS_INLINE_TAGGED_MAX];
	__u8                           pad[32]; /* the inline argument stays 16352 bytes */
};                               /* 16352 */

struct kvfs_lookup_pair {
	__u64 block;                 /*   0 block id */
	__u8  tag[KVFS_TAG_SIZE];    /*   8 expected tag (zeros: unchecked) */
	__u8  status;                /*  24 out: KVFS_LOOKUP_* (ignored on input) */
	__u8  reserved[7];           /*  25 0 */
};                               /*  32 */

/* LOOKUP: count pairs at offset of registered buffer buffer (statuses are
 * written back there). LOOKUP_INLINE carries them after the header. */
struct kvfs_lookup {
	__u32 abi;                   /*   0 in: KVFS_ABI_VERSION */
	__u32 flags;                 /*   4 in: 0 */
	__u32 count;                 /*   8 in: 1..KVFS_LOOKUP_MAX (inline: KVFS_LOOKUP_INLINE_MAX) */
	__u32 buffer;                /*  12 in: buffer holding the pairs (0 inline) */
	__u64 offset;                /*  16 in: of the pair array, a multiple of 8 (0 inline) */
	__u32 present;               /*  24 out: pairs KVFS_LOOKUP_PRESENT; 0 on input */
	__u32 absent;                /*  28 out: pairs KVFS_LOOKUP_ABSENT; 0 on input */
	__u32 mismatch;              /*  32 out: pairs KVFS_LOOKUP_TAG_MISMATCH; 0 on input */
	__u32 run;                   /*  36 out: leading pairs present (the return value); 0 on input */
	__u64 reserved[3];           /*  40 0 */
};                               /*  64 */

struct kvfs_lookup_inline {
	struct kvfs_lookup      hdr;
	struct kvfs_lookup_pair p[KVFS_LOOKUP_INLINE_MAX];
};                               /* 16352 */

#define KVFS_IOC_LOOKUP        _IOWR(KVFS_IOC_MAGIC, 0x26, struct kvfs_lookup)        /* 0xc040b726 */
#define KVFS_IOC_LOOKUP_INLINE _IOWR(KVFS_IOC_MAGIC, 0x27, struct kvfs_lookup_inline) /* 0xffe0b727 */

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(struct kvfs_info) == 192, "kvfs_info");
_Static_assert(sizeof(struct kvfs_register_host) == 4096, "kvfs_register_host");
_Static_assert(sizeof(struct kvfs_unregister) == 8, "kvfs_unregister");
_Static_assert(sizeof(struct kvfs_register_fd) == 64, "kvfs_register_fd");
_Static_assert(sizeof(struct kvfs_register_cuda) == 128, "kvfs_register_cuda");
_Static_assert(sizeof(struct kvfs_batch_hdr) == 16, "kvfs_batch_hdr");
_Static_assert(sizeof(struct kvfs_entry) == 32, "kvfs_entry");
_Static_assert(sizeof(struct kvfs_batch) == 16368, "kvfs_batch");
_Static_assert(sizeof(struct kvfs_batch_small) == 2032, "kvfs_batch_small");
_Static_assert(sizeof(struct kvfs_target) == 16320, "kvfs_target");
_Static_assert(sizeof(struct kvfs_block_entry) == 32, "kvfs_block_entry");
_Static_assert(sizeof(struct kvfs_blocks) == 64, "kvfs_blocks");
_Static_assert(sizeof(struct kvfs_blocks_inline) == 16352, "kvfs_blocks_inline");
_Static_assert(sizeof(struct kvfs_block_entry_tagged) == 64, "kvfs_block_entry_tagged");
_Static_assert(sizeof(struct kvfs_blocks_inline_tagged) == 16352, "kvfs_blocks_inline_tagged");
_Static_assert(sizeof(struct kvfs_lookup_pair) == 32, "kvfs_lookup_pair");
_Static_assert(sizeof(struct kvfs_lookup) == 64, "kvfs_lookup");
_Static_assert(sizeof(struct kvfs_lookup_inline) == 16352, "kvfs_lookup_inline");
#endif

#endif /* KVFS_H */
