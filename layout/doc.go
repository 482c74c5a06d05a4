// Package layout owns the geometry of a kvfs store: the size of one KV-cache
// group, where every group of a block sits inside the block's slot, and the
// canonical file-system names of groups, layers, heads and blocks. It does
// no I/O, holds no state and has no locks: every function is pure.
//
// A group is one (block, layer, kv-head, K|V) tile of
// BlockTokens × HeadDim × dtype bytes. Inside a slot the groups are ordered by
// layer, then K before V, then head, so a layer's groups of one block form one
// contiguous extent and a load of many groups coalesces into few large reads.
//
// Invariants:
//
//   - Index and KeyAt are inverse bijections between the keys of a block and
//     0 … GroupsPerBlock-1, and Offset(Index(k)) is k's place in the slot's
//     payload: this order is part of the on-disk format (docs/format.md) and
//     never changes, nor do the numeric values of the dtypes.
//   - Every group starts on a multiple of Geometry.Align (GroupStride is
//     GroupBytes rounded up to it), so whole groups can be read with
//     O_DIRECT and land in aligned memory.
//   - A Geometry that Validate accepts keeps every size and offset within
//     int64 and every count within int.
//   - Names round-trip: the name parsers (ParseName, Parse*Name) accept
//     exactly what the matching *Name function prints (zero-padded numbers,
//     16 lowercase hex digits for a block) and refuse everything else with
//     an error wrapping ErrName or ErrRange (FuzzNameRoundTrip checks it).
package layout
