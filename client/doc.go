// Package client is the Go client of the kvfs control ioctls (docs/abi.md):
// open a mount's .kvfs/ctl, register host memory (a file of /dev/shm that
// the caller maps too), and load or store many KV-cache groups per ioctl
// straight between the store and that memory.
//
//	c, err := client.Open("/mnt/kvcache")
//	buf, err := c.NewHostBuffer("", 64<<20) // creates, maps and registers /dev/shm/kvfs-…
//	st, err := c.Load([]client.Entry{{Key: k, Buffer: buf.ID, Offset: 0}})
//
// It also owns the requests-file format of kvfs load (ParseRequests,
// PlaceRequests; the format is described in requests.go).
//
// The package does not link the CUDA binding: the calls that need the CUDA
// driver in the client's process (page-locking a HostBuffer) are in
// client/cudaclient. Registering GPU memory (RegisterCUDA, RegisterTarget)
// takes IPC handles the caller got from its own CUDA, and needs none here.
//
// Invariants:
//
//   - Open refuses a daemon of another ABI version (ErrVersion) before any
//     other ioctl.
//   - Batch sends at most abi.BatchMax entries per ioctl (up to MaxInFlight
//     ioctls at once) and, when every ioctl succeeds, a status for every
//     entry, in order. A failed ioctl is an *Error with its errno, and the
//     statuses of the entries it carried are left as they were: a caller
//     reads statuses only after a nil error.
//   - Registrations belong to the Client's open file and vanish when it is
//     closed (or the process dies); a HostBuffer's Close unregisters, unmaps
//     and (for buffers it created) removes its file.
//
// A Client is safe for concurrent use; concurrent Loads run in parallel in
// the daemon. Client.mu is held shared around every ioctl and exclusively by
// Close, so no ioctl reaches a descriptor number reused after Close; it is
// the package's only lock.
package client
