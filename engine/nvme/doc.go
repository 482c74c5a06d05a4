// Package nvme is the NVMe passthrough store engine: store.Engine,
// store.BufferAllocator and store.MemoryRegistrar on an NVMe namespace's
// generic char device, every read, write and flush an io_uring URING_CMD
// (NVME_URING_CMD_IO) on a ring with 128-byte SQEs and 32-byte CQEs.
//
// It owns the namespace (a package nvme Device) and its commands: IOs
// split at the device's maximum transfer (the owner issues the pieces
// together), writes tagged with the FDP placement identifier of IO.Stream
// when the namespace has FDP enabled, fixed-buffer commands
// (IORING_URING_CMD_FIXED, kernel ≥ 6.1; turned off if the device refuses
// them), Sync as an NVMe Flush (writes do not set FUA). The ring and
// everything around it — the goroutine, the callers' queue, the buffer
// table, the pool, failure handling — is engine/internal/ringowner's, shared
// with the uring engine: EngineOptions.Rings rings (one driver each),
// concurrent Do batches spread over them and share each ring's queue
// depth; a Flush on any ring covers the writes completed on all.
//
// Invariants: no command moves more than Device.Limits.MaxTransfer bytes;
// device status comes back per IO as a wrapped *nvme.StatusError; a write
// is durable once Sync returned; after Close every call fails with an error
// wrapping store.ErrEngineClosed (a Device's own nvme.ErrClosed included).
//
// Lock order: the engine adds no lock to the owner's; Device ioctls
// (identify, FDP status) run beside the ring without one.
package nvme
