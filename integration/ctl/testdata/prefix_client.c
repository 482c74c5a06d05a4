/* A C client of the minor-3 ABI, using only include/kvfs.h: an HND target
 * of NB cache blocks in a memfd; STORE_BLOCKS_INLINE of two tagged blocks
 * (0xe1 names 0xe0 as its parent) from cache blocks 0 and 1, filled with
 * 0x11 and 0x22; LOOKUP_INLINE and LOOKUP (pairs in a registered memfd) of
 * four pairs; LOAD_BLOCKS_INLINE of 0xe1 expecting another tag into cache
 * block 2 and of 0xe0 under its own into cache block 3. It prints what the
 * daemon answered, one line each, to stderr, and whether cache blocks 2
 * and 3 hold what they should.
 *
 * usage: prefix_client MOUNTPOINT
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

static int memfd(size_t n, void **mem, int ctl, __u32 *id)
{
	int fd = memfd_create("kvfs-c-prefix", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)n) != 0)
		return -1;
	*mem = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (*mem == MAP_FAILED)
		return -1;
	struct kvfs_register_fd r = { .abi = KVFS_ABI_VERSION, .length = n, .fd = fd };
	if (ioctl(ctl, KVFS_IOC_REGISTER_FD, &r) != 0)
		return -1;
	close(fd);
	*id = r.buffer;
	return 0;
}

static void tag(__u8 *t, __u8 v)
{
	memset(t, 0, KVFS_TAG_SIZE);
	t[0] = v;
	t[KVFS_TAG_SIZE - 1] = 0x5a;
}

static struct kvfs_block_entry_tagged whole(const struct kvfs_info *info, __u64 block, __u32 cb, __u8 tagv)
{
	struct kvfs_block_entry_tagged e = { .entry = { .block = block, .cache_block = cb,
		.layer_count = (__u16)info->layers, .head_count = (__u16)info->kv_heads, .kinds = KVFS_KINDS_BOTH } };
	tag(e.tag, tagv);
	return e;
}

/* fill_pairs writes the four pairs every LOOKUP here asks. */
static void fill_pairs(struct kvfs_lookup_pair *p)
{
	memset(p, 0, 4 * sizeof *p);
	p[0].block = 0xe0; tag(p[0].tag, 1);
	p[1].block = 0xe1; tag(p[1].tag, 2);
	p[2].block = 0xe1; tag(p[2].tag, 9);
	p[3].block = 0xe2;
}

static void print_lookup(const char *what, int run, const struct kvfs_lookup *h, const struct kvfs_lookup_pair *p)
{
	fprintf(stderr, "%s run %d/%u present %u absent %u mismatch %u statuses %u %u %u %u\n", what, run, h->run,
		h->present, h->absent, h->mismatch, p[0].status, p[1].status, p[2].status, p[3].status);
}

/* cache_block_is reports whether every byte of cache block cb, all
 * regions, is v. */
static int cache_block_is(const unsigned char *cache, size_t tensor, size_t bstride, __u32 regions, __u32 cb, unsigned char v)
{
	for (__u32 r = 0; r < regions; r++)
		for (size_t i = 0; i < bstride; i++)
			if (cache[r * tensor + cb * bstride + i] != v)
				return 0;
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s MOUNTPOINT\n", argv[0]);
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
	if (info.abi != KVFS_ABI_VERSION || !(info.caps & KVFS_CAP_PREFIX) || info.abi_minor < 3) {
		fprintf(stderr, "daemon without tags and LOOKUP\n");
		return 1;
	}
	size_t tile = (size_t)info.block_tokens * info.row_bytes;
	size_t bstride = info.kv_heads * tile;
	size_t tensor = (size_t)NB * bstride; /* [NB, heads, tokens, head_dim] */
	__u32 regions = 2 * info.layers;
	size_t n = regions * tensor;
	unsigned char *cache;
	__u32 buf;
	if (memfd(n, (void **)&cache, ctl, &buf) != 0)
		return fail("cache memory");
	for (__u32 r = 0; r < regions; r++) {
		memset(cache + r * tensor, 0x11, bstride);
		memset(cache + r * tensor + bstride, 0x22, bstride);
	}

	static struct kvfs_target t;
	t.abi = KVFS_ABI_VERSION;
	t.num_blocks = NB;
	t.block_stride = bstride;
	t.head_stride = tile;
	t.row_pitch = info.row_bytes;
	t.row_bytes = info.row_bytes;
	t.layer_count = (__u16)info.layers;
	t.head_count = (__u16)info.kv_heads;
	for (__u32 i = 0; i < regions; i++) {
		t.regions[i].buffer = buf;
		t.regions[i].offset = i * tensor;
	}
	if (ioctl(ctl, KVFS_IOC_REGISTER_TARGET, &t) != 0)
		return fail("register target");

	static struct kvfs_blocks_inline_tagged st;
	st.hdr.abi = KVFS_ABI_VERSION;
	st.hdr.flags = KVFS_BLOCKS_TAGGED;
	st.hdr.target = t.target;
	st.hdr.count = 2;
	st.e[0] = whole(&info, 0xe0, 0, 1);
	st.e[1] = whole(&info, 0xe1, 1, 2);
	st.e[1].parent = 0xe0;
	st.e[1].meta_flags = KVFS_META_PARENT;
	int ok = ioctl(ctl, KVFS_IOC_STORE_BLOCKS_INLINE, &st);
	if (ok < 0)
		return fail("store blocks");
	fprintf(stderr, "store n_ok %d statuses %u %u\n", ok, st.e[0].entry.status, st.e[1].entry.status);

	static struct kvfs_lookup_inline q;
	q.hdr.abi = KVFS_ABI_VERSION;
	q.hdr.count = 4;
	fill_pairs(q.p);
	int run = ioctl(ctl, KVFS_IOC_LOOKUP_INLINE, &q);
	if (run < 0)
		return fail("lookup inline");
	print_lookup("inline", run, &q.hdr, q.p);

	unsigned char *arr;
	__u32 arrbuf;
	if (memfd(4096, (void **)&arr, ctl, &arrbuf) != 0)
		return fail("pair array");
	struct kvfs_lookup_pair *p = (struct kvfs_lookup_pair *)(arr + 64);
	fill_pairs(p);
	struct kvfs_lookup h = { .abi = KVFS_ABI_VERSION, .count = 4, .buffer = arrbuf, .offset = 64 };
	run = ioctl(ctl, KVFS_IOC_LOOKUP, &h);
	if (run < 0)
		return fail("lookup");
	print_lookup("array", run, &h, p);

	static struct kvfs_blocks_inline_tagged ld;
	ld.hdr.abi = KVFS_ABI_VERSION;
	ld.hdr.flags = KVFS_BLOCKS_TAGGED;
	ld.hdr.target = t.target;
	ld.hdr.count = 2;
	ld.e[0] = whole(&info, 0xe1, 2, 9);
	ld.e[1] = whole(&info, 0xe0, 3, 1);
	ok = ioctl(ctl, KVFS_IOC_LOAD_BLOCKS_INLINE, &ld);
	if (ok < 0)
		return fail("load blocks");
	fprintf(stderr, "load n_ok %d mismatch %u/%u ok %u/%u\n", ok, ld.e[0].entry.status, ld.e[0].entry.detail,
		ld.e[1].entry.status, ld.e[1].entry.detail);
	fprintf(stderr, "cache block 2 untouched %d, cache block 3 loaded %d\n",
		cache_block_is(cache, tensor, bstride, regions, 2, 0), cache_block_is(cache, tensor, bstride, regions, 3, 0x11));
	close(ctl);
	return 0;
}
