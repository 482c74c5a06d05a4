// Package engine chooses and opens the I/O engine a kvfs store runs on
// (posix, uring or nvme), formats a store at a path through it (FormatPath,
// which calls store.Format) and opens a store on it (OpenStore) for the
// command-line tools and the mount.
//
// The engines live beside it, each implementing store.Engine (the seam the
// store defines; the store knows no engine):
//
//   - engine/posix: pread/pwrite at queue depth 1, fdatasync.
//   - engine/uring: io_uring READ/WRITE(_FIXED) and FSYNC on a file or
//     block device.
//   - engine/nvme: NVMe commands as io_uring URING_CMDs on a namespace's
//     char device, FDP placement per stream, Flush.
//   - engine/internal/ringowner: the one ring owner both ring engines run
//     on (the ring goroutine, the callers' queue, completion, retries, the
//     fixed-buffer table, the buffer pool, and failure handling), and
//     Rings: N such rings per engine (Options.Rings; 0 = one per 4 usable
//     cores, AutoRings), callers spread over them, one growing pool
//     registered on all of them.
//
// Every engine wraps store.ErrEngineClosed after Close (prefixed with its
// name), and a second Close returns nil.
//
// Selection: an explicit kind is opened or fails with the reason. "auto"
// tries, in order, nvme (the path is an NVMe namespace and passthrough
// works), uring (io_uring is available and the engine opens) and posix,
// which always serves a regular file or block device. Each kind passed over
// is logged with one line saying why.
//
// OpenStore takes the store's process lock (store.Lock) before opening the
// engine, and its close function releases in the reverse order: store,
// engine, lock. The package keeps no global state besides the backend
// table, which only tests replace.
package engine
