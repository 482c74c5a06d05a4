// Package store is kvfs's slot store: a superblock (kept twice) and an array
// of fixed-size slots on a file, block device or NVMe namespace, one slot per
// KV-cache block holding all its groups (see package layout for the order).
//
// It owns the on-disk format (superblock, slot headers: Format, Open,
// Fsck), the in-memory index of blocks to slots with its LRU eviction and
// free list, and the crash-safe protocols of Write, Delete and Read. It
// defines the I/O seam, Engine (with IO, Op, streams, BufferAllocator), and
// knows no engine: package engine chooses and opens one, and tests use the
// crash-simulating and fault-injecting engines of package storetest.
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
// In memory, between write operations (CheckInvariants checks all of it,
// and the store's tests run it whenever a store is closed):
//
//   - The index maps each block to the one slot whose current header is
//     live and lists it; that slot is in the LRU list, and the LRU list
//     holds exactly the indexed blocks.
//   - Every slot is in exactly one place: indexed, on the free list,
//     releasing (freed while a reader pins it; it joins the free list at
//     the last unpin) or quarantined (its on-disk state is unknown after a
//     failed write; unused until reopen). A free slot's current header on
//     the device is a tombstone.
//   - The header copy memory calls current is, byte for byte, the header on
//     the device; the generation counter is above every generation written.
//   - Pins are held only by Read batches in flight (counted in readers)
//     and by the writer holding wmu.
//
// # Concurrency and lock order
//
// Store.wmu (serialises writers: Write, Delete, DeleteBlock, Fsck, Close,
// CheckInvariants) is taken before Store.mu (index, slot states, LRU, free
// list, counters of pins and readers), which is never held across I/O.
// Readers take only mu, to pin the slots they read: a pinned slot is not
// evicted, reused or overwritten in place. Store.bounce (the idle I/O
// buffers) is a leaf, taken alone.
package store
