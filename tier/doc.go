// Package tier is the daemon's DRAM tier: a cache of whole blocks in host
// memory in front of a store (package store), shared by every client of
// the mount, so that a store on disk serves its hot blocks at memory speed
// and keeps everything else, and across restarts, at the device's.
//
// # Where it sits
//
// The tier speaks the store's own vocabulary (Read with store.ReadReq,
// Write with store.WriteReq, Delete, DeleteBlock, RenameBlock), so the
// servers above it (fs for group files; ctl for LOAD, LOAD_BLOCKS, STORE,
// STORE_BLOCKS, and the GPU pipeline it drives) take either the store or a
// tier through one small interface of their own; without --dram they get
// the store itself and nothing changes. Everything else (Stat, Block,
// Blocks, Lookup, Info) they still ask the store: the store is the one
// source of truth and the tier holds nothing the store does not.
//
// Loads into GPU memory read through the tier too, except from a store
// whose file is in memory (tmpfs), which the GPU loads straight from as
// without a tier. Where the GPU checks what it loads (the CRC32C kernel),
// the arena, one mapping, is registered with CUDA (cuMemHostRegister, one
// call, in the background) and a hit reaches GPU memory by DMA from its
// slot with no staging copy (Locate, Changed, Unpin: see gpu.go for how
// the slot stays pinned and a version the store replaced meanwhile is
// never served); misses, and loads before the registration or without
// it, go through the pipeline's staging (a hit is then one CPU copy from
// the arena into pinned staging).
//
// # Memory
//
// One anonymous mapping of Options.Bytes, cut into slots of one block's
// payload each (store geometry's PayloadBytes: its groups at the store's
// group stride, so a block read lands in a slot with the store's own
// alignment, straight from the device where the engine can). Reserved huge
// pages (MAP_HUGETLB, the mapping rounded up to whole huge pages) when the
// system has enough free, else base pages with transparent huge pages
// asked for (MADV_HUGEPAGE); where huge pages are reserved but too few are
// free for the tier, the log says so and how many. Every page is faulted
// in when the tier is made (MADV_POPULATE_WRITE): a size the machine
// cannot give (more than MemAvailable, or a mapping or fault-in the kernel
// refuses) fails the mount with ErrTooLarge and how much there is, rather
// than an out-of-memory kill under load later; and the daemon's resident
// size is the arena plus a bounded overhead: per slot its index entry and
// state (tens of bytes), a presence bitmap and 4 bytes of CRC per group
// (0.1% of a block of 4 KiB groups).
//
// # Versions: never older than the store
//
// A copy in the tier is labelled with the store's generation of the block
// it was read under (store.BlockVersion.Gen: every write, delete or rename
// of a block commits a generation never used before; a block the store
// evicted is absent). Every read asks the store, under the store's index
// lock and in one call for the batch (store.Versions, no I/O), for the
// current generation and tag of each block it touches; a copy is served
// only when its label equals the store's generation. The generation is
// taken before a miss reads the block, so a write racing the fill can only
// leave newer bytes under an older label, which never matches again; a
// copy can never pass for a version newer than its bytes. So the tier
// needs no hook into the store to be correct: the store's own evictions,
// and any change made without passing through the tier (a caller holding
// the store itself), are seen at the next read. The same call counts as a
// use of each block in the store's eviction order, so a block hot in the
// tier stays in the store too. Deletes and renames that pass through the
// tier also drop its copies at once, so that their slots are reused
// first, and so do writes, except of whole blocks, whose written version
// the tier keeps under the generation of the write's own commit (see
// Writes); a copy of a block the store evicted is dropped when a read finds
// it stale, or by the tier's own eviction.
//
// So the one rule for every copy, read or written: its label is the
// generation of a header the store committed with exactly the copy's bytes
// in it, and a copy is served only while that is the block's current
// generation. A copy can be late (labelled with a generation the block
// has left: never served again) but never wrong.
//
// The tag of a block is checked the way the store checks it: a request
// whose expected tag (ReadReq.Tag) is not the store's current tag for the
// block is handed to the store, which answers ErrTagMismatch without I/O,
// so a hit never serves the bytes of another prefix, and the store's
// counters see the mismatch.
//
// # Reads
//
// A hit copies each group from the arena to the caller's destination
// (contiguous, pitched rows, head ranges: every shape the store lands) and
// computes the CRC32C of the bytes landed, chunk by chunk as they are
// copied (the checksum reads them from the core's cache), against the CRC
// the group was verified against when it entered the tier. DRAM does not
// rot the way a disk does, but the copy is the one place where a bug in the
// tier (a slot reused under a reader) or a stray write into the arena would
// hand a caller wrong KV silently, and the check costs a pass over bytes
// already in cache. A copy that fails it is never served: its destination
// is zeroed, the block dropped, and the store reads the request again.
// Unverified requests (the caller checks where the bytes end up) get the
// recorded CRCs instead, as from the store. A hit does no I/O: it is
// served while the device fails. Hits land on the calling goroutine; many
// callers spread over the cores, one large call does not (yet).
//
// A miss reads the whole block from the store into a slot, all of its
// groups in one store read with the other misses of the call, and verifies
// every group against the CRC the store's header records before the copy
// is served to anyone: a block with a group that fails (corrupt, an I/O
// error) is not kept, and its requests go to the store, which reports the
// failure as it would without the tier. The block is then landed from the
// slot like a hit. Requests the tier cannot check in the store's terms (an
// invalid key or destination) also go to the store, which says why.
//
// The unit is the block, as for the store's slots and evictions and for
// LOAD_BLOCKS: its groups are adjacent on the device, one coalesced read.
// A FUSE read of one group file therefore reads its whole block into the
// tier.
//
// # Admission and eviction
//
// A block read once is kept. KV-cache reuse is a prefix reused soon after
// it was stored or first loaded (the next turn of a conversation, the
// shared system prompt of many requests), so a block's first read is the
// best predictor there is of its next; a frequency filter (what peers use
// for their disk tier, where an admission costs a device write) would make
// every prefix pay a second load from the device before it is served from
// memory, while here an admission costs only a copy the miss made anyway.
// Scans larger than the tier do evict hot blocks; the tier's eviction is
// its own, independent of the store's (the store usually holds far more),
// and uses the store's index package: prefix-aware when blocks carry
// parents (leaves of the prefix forest first, so a shared prefix stays
// while its continuations come and go), least recently used otherwise.
//
// # Writes
//
// Write-through: a write returns when the store has it durably, with the
// store's outcome, as without the tier. A write of a whole block (every
// group of it in one call, each once: a STORE_BLOCKS or v1 STORE of whole
// blocks) is also kept, whether the tier held the block or not:
//
//  1. Before the store sees it, each group is copied into a slot reserved
//     for the block (outside the index: no read finds it, no eviction
//     takes it), its CRC32C computed as it is copied, from the core's
//     cache; a request that came with its checksum (Summed) must match it,
//     else the block is written from the caller's bytes as given and kept
//     nowhere. The store then writes the block from the slot, with those
//     checksums: the store's bytes are the tier's, byte for byte, however
//     the caller's memory changes meanwhile.
//  2. The store answers, per request, the generation of the header it
//     committed the request's bytes in (store.WriteReq.Gen): 0 when the
//     write failed, or when another call committed in the same batch, and
//     queued after it, replaced them (the store's group commit keeps the
//     last).
//  3. After the store acknowledged the write, the block is kept under that
//     generation, in place of any older copy, only when every group of it
//     got the same one and it is still the block's (store.Versions, one
//     call for the blocks of the write): a write or delete that committed
//     after it, through the tier or not, wins, and the written copy is
//     given up (or, committed after this check, leaves it labelled with a
//     generation the block no longer has). A read that brought the same
//     version in first keeps its copy.
//
// The label is the write's own generation, never the block's current one
// read after the write: a write straight to the store that committed in
// between would otherwise pass the older bytes for its version (the model
// test breaks the rule this way on purpose and fails).
//
// Admission on write: a block an engine stores is the block it is most
// likely to load next (a conversation's next turn reloads the prefix its
// last turn stored; a shared prompt stored by one request is loaded by
// the next ones), and the copy costs one pass over bytes the store would
// have checksummed anyway. A call keeps at most half the tier, so that a
// store larger than the tier neither pins all of it while it is written
// nor evicts what it keeps before the call ends. A write of some groups of
// a block (a FUSE write of one group file, a STORE of a few groups) drops
// the tier's copy instead: the new version's other groups are the store's,
// which the tier cannot know to be its copy's without reading them. Stores
// from GPU memory write the staged groups through the tier in chunks of
// the pipeline's depth: a block whole within one chunk is kept like any
// other (the copy then is a CPU pass over the staged bytes, checked
// against the checksums the GPU computed), one split across chunks is
// dropped.
//
// # Restart
//
// The tier is a cache of a durable store: a kill of the daemon loses
// nothing the store acknowledged, and a remount starts with an empty tier.
package tier
