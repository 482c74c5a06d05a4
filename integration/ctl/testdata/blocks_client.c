/* A C client of the minor-2 ABI, using only include/kvfs.h: INFO, a memfd
 * registered with REGISTER_FD, an HND target of NB cache blocks,
 * LOAD_BLOCKS_INLINE of the blocks named on the command line into cache
 * blocks 0, 1, ..., then LOAD_BLOCKS of the same through an entry array in a
 * second memfd into cache blocks NB-1, NB-2, .... It writes the whole cache
 * memory to stdout and "status n_ok groups" lines to stderr.
 *
 * usage: blocks_client MOUNTPOINT BLOCK_HEX...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvfs.h"

#define NB 4

static int fail(const char *what)
{
	fprintf(stderr, "%s: %s\n", what, strerror(errno));
	return 1;
}

static int memfd(size_t n, void **mem, __u32 ctl, __u32 *id)
{
	int fd = memfd_create("kvfs-c-client", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)n) != 0)
		return -1;
	*mem = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (*mem == MAP_FAILED)
		return -1;
	struct kvfs_register_fd r = { .abi = KVFS_ABI_VERSION, .length = n, .fd = fd };
	if (ioctl((int)ctl, KVFS_IOC_REGISTER_FD, &r) != 0)
		return -1;
	close(fd);
	*id = r.buffer;
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3 || argc - 2 > NB) {
		fprintf(stderr, "usage: %s MOUNTPOINT BLOCK_HEX... (at most %d)\n", argv[0], NB);
		return 2;
	}
	char path[4096];
	snprintf(path, sizeof path, "%s/.kvfs/ctl", argv[1]);
	int ctl = open(path, O_RDWR | O_CLOEXEC);
	if (ctl < 0)
		return fail("open");
	struct kvfs_info info;
	if (ioctl(ctl, KVFS_IOC_INFO, &info) != 0)
		return fail("info");
	if (info.abi != KVFS_ABI_VERSION || !(info.caps & KVFS_CAP_BLOCKS) || info.abi_minor < 2) {
		fprintf(stderr, "daemon without KV-cache targets\n");
		return 1;
	}
	size_t tile = (size_t)info.block_tokens * info.row_bytes;
	size_t tensor = (size_t)NB * info.kv_heads * tile; /* [NB, heads, tokens, head_dim] */
	size_t n = 2 * (size_t)info.layers * tensor;
	void *cache;
	__u32 buf;
	if (memfd(n, &cache, (__u32)ctl, &buf) != 0)
		return fail("cache memory");

	static struct kvfs_target t; /* 16320 bytes */
	t.abi = KVFS_ABI_VERSION;
	t.num_blocks = NB;
	t.block_stride = info.kv_heads * tile;
	t.head_stride = tile;
	t.row_pitch = info.row_bytes;
	t.row_bytes = info.row_bytes;
	t.layer_count = (__u16)info.layers;
	t.head_count = (__u16)info.kv_heads;
	for (__u32 i = 0; i < 2 * info.layers; i++) {
		t.regions[i].buffer = buf;
		t.regions[i].offset = i * tensor;
	}
	if (ioctl(ctl, KVFS_IOC_REGISTER_TARGET, &t) != 0)
		return fail("register target");

	int nblocks = argc - 2;
	static struct kvfs_blocks_inline in;
	in.hdr.abi = KVFS_ABI_VERSION;
	in.hdr.target = t.target;
	in.hdr.count = (__u32)nblocks;
	for (int i = 0; i < nblocks; i++) {
		struct kvfs_block_entry *e = &in.e[i];
		e->block = strtoull(argv[2 + i], NULL, 16);
		e->cache_block = (__u32)i;
		e->layer_count = (__u16)info.layers;
		e->head_count = (__u16)info.kv_heads;
		e->kinds = KVFS_KINDS_BOTH;
	}
	int ok = ioctl(ctl, KVFS_IOC_LOAD_BLOCKS_INLINE, &in);
	if (ok < 0)
		return fail("load blocks inline");
	for (int i = 0; i < nblocks; i++)
		fprintf(stderr, "inline %u %u\n", in.e[i].status, in.e[i].groups_ok);
	fprintf(stderr, "inline n_ok %d %u groups %llu\n", ok, in.hdr.n_ok, (unsigned long long)in.hdr.groups);

	/* The same blocks through an entry array, into the last cache blocks. */
	void *arr;
	__u32 arrbuf;
	if (memfd(4096, &arr, (__u32)ctl, &arrbuf) != 0)
		return fail("entry array");
	struct kvfs_block_entry *es = (struct kvfs_block_entry *)((char *)arr + 64);
	for (int i = 0; i < nblocks; i++) {
		es[i] = in.e[i];
		es[i].status = es[i].detail = 0;
		es[i].groups_ok = 0;
		es[i].cache_block = (__u32)(NB - 1 - i);
	}
	struct kvfs_blocks h = { .abi = KVFS_ABI_VERSION, .target = t.target, .count = (__u32)nblocks,
				 .buffer = arrbuf, .offset = 64 };
	/* With more than NB/2 blocks the two loads share cache blocks; the test
	 * passes two. */
	ok = ioctl(ctl, KVFS_IOC_LOAD_BLOCKS, &h);
	if (ok < 0)
		return fail("load blocks");
	for (int i = 0; i < nblocks; i++)
		fprintf(stderr, "array %u %u\n", es[i].status, es[i].groups_ok);
	fprintf(stderr, "array n_ok %d %u groups %llu\n", ok, h.n_ok, (unsigned long long)h.groups);

	if (fwrite(cache, 1, n, stdout) != n)
		return fail("write");
	struct kvfs_unregister_target u = { .abi = KVFS_ABI_VERSION, .target = t.target };
	if (ioctl(ctl, KVFS_IOC_UNREGISTER_TARGET, &u) != 0)
		return fail("unregister target");
	close(ctl);
	return 0;
}
