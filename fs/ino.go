package fs

import "github.com/kvfs/kvfs/layout"

// Inode numbers. The static nodes have small fixed numbers; the nodes of
// blocks, heads and groups get a hash of what they name, so that the same
// name always has the same inode number (find, cp and tar compare them)
// without a table. The hashes have bit 62 set and bit 63 clear, so they
// never meet the fixed numbers nor go-fuse's automatic ones (from 2^63).
// Two different nodes share a number with probability n²/2^63 for n nodes
// known to the kernel at once, which is negligible.
const (
	inoRoot     = 1
	inoKvfs     = 2
	inoCtl      = 3
	inoStats    = 4
	inoGeometry = 5
	inoLayer0   = 16 // layer L is inoLayer0 + L
)

const (
	tagBlock uint64 = iota + 1
	tagHead
	tagGroup
	tagStaged
)

func mix64(x uint64) uint64 {
	// splitmix64's finaliser: a bijection with full avalanche.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func hashIno(tag uint64, block uint64, a, b int) uint64 {
	h := mix64(block ^ 0x6b76667300000000)
	h = mix64(h ^ tag<<56 ^ uint64(a)<<24 ^ uint64(b))
	return h&(1<<62-1) | 1<<62
}

func inoBlockDir(layer int, block uint64) uint64 { return hashIno(tagBlock, block, layer, 0) }

func inoHeadDir(layer int, block uint64, head int) uint64 {
	return hashIno(tagHead, block, layer, head)
}

func inoGroup(g layout.Geometry, k layout.Key) uint64 {
	return hashIno(tagGroup, k.Block, 0, g.Index(k))
}
