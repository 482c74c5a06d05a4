// Package store is kvfs's slot store: a superblock (kept twice) and an array
// of fixed-size slots on a file, block device or NVMe namespace, one slot per
// KV-cache block holding all its groups (see package layout for the order).
//
// It owns the on-disk format (superblock, slot headers: Format, Open,
// Fsck), the in-memory index of blocks to slots (package index: each
// block's tag, parent and eviction order, prefix-aware or LRU) and free
// list, and the crash-safe protocols of Write, Delete and Read. It
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
//     live and lists it, with the header's tag, parent and completeness;
//     its eviction lists hold exactly the indexed blocks.
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
// # Where reads land
//
// Read takes a batch of ReadReq; each names a group and its destination:
// contiguous (Buf of GroupBytes, Pitch 0) or pitched (Pitch > RowBytes:
// row r of the group at Buf[r*Pitch:], RowBytes long; a token-major NHD
// cache, one head's rows interleaved with the other heads'). The bytes
// between a pitched destination's rows are never written. A request may
// name a range of heads of one (block, layer, kind) instead (Heads, each
// head's destination HeadStride after the one before, in the same shape):
// one request for a tile's heads, its outcome the count of groups that
// failed and the most serious failure. Groups adjacent
// in a slot (layer, then K before V, then head) form runs of up to MaxIO
// bytes, one I/O each, landing in one of three ways:
//
//   - Direct: the run's destinations are contiguous, follow each other in
//     memory in slot order, and the first Buf's capacity spans the whole run
//     (so they are one range of one allocation, which the caller states by
//     slicing them from one buffer without capping the capacity), aligned
//     for the engine: one plain read into that range.
//   - Vector: the engine implements VectorReader, and every destination
//     segment (a contiguous destination, or one row of a pitched one) is
//     aligned for the engine and at least Options.ScatterMin bytes (default
//     4096): one vector read (IO.Vec, preadv) into the segments.
//   - Bounce: otherwise, the run is read into store memory carved from
//     MaxIO-sized buffers (bounce memory sized to the data), verified
//     there, and copied once to each destination (Metrics.Bounced counts
//     these bytes).
//
// On an InlineReader (below) a run whose destinations are all contiguous
// bounces too, through the reading goroutine's chunk buffer: a read there
// is a CPU copy either way, into a buffer in that core's cache rather than
// into lines of the caller's memory it must first fetch, and the landing
// copy uses non-temporal stores (measured faster, for head-major and
// token-major loads: docs/performance.md, 'Store batched reads').
//
// A group that landed in the caller's memory is verified there; on a
// mismatch it is read again into store memory before being called corrupt
// (the caller's memory may be shared with a writer). When each group is
// verified depends on the engine:
//
//   - InlineReader (the uring and posix engines on a store in memory: tmpfs,
//     ramfs; a read is a CPU copy there): up to GOMAXPROCS goroutines each
//     take a run, read it in Options.InlineChunk pieces (64 KiB) with
//     pread/preadv and verify each piece's groups right after, while the
//     copy has left them in that core's cache.
//   - NotifyEngine (the ring engines otherwise): the runs are issued
//     together and each is verified as soon as its completion arrives,
//     on up to GOMAXPROCS goroutines, while the others are in flight.
//   - Otherwise: after the whole window, in 4 MiB pieces on several
//     goroutines.
//
// In every case a fault on caller memory
// in one of the goroutines panics in the calling goroutine (when it set
// debug.SetPanicOnFault) after all have stopped. Read pins, touches (LRU)
// and unpins each slot once per run of requests for its block, with one
// round of Store.mu before the I/O and one after, and allocates nothing
// per group: a miss is ErrNotFound itself, and per-call memory is reused.
//
// # Concurrency and lock order
//
// Write computes its checksums in the caller's goroutine, outside every
// lock, then queues its call on Store.wq and takes wmu; the first caller to
// get wmu commits every queued call as one batch (group commit: concurrent
// writers share the payload and header syncs, the order payload sync →
// header sync → acknowledgement unchanged), and the others find their calls
// done.
//
// Store.wmu (serialises writers: Write, Delete, DeleteBlock, RenameBlock,
// Fsck, Close, CheckInvariants) is taken before Store.mu (index and its
// eviction order, slot states, free list, counters of pins and readers), which is never
// held across I/O.
// Readers take only mu, to pin the slots they read: a pinned slot is not
// evicted, reused or overwritten in place. Store.bounce (the idle I/O
// buffers), Store.scratch (Read's idle working memory) and Store.wq (the
// queued Write calls) are leaves, taken alone.
package store
