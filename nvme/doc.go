// Package nvme owns kvfs's NVMe passthrough: the encoding of NVMe commands
// (struct nvme_uring_cmd, read/write/flush, identify, log pages, features,
// I/O Management Receive), the decoding of what the controller returns
// (Identify Controller/Namespace, the FDP configurations log, reclaim unit
// handle status, completion status), and Engine, a store.Engine that sends
// reads and writes as io_uring URING_CMDs to the namespace's generic char
// device (/dev/ngXnY) and tags writes with FDP placement identifiers.
//
// Invariants:
//   - Every decoder of device bytes bounds-checks and returns an error
//     wrapping ErrShort or ErrFormat; none panics (each has a fuzz target).
//   - No single command moves more than Limits.MaxTransfer bytes, the
//     smallest of MDTS, the block queue's max_hw_sectors_kb and
//     max_segments; Engine.Do splits larger IOs.
//   - A write is durable once Engine.Sync returned: Sync sends an NVMe
//     Flush. Writes do not set FUA.
//   - Device failures come back per IO as *StatusError (status code type and
//     code decoded; errors.Is matches ErrMedia, ErrPath, ErrRange,
//     ErrInvalidCommand) or as the errno the kernel returned.
//
// Lock order: Engine.mu (one Do, Sync or RegisterMemory at a time owns the
// ring; concurrent batches wait for each other) and bufPool.mu (the
// registered buffer pool) are both leaf locks, never held together. Device
// has no lock; its ioctls may run concurrently.
package nvme
