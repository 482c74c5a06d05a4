// Package engine chooses and opens the I/O engine a kvfs store runs on
// (posix, uring or nvme) and opens a store on it for the command-line tools
// and the mount.
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
