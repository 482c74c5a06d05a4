// Package posix is the baseline store engine: pread/pwrite, one request
// at a time (queue depth 1), O_DIRECT with aligned buffers where the file
// system allows it, fdatasync for durability. It serves any regular file
// or block device and is what engine's auto selection falls back to.
//
// Invariants: Do and Sync hold Engine.mu for reading, Close for writing,
// so Close waits for requests in flight and nothing runs on a closed file;
// after Close every call fails with an error wrapping
// store.ErrEngineClosed, and a second Close returns nil.
//
// Lock order: Engine.mu is the only lock.
package posix
