// Package store is kvfs's slot store: a superblock (kept twice) and an array
// of fixed-size slots on a file, block device or NVMe namespace, one slot per
// KV-cache block holding all its groups (see package layout for the order).
//
// # On disk
//
// See docs/format.md. Each slot starts with two header copies (A/B); the
// current header is the valid copy (magic, store UUID, slot number and
// CRC32C all check) with the highest generation. A header lists which groups
// are present, their CRC32C and write times. A header without the live flag
// is a tombstone: the slot is free.
//
// # Invariants
//
//   - A header is only ever written over the non-current copy, so a torn
//     header write leaves the previous header in force.
//   - Payloads are made durable (Engine.Sync) before the header that lists
//     them is written; a write is acknowledged only after that header is
//     durable. Payloads are written in place only into positions the current
//     header marks absent and only while no reader uses the slot; replacing
//     a present group copies the block to a free slot (copy-on-write).
//   - A slot taken from an evicted block is tombstoned, and the tombstone made
//     durable, before its payloads are overwritten.
//   - A free slot never holds a live current header: recovery tombstones the
//     losing slot when two slots claim one block.
//   - Every group read is checked against its CRC32C; a mismatch is reported
//     (ErrCorrupt) and the caller's buffer is zeroed.
//
// Together: after a crash at any point, every group reads as its old value,
// its new value, or absent; never as bytes whose checksum fails.
//
// # Concurrency and lock order
//
// Store.wmu (serialises writers: Write, Delete, DeleteBlock, Fsck) is taken
// before Store.mu (index, slot states, LRU, free list), which is never held
// across I/O. Readers take only mu, to pin the slots they read: a pinned slot
// is not evicted, reused or overwritten in place.
//
// All I/O goes through the Engine interface, so tests swap in the
// crash-simulating and fault-injecting engines of package storetest.
package store
