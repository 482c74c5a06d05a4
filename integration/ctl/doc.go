// Package ctl holds end-to-end tests of the control ioctls through a real
// FUSE mount: a store mounted in-process with package fs and served by
// package ctl, driven by the Go client (in this process and in child
// processes that are killed or run as other users) and by the Python client
// (python3, when present). They need root and /dev/fuse and skip without
// them; CI provides both.
//
// KVFS_MEASURE=1 go test -run Measure -v ./integration/ctl prints the
// throughput and control-path cost figures of docs/abi.md.
package ctl
