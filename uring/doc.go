// Package uring is kvfs's own io_uring binding, written on
// golang.org/x/sys/unix, and the "uring" store engine built on it.
//
// # The ring (Ring)
//
// New sets up a ring (io_uring_setup) with the asked options — entries,
// SQPOLL with an idle time, SQE128/CQE32 for NVMe passthrough — and the
// optional SINGLE_ISSUER / COOP_TASKRUN / DEFER_TASKRUN flags, which are
// dropped one at a time when the kernel answers EINVAL (Flags says what is
// in effect). It maps the SQ and CQ rings (once, with
// IORING_FEAT_SINGLE_MMAP) and the SQE array.
//
// Guarantees and rules:
//
//   - One submitter: a Ring is not safe for concurrent use. One goroutine at
//     a time may use the submission side (GetSQE, Prep*, Submit,
//     SubmitAndWait) and one at a time the completion side (PeekCQE,
//     WaitCQE, CQAdvance, ReapCQEs); callers that share a ring lock it.
//     With SINGLE_ISSUER or DEFER_TASKRUN the kernel further requires every
//     io_uring_enter and io_uring_register call to come from the OS thread
//     that created the ring: create and use it from a goroutine that called
//     runtime.LockOSThread (otherwise EEXIST).
//   - Memory ordering: the kernel-shared indexes are accessed with
//     sync/atomic on the mapped uint32s: the CQ tail and the SQ head are
//     loaded (acquire) before CQEs are read or SQEs reused, and the SQ tail
//     and the CQ head are stored (release) after the SQEs are written or the
//     CQEs copied out. Go's atomics are sequentially consistent, so the
//     SQPOLL need-wakeup check after the tail store is also ordered.
//   - SQE zeroing: GetSQE zeroes the whole entry (64 or 128 bytes) and every
//     Prep* method rewrites all 64 bytes, so no field of a previous request
//     (rw_flags, buf_index, the URING_CMD area …) leaks into the next.
//   - CQEs are copied out of the ring (CQE, including the two extra words of
//     CQE32 rings); nothing returned aliases ring memory.
//   - Buffers: the kernel reads and writes a request's memory until its CQE
//     is posted. Keep every buffer reachable and unchanged (for writes) until
//     its completion is reaped. Registered (fixed) buffers must stay mapped
//     until UnregisterBuffers or Close; the kernel pins their pages.
//     RegisterBuffers splits buffers over 1 GiB (the kernel's limit per
//     entry) and says which index covers which range.
//   - Errors are unix.Errno values (syscall.Errno) wrapped with context;
//     use errors.Is. A CQE's error is CQE.Err().
//
// Available says whether io_uring can be used at all (ENOSYS, or EPERM from
// kernel.io_uring_disabled, seccomp or an LSM).
//
// # The engine (Engine)
//
// OpenEngine implements store.Engine, store.BufferAllocator and
// store.MemoryRegistrar on one ring per engine.
//
// Concurrency: one goroutine, locked to its OS thread, owns the ring (so the
// ring can use SINGLE_ISSUER and DEFER_TASKRUN, and completion work always
// runs on the thread that waits). Do, Sync, RegisterMemory and Close append
// a call to a queue under Engine.mu and wait for it; concurrent callers'
// batches share the ring's queue depth, started in FIFO order. The ring
// goroutine fills up to QueueDepth SQEs, submits and waits for at least one
// completion in a single io_uring_enter, refills as completions arrive, and
// continues short transfers and EAGAIN/EINTR results. When it waits in the
// kernel with room for more, a read of an eventfd is in flight; a caller
// that enqueues work writes the eventfd to end the wait. The eventfd write
// happens under Engine.mu so that it cannot race with Close.
//
// Lock order: Engine.mu is a leaf lock (held only around queue
// manipulation and the eventfd write); pool.mu is separate and a leaf too.
//
// DoAsync is the same path without the wait: completion callbacks run on
// the ring goroutine and may start more work, which is then submitted with
// the next io_uring_enter (the benchmark keeps its queue full this way, as
// fio does). Callbacks must not block or call anything that waits for the
// ring goroutine (Do, Sync, RegisterMemory, Close).
//
// I/O whose buffer lies entirely inside a registered buffer — the engine's
// pool (AllocBuffer) or memory added by RegisterMemory — uses
// READ_FIXED/WRITE_FIXED; other I/O plain READ/WRITE. The pool is mapped
// 2 MiB-aligned with MADV_HUGEPAGE, so its buffers are physically
// contiguous where transparent huge pages are enabled: a 1 MiB request is
// then one DMA segment rather than 256 pages, which on this project's
// virtio disks is the difference between about 1.6 and 5 GB/s. The file is a fixed
// file when the kernel allows. Per-request failures go to IO.Err as wrapped
// errnos (op and offset in the message), io.ErrUnexpectedEOF for reads that
// meet the end of the file; they never stop the batch or the ring.
package uring
