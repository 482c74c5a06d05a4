// crc32c.cu: CRC32C (Castagnoli, reflected, init and final xor 0xFFFFFFFF, as
// Go's hash/crc32 with crc32.Castagnoli) of many KV-cache groups that lie in
// GPU memory, and the zeroing of groups whose checksum failed.
//
// Compiled to PTX by scripts/gen-ptx.py (NVRTC) into crc32c.ptx beside this
// file; gpu/crc32c embeds that PTX and loads it with cuModuleLoadData. The
// algorithm is mirrored bit for bit by reference.go, which CI tests against
// hash/crc32; doc.go explains the design.
//
// Entry points (extern "C", so their names are stable in the PTX):
//   kvfs_crc32c_init(u32 *tab)                      one block of 1024 threads, once per module
//   kvfs_crc32c(tab, desc, n, got)                  got[i] = CRC32C(group i)
//   kvfs_crc32c_verify(tab, desc, n, want, got)     the same, and group i is zeroed where got[i] != want[i]
//   kvfs_zero_groups(desc, n, mask)                 zero group i where mask[i] != 0
//   kvfs_crc32c_land(tab, src, dst, n, want, got)   got[i] = CRC32C(src i), copied to dst i where it equals want[i], else zeros there
// tab is a device buffer of TAB_WORDS u32 that kvfs_crc32c_init fills.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;

// One group: rows × row_bytes bytes, row r at addr + r*pitch (a contiguous
// group is rows = 1). 24 bytes, laid out as gpu/crc32c.Group.
struct kvfs_group {
	u64 addr;
	u64 pitch;
	u32 rows;
	u32 row_bytes;
};

#define POLY 0x82F63B78u // CRC32C, reflected
#define LANES 32
#define UNIT 16                       // bytes one lane loads at a time (one 16-byte vector)
#define SKIP ((LANES - 1) * UNIT)     // bytes of the other lanes between two units of one lane: 496
#define WARPS_PER_BLOCK 8

// Layout of the table buffer (u32 words).
#define TAB_Z 0                       // 16 tables × 256: byte i of a unit, shifted past the rest of the unit and SKIP zeros
#define TAB_S (TAB_Z + 16 * 256)      // 4 tables × 256: slicing-by-4 (S0 is the byte table)
#define TAB_P (TAB_S + 4 * 256)       // 32: lane t's shift to the end of the group, x^(8*16*(31-t))
#define TAB_X (TAB_P + 32)            // 32: x^(2^k) mod P, for x^(8n) by square-and-multiply
#define TAB_WORDS (TAB_X + 32)
#define TAB_SHARED TAB_P              // the words each block copies into shared memory (Z and S)

// gfmul returns a·b mod P; bit 31 holds the coefficient of x^0 (reflected).
__device__ __forceinline__ u32 gfmul(u32 a, u32 b) {
	u32 p = 0;
#pragma unroll
	for (i32 i = 31; i >= 0; i--) {
		p ^= b & (0u - ((a >> i) & 1u));
		b = (b >> 1) ^ (POLY & (0u - (b & 1u)));
	}
	return p;
}

// xpow8n returns x^(8n) mod P from the x^(2^k) table.
__device__ u32 xpow8n(const u32 *x2n, u64 n) {
	u32 p = 0x80000000u; // x^0
	u32 k = 3;
	while (n) {
		if (n & 1) p = gfmul(x2n[k & 31], p);
		n >>= 1;
		k++;
	}
	return p;
}

extern "C" __global__ void kvfs_crc32c_init(u32 *tab) {
	__shared__ u32 x2n[32];
	__shared__ u32 t0[256];
	u32 tid = threadIdx.x;
	if (tid == 0) {
		u32 p = 0x40000000u; // x^1
		x2n[0] = p;
		for (i32 k = 1; k < 32; k++) {
			p = gfmul(p, p);
			x2n[k] = p;
		}
	}
	if (tid < 256) {
		u32 c = tid;
		for (i32 k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & (0u - (c & 1u)));
		t0[tid] = c;
	}
	__syncthreads();
	for (u32 i = tid; i < TAB_WORDS; i += blockDim.x) {
		u32 v;
		if (i < TAB_S) {
			u32 tbl = i >> 8, b = i & 255;
			v = gfmul(t0[b], xpow8n(x2n, 15 - tbl + SKIP));
		} else if (i < TAB_P) {
			u32 tbl = (i - TAB_S) >> 8, b = i & 255;
			v = gfmul(t0[b], xpow8n(x2n, tbl));
		} else if (i < TAB_X) {
			v = xpow8n(x2n, (u64)UNIT * (31 - (i - TAB_P)));
		} else {
			v = x2n[i - TAB_X];
		}
		tab[i] = v;
	}
}

// fast reports whether a group can be read in aligned 16-byte units.
__device__ __forceinline__ bool fast(const kvfs_group &g) {
	return (g.addr & 15) == 0 && (g.row_bytes & 15) == 0 && (g.rows <= 1 || (g.pitch & 15) == 0);
}

__device__ __forceinline__ u32 slice4(const u32 *s, u32 c, u32 w) {
	c ^= w;
	return s[3 * 256 + (c & 255)] ^ s[2 * 256 + ((c >> 8) & 255)] ^ s[256 + ((c >> 16) & 255)] ^ s[c >> 24];
}

__device__ __forceinline__ u32 zstep(const u32 *z, u32 c, uint4 v) {
	u32 a = v.x ^ c;
	return z[0 * 256 + (a & 255)] ^ z[1 * 256 + ((a >> 8) & 255)] ^ z[2 * 256 + ((a >> 16) & 255)] ^
	       z[3 * 256 + (a >> 24)] ^ z[4 * 256 + (v.y & 255)] ^ z[5 * 256 + ((v.y >> 8) & 255)] ^
	       z[6 * 256 + ((v.y >> 16) & 255)] ^ z[7 * 256 + (v.y >> 24)] ^ z[8 * 256 + (v.z & 255)] ^
	       z[9 * 256 + ((v.z >> 8) & 255)] ^ z[10 * 256 + ((v.z >> 16) & 255)] ^ z[11 * 256 + (v.z >> 24)] ^
	       z[12 * 256 + (v.w & 255)] ^ z[13 * 256 + ((v.w >> 8) & 255)] ^ z[14 * 256 + ((v.w >> 16) & 255)] ^
	       z[15 * 256 + (v.w >> 24)];
}

// group_crc returns the CRC32C of g in every lane of the calling warp.
//
// Fast path: the group is U = N/16 units of 16 bytes. Units are dealt to the
// 32 lanes round by round, aligned to the end: in round k (of R = ceil(U/32))
// lane t takes unit U - 32(R-k) + t, so every load instruction of the warp
// reads 512 consecutive logical bytes. A lane keeps the CRC state of "its
// units with zeros in place of the other lanes' bytes": through every round
// but the last, one unit and the 496 zero bytes after it are one step of 16
// table lookups (the Z tables fold the zeros in); the last round is plain
// slicing-by-4, after which lane t's state sits 16(31-t) bytes before the
// end of the group and is moved there by one multiplication by
// x^(8·16(31-t)) mod P. CRC without init is linear, so the XOR of the 32
// lanes is the CRC of the whole group; the lane that holds unit 0 starts it
// from 0xFFFFFFFF (the init), and the XOR with 0xFFFFFFFF at the end is the
// final xor.
//
// Slow path (unaligned address, pitch or row length): lane t takes the
// contiguous logical bytes [t·C, (t+1)·C), C = ceil(N/32), byte by byte, and
// moves its state to the end with x^(8(N - end)).
__device__ u32 group_crc(const kvfs_group &g, const u32 *sh, const u32 *tab, u32 lane, u32 lanePow) {
	const u32 *z = sh + TAB_Z;
	const u32 *s = sh + TAB_S;
	u64 n = (u64)g.rows * g.row_bytes;
	u32 c = 0;
	if (fast(g)) {
		i32 units = (i32)(n / UNIT);
		i32 rounds = (units + LANES - 1) / LANES;
		// This lane's unit in round 0; a negative one means the lane starts
		// in round 1 (the first round is the partial one).
		i32 u = units - LANES * rounds + (i32)lane;
		i32 k = 0;
		if (u < 0) {
			u += LANES;
			k = 1;
		}
		if (k < rounds) {
			u64 o = (u64)u * UNIT;
			u64 row = o / g.row_bytes, col = o % g.row_bytes;
			uint4 v = *(const uint4 *)(g.addr + row * g.pitch + col);
			for (; k < rounds; k++, u += LANES) {
				// Load the next unit before using this one: two loads in flight.
				uint4 next = make_uint4(0, 0, 0, 0);
				if (k + 1 < rounds) {
					col += LANES * UNIT;
					while (col >= g.row_bytes) {
						col -= g.row_bytes;
						row++;
					}
					next = *(const uint4 *)(g.addr + row * g.pitch + col);
				}
				if (u == 0) c = 0xFFFFFFFFu;
				if (k + 1 < rounds) {
					c = zstep(z, c, v);
				} else {
					c = slice4(s, c, v.x);
					c = slice4(s, c, v.y);
					c = slice4(s, c, v.z);
					c = slice4(s, c, v.w);
				}
				v = next;
			}
		}
		if (units - LANES + (i32)lane >= 0) c = gfmul(c, lanePow);
		if (units == 0 && lane == 0) c = 0xFFFFFFFFu;
	} else {
		u64 chunk = (n + LANES - 1) / LANES;
		u64 begin = chunk * lane, end = begin + chunk;
		if (begin > n) begin = n;
		if (end > n) end = n;
		if (lane == 0) c = 0xFFFFFFFFu;
		if (begin < end) {
			u64 row = begin / g.row_bytes, col = begin % g.row_bytes;
			const unsigned char *p = (const unsigned char *)(g.addr + row * g.pitch);
			for (u64 o = begin; o < end; o++) {
				c = s[(c ^ p[col]) & 255] ^ (c >> 8);
				if (++col == g.row_bytes) {
					col = 0;
					p += g.pitch;
				}
			}
		}
		c = gfmul(c, xpow8n(tab + TAB_X, n - end));
	}
#pragma unroll
	for (i32 d = 16; d > 0; d >>= 1) c ^= __shfl_xor_sync(0xFFFFFFFFu, c, d);
	return ~c;
}

// zero_group writes zeros over g with the calling warp.
__device__ void zero_group(const kvfs_group &g, u32 lane) {
	if (fast(g)) {
		u32 per = g.row_bytes / UNIT;
		u64 units = (u64)g.rows * per;
		for (u64 u = lane; u < units; u += LANES) {
			u64 row = u / per, col = (u % per) * UNIT;
			*(uint4 *)(g.addr + row * g.pitch + col) = make_uint4(0, 0, 0, 0);
		}
	} else {
		u64 n = (u64)g.rows * g.row_bytes;
		for (u64 o = lane; o < n; o += LANES) {
			*(unsigned char *)(g.addr + (o / g.row_bytes) * g.pitch + o % g.row_bytes) = 0;
		}
	}
}

__device__ __forceinline__ void load_tables(u32 *sh, const u32 *tab) {
	const uint4 *src = (const uint4 *)tab;
	uint4 *dst = (uint4 *)sh;
	for (u32 i = threadIdx.x; i < TAB_SHARED / 4; i += blockDim.x) dst[i] = src[i];
	__syncthreads();
}

// copy_group copies group s to group d (the same rows and row bytes; any
// pitches) with the calling warp, or writes zeros over d when !ok.
__device__ void copy_group(const kvfs_group &s, const kvfs_group &d, bool ok, u32 lane) {
	if (fast(s) && fast(d)) {
		u32 per = d.row_bytes / UNIT;
		u64 units = (u64)d.rows * per;
		for (u64 u = lane; u < units; u += LANES) {
			u64 row = u / per, col = (u % per) * UNIT;
			uint4 v = make_uint4(0, 0, 0, 0);
			if (ok) v = *(const uint4 *)(s.addr + row * s.pitch + col);
			*(uint4 *)(d.addr + row * d.pitch + col) = v;
		}
	} else {
		u64 n = (u64)d.rows * d.row_bytes;
		for (u64 o = lane; o < n; o += LANES) {
			u64 row = o / d.row_bytes, col = o % d.row_bytes;
			unsigned char v = 0;
			if (ok) v = *(const unsigned char *)(s.addr + row * s.pitch + col);
			*(unsigned char *)(d.addr + row * d.pitch + col) = v;
		}
	}
}

// crc_groups is every checking kernel's loop: a warp per group of desc,
// got[i] its CRC32C. With dst, group i is landed at dst[i] (its copy, or
// zeros where it differs from want[i]); else, with want, it is zeroed in
// place where it differs.
__device__ __forceinline__ void crc_groups(const u32 *tab, const kvfs_group *desc, const kvfs_group *dst, u32 n, const u32 *want, u32 *got) {
	__shared__ __align__(16) u32 sh[TAB_SHARED];
	load_tables(sh, tab);
	u32 lane = threadIdx.x & (LANES - 1);
	u32 lanePow = tab[TAB_P + lane];
	u32 warps = gridDim.x * (blockDim.x / LANES);
	for (u32 i = blockIdx.x * (blockDim.x / LANES) + threadIdx.x / LANES; i < n; i += warps) {
		kvfs_group g = desc[i];
		u32 c = group_crc(g, sh, tab, lane, lanePow);
		if (lane == 0) got[i] = c;
		if (dst) {
			__syncwarp();
			copy_group(g, dst[i], c == want[i], lane);
		} else if (want && c != want[i]) {
			__syncwarp();
			zero_group(g, lane);
		}
	}
}

extern "C" __global__ void kvfs_crc32c(const u32 *tab, const kvfs_group *desc, u32 n, u32 *got) {
	crc_groups(tab, desc, 0, n, 0, got);
}

extern "C" __global__ void kvfs_crc32c_verify(const u32 *tab, const kvfs_group *desc, u32 n, const u32 *want, u32 *got) {
	crc_groups(tab, desc, 0, n, want, got);
}

extern "C" __global__ void kvfs_zero_groups(const kvfs_group *desc, u32 n, const u32 *mask) {
	u32 lane = threadIdx.x & (LANES - 1);
	u32 warps = gridDim.x * (blockDim.x / LANES);
	for (u32 i = blockIdx.x * (blockDim.x / LANES) + threadIdx.x / LANES; i < n; i += warps) {
		if (mask[i]) zero_group(desc[i], lane);
	}
}

// kvfs_crc32c_land checks each group src[i] (as it was copied into device
// scratch) against want[i] and lands it at dst[i] (its tile, pitched rows
// or packed), or writes zeros there when it differs; got[i] is its CRC32C.
// src[i] and dst[i] have the same rows and row bytes and do not overlap.
extern "C" __global__ void kvfs_crc32c_land(const u32 *tab, const kvfs_group *src, const kvfs_group *dst, u32 n, const u32 *want, u32 *got) {
	crc_groups(tab, src, dst, n, want, got);
}
