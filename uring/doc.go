// Package uring is kvfs's own io_uring binding, written on
// golang.org/x/sys/unix: the ring (setup, SQ/CQ mapping, submit and
// wait), SQEs and CQEs, buffer and file registration, and the opcode probe.
// It imports nothing of kvfs; the engines built on it live in
// engine/uring and engine/nvme, and the goroutine that owns a ring for
// them in engine/internal/ringowner.
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
// # Lock order
//
// The package has no locks: a Ring belongs to whoever created it (see
// "One submitter" above).
package uring
