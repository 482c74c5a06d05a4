// Package uring is the io_uring store engine: store.Engine,
// store.BufferAllocator and store.MemoryRegistrar on a regular file or a
// block device, opened O_DIRECT where the file system allows.
//
// It owns the file and how its requests become SQEs: READ/WRITE, or
// READ_FIXED/WRITE_FIXED when the buffer lies inside registered memory
// (the pool behind AllocBuffer, or RegisterMemory regions), FSYNC with
// the datasync flag (fdatasync(2) on kernels without it), the file
// registered as a fixed file where the kernel allows (on every ring: one
// driver per ring). The rings (EngineOptions.Rings, each with its
// goroutine, callers' queue and buffer table), the shared growing pool and
// failure handling are engine/internal/ringowner's (see its documentation
// for the concurrency design and the memory-safety rule on a ring
// failure).
//
// Invariants: per-request failures go to IO.Err as wrapped errnos (op and
// offset in the message), io.ErrUnexpectedEOF for reads that meet the end
// of the file; they never stop the batch or the ring. A short transfer is
// continued; under O_DIRECT one whose continuation would be unaligned is
// the end of the file.
//
// Lock order: the engine adds no lock to the owner's.
package uring
