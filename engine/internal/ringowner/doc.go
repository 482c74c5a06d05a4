// Package ringowner is the one owner of an io_uring instance for the ring
// engines (engine/uring and engine/nvme). It owns:
//
//   - the ring, created and used only by one goroutine locked to its OS
//     thread (so the ring can use SINGLE_ISSUER and DEFER_TASKRUN, and
//     completion work runs on the thread that waits);
//   - the callers' queue: Do, Sync, RegisterMemory and Close append a call
//     under Owner.mu and wait for it; DoAsync appends one with a callback.
//     Concurrent callers' batches share the queue depth, started in FIFO
//     order. When the ring goroutine sleeps in the kernel, a read of an
//     eventfd is in flight and an enqueue writes the eventfd;
//   - slots: one per SQE in flight, its index the SQE's user_data;
//     requests longer than Config.MaxPiece are split into pieces in flight
//     together, and a request completes with its last piece;
//   - completion: EAGAIN/EINTR resubmitted (MaxRetries), short transfers
//     continued, DoAsync callbacks run on the ring goroutine;
//   - the fixed-buffer table (a sparse table updated in place, or the whole
//     table re-registered on kernels without update) with the pool and
//     every RegisterMemory region, and the one first-fit buffer pool
//     (2 MiB-aligned, transparent huge pages where allowed).
//
// # Rings
//
// Rings (rings.go) runs N Owners for one engine (N from the engine's
// options; AutoRings gives one per 4 usable cores — affinity mask, cgroup
// cpu.max or cfs quota, at least one per NUMA node — at most MaxRings).
// Each ring has its own goroutine on its own OS thread and its own Driver
// (drivers keep per-ring state). Do and DoAsync calls go to the rings
// round robin; a Do batch of at least 2·4 IOs is split into contiguous
// parts on several rings and waited for as a whole (every started part is
// waited for, even when another could not start). Sync goes to one ring (a
// flush covers every write completed before it). RegisterMemory registers
// on every ring. The rings share the pool and the count of SQEs in flight
// (Stats.MaxInFlight is over all rings at once). A failed ring follows the
// rules below; later calls go to the rings that still work, and fail with
// the ring error when none does.
//
// The pool grows (Config.PoolMaxBytes): when AllocBuffer finds no room,
// one caller maps a segment (PoolBytes, or the request rounded up to
// 2 MiB, at most 1 GiB) while the others wait for it, and the segment is
// registered on every ring without waiting (a sparse-table slot range of
// its own, apart from RegisterMemory's; until registered, I/O on it uses
// plain buffers). Segments are not unmapped before Close; past the cap
// AllocBuffer returns plain memory (never blocks for memory to come back).
//
// An engine supplies a Driver: how to check a request, prepare its SQE
// (plain READ/WRITE(_FIXED)/FSYNC, or URING_CMD NVMe commands) and read
// its completion. The driver runs on the ring goroutine only.
//
// # Invariants
//
//   - No caller is released, and no memory unmapped or reused, until every
//     request that names it has completed or is known cancelled. On a
//     ring-level error (io_uring_enter failing with anything but EAGAIN or
//     EBUSY) the owner marks itself broken (new calls fail at once),
//     submits IORING_OP_ASYNC_CANCEL (IORING_ASYNC_CANCEL_ANY where the
//     kernel has it, else one per user_data), reaps until nothing is in
//     flight (bounded by Config.DrainTimeout), and only then fails the
//     callers and closes the ring.
//   - When the requests cannot be reaped (enter keeps failing), their
//     memory is leaked on purpose: the pool is never unmapped, FreeBuffer
//     stops unmapping, the owner (and with it the slots' buffers and the
//     eventfd read's buffer) stays referenced for the life of the process,
//     and one Error line gives the requests and bytes involved. Memory a
//     client registered is the client's: the owner cannot stop its unmap.
//   - A pool chunk still out at Close keeps the pool mapped until the last
//     chunk comes back.
//   - Close waits for the requests in flight, then retires the eventfd read
//     and closes the ring; a second Close returns nil; calls after Close
//     fail with an error wrapping store.ErrEngineClosed.
//
// # Lock order
//
// Owner.mu (the queue, closed, broken, leaked) and pool.mu are leaf locks,
// never held together and never across a system call other than the
// eventfd write. A pool growth maps its segment and enqueues its
// registrations with pool.mu released (pool.growing makes the other
// allocators wait on pool.grown). Rings adds no lock: the round-robin
// counter and the shared in-flight counts are atomics. Everything else belongs to the ring goroutine.
package ringowner
