// Package ctl serves the kvfs control ioctls (ABI in package ctl/abi,
// docs/abi.md and include/kvfs.h): INFO, REGISTER_HOST, UNREGISTER, and the
// batched LOAD and STORE of groups between the store and memory a client
// registered.
//
// The FUSE layer (package fs) calls Server.Open when a process opens
// .kvfs/ctl, with the caller's uid and gid, and routes that open file's
// ioctls to the returned Session (Session.IoctlFrom, with the calling
// thread's id) and its release to Session.Release. This
// package does not import fs (nor fs this one): cmd/kvfs wires them with a
// two-line adapter.
//
// How an ioctl is served: IoctlFrom decodes it (package abi) and
// Session.serve, the one table of operations (ops.go), calls its handler.
// The transfers check every entry first: LOAD and STORE (batch.go) each
// entry against its own registration, LOAD_BLOCKS and STORE_BLOCKS
// (blocks.go) each block entry against a target validated once at
// REGISTER_TARGET (target.go). From there both take one path to the
// store (move.go): the valid entries become store requests for host
// memory, moved by readGroups and writeGroups, or pipeline items for CUDA
// memory, moved by gpuMove (package gpu chooses the route), and each
// group's result becomes the status the ABI reports through loadOutcome
// and writeOutcome.
//
// Invariants:
//
//   - A registration grants exactly what the kernel grants the caller:
//     REGISTER_FD takes the calling thread's own descriptor (pidfd_getfd);
//     REGISTER_HOST opens the path on a fresh, never reused OS thread that
//     carries the calling thread's fsuid, fsgid, groups and capabilities.
//     Checks run policy, path, size, quota, pinning (docs/abi.md).
//     REGISTER_CUDA opens another process's CUDA allocation from its IPC
//     handle only for a caller whose credentials open the GPU device files
//     (the handle is a bearer capability: the driver does not report its
//     exporter) and checks offset+length against the allocation the driver
//     reports.
//   - GPU state (gpu.go) is per device ordinal, created on first use: device,
//     staging pool, pipeline. Entries on different devices run on their own
//     goroutines; a device's copies never wait on another's. Without a
//     driver or device every GPU request fails ENODEV and nothing else
//     changes.
//   - Memory the engine pins is charged to the caller (RLIMIT_MEMLOCK
//     unless CAP_IPC_LOCK in the daemon's user namespace, a per-uid share,
//     a daemon-wide cap); a registered range with holes is not pinned, so a
//     registration allocates nothing, and a resident one is guarded
//     (holes.go) so that the daemon never refills a hole punched later.
//   - A client that shrinks a registered file or punches a hole in a
//     resident registration makes the daemon's accesses there fault.
//   - The destinations of one LOAD are disjoint: entries sharing a byte
//     are refused (BadOverlap). A group is reported corrupt only after its
//     checksum failed in memory only the daemon writes (the store re-reads
//     a directly landed group before calling it corrupt).
//   - Every entry of a batch is checked before any I/O: its key against the
//     geometry, its buffer id against the registrations of this session
//     only, and offset + extent against the registered length in exact
//     (overflow-free) arithmetic. An entry that fails gets status
//     BadRequest and is not touched; the others proceed.
//   - The daemon writes into a registered buffer only inside a tile of an
//     entry that passed those checks, and reads (STORE) only from such
//     tiles. STORE copies each tile out of the client's memory before the
//     store checksums it, so a client racing its own memory cannot make a
//     checksum disagree with the data written.
//   - Registrations belong to the session. Release (the last close of the
//     file, including when the client was killed) unmaps and unregisters all
//     of them; nothing outlives the session.
//   - Those faults are SIGBUS (for a hole, through the userfaultfd's SIGBUS
//     feature; the kernel's own accesses get EFAULT). Every access of a transfer to
//     registered memory runs under Session.guard (package internal/fault),
//     which recovers a fault whose address lies inside one of the
//     registrations the call touches and fails that ioctl with EFAULT; the
//     daemon keeps serving. Any other fault crashes the daemon as before.
//
// Lock order: Session.io before Session.mu. io is held shared by LOAD and
// STORE for the duration of their I/O and exclusively by UNREGISTER and
// Release while they unmap; mu guards the session's registration table and
// is never held across I/O or mmap.
package ctl
