// Package nvme owns kvfs's NVMe passthrough vocabulary: the encoding of
// NVMe commands (struct nvme_uring_cmd, read/write/flush, identify, log
// pages, features, I/O Management Receive), the decoding of what the
// controller returns (Identify Controller/Namespace, the FDP configurations
// log, reclaim unit handle status, completion status), FDP discovery and
// the placement map (Placement: store stream → placement identifier), and
// Device, an open namespace (its generic char device /dev/ngXnY) with its
// identify data and transfer limits. The store engine that sends reads and
// writes as io_uring URING_CMDs is engine/nvme.
//
// Invariants:
//   - Every decoder of device bytes bounds-checks and returns an error
//     wrapping ErrShort or ErrFormat; none panics (each has a fuzz target).
//   - Limits.MaxTransfer is the smallest of MDTS, the block queue's
//     max_hw_sectors_kb and max_segments: no single command may move more
//     (the engine splits larger IOs there).
//   - Device failures come back as *StatusError (status code type and code
//     decoded; errors.Is matches ErrMedia, ErrPath, ErrRange,
//     ErrInvalidCommand) or as the errno the kernel returned.
//   - A Device used after Close fails with an error wrapping ErrClosed
//     (engine/nvme maps it to store.ErrEngineClosed); a second Close
//     returns nil.
//
// The package imports nothing of kvfs but uring (Available asks it whether
// io_uring can be used): the engine above it adapts its errors to the
// store's.
//
// Lock order: the package has no locks. Device's ioctls may run
// concurrently; Close must not race with them.
package nvme
