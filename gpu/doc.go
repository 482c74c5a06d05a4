// Package gpu moves KV-cache groups between the store and GPU memory
// through pinned host staging buffers.
//
// A load reads groups from the store into a staging buffer (pinned for the
// GPU and registered with the store's engine as a fixed buffer, so the
// storage DMA lands there and the CPU never copies the payload), then
// queues asynchronous host-to-device copies from it and records the
// buffer's own event. Chunks are read in groups (ReadAhead buffers per
// store call), two groups' reads in flight while the copies of the group
// before run. Runs of tiles adjacent on both sides move with one copy,
// runs at constant strides with one 2D copy, and the rest of a chunk's
// copies with one batch call (Batcher: cuMemcpyBatchAsync). A store runs
// the other way: device-to-host copies into staging (adjacent tiles with
// one copy, tiles at a constant stride with one 2D copy), wait for that
// buffer's event, then the store's batched durable write from it.
//
// A store file in memory (tmpfs) needs no staging: registered with the
// GPU (SetHost), it is read by the copy engines straight into the tiles,
// and the groups are checked where they landed (direct.go). Pitched
// (token-major) tiles, read packed, go through device scratch, and one
// kernel pass checks each group and writes its rows (Land; landed.go).
//
// A load checked on the GPU may take tiles instead of groups (Item.Tile;
// tile.go): a block's (layer, kind) heads as one item, so a load of whole
// blocks pays per tile, not per group; the checker expands a tile into its
// heads. Through staging a tile is one store request; a Hugging Face
// cache's tiles (heads a sequence apart) are staged head by head across
// consecutive cache blocks, so each head's run of blocks is one copy
// (spanTiles). Direct, packed tiles are located head by head.
//
// Pipeline.Load is the one entry point of a load and chooses its route
// from the request alone (route.go): direct from the store's host view,
// staged with pitched tiles landed by the kernel, or staged. Whatever the
// route, a group is checked before its bytes are used, by the store in
// staging or by the device where it landed (check.go). The files follow
// the jobs: pipeline.go the types and configuration, staging.go which
// batch owns which staging buffer, staged.go the staged route, copy.go the
// planning of a chunk's copies, direct.go and landed.go the other two
// routes, tile.go items of several heads, store.go the way back (Store),
// verify.go the CRC32C checker on the device, pool.go the staging pool.
//
// The GPU is reached through the Device interface (copies on one ordered
// queue, events, pinned allocations); CUDA implements it over package
// gpu/cuda, and package gpu/gputest has a fake for tests without a GPU. A
// device with several queues (Laner: CUDA streams) gives each batch one of
// them for all its copies and events.
//
// # Invariants
//
//   - A staging buffer is reused (by this batch or returned to the Pool for
//     another) only after the event recorded after its last copy has been
//     observed complete. When the event cannot tell (recording failed), the
//     device is synchronized; when that fails too the buffer is never
//     reused (leaked, counted in Metrics).
//   - A group whose checksum failed is never left in the destination as if
//     good: its staging bytes are zeroed (the store does so too) and copied,
//     and it is reported ErrCorrupt.
//   - A load reports a group done only after the event covering its copy
//     completed without error; a copy that failed makes every group of its
//     chunk fail with ErrCopy (their destinations are undefined, as after a
//     failed read into host memory).
//   - No stream-wide synchronize per read: a batch waits on its own
//     buffers' events only.
//   - A direct load unpins a chunk's slots only after the event covering
//     its copies was observed complete, so no slot takes another block
//     while a copy may read it; only when the device cannot tell (record
//     and synchronize both failed) are they unpinned at once, and then
//     every group of the chunk fails (its tile undefined).
//
// # Lock order
//
// Pool.mu is a leaf lock, never held across a device call or I/O.
package gpu
