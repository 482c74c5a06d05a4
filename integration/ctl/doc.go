// Package ctl holds end-to-end tests of the control ioctls through a real
// FUSE mount: a store mounted in-process with package fs and served by
// package ctl, driven by the Go client (in this process and in child
// processes that are killed or run as other users) and by the Python client
// (python3, when present). They need root and /dev/fuse and skip without
// them; CI provides both.
//
// Each test mounts its own store in a temporary directory and unmounts it in
// t.Cleanup; child processes are started from this test binary (TestMain
// dispatches them) and killed at the end. Clients that break the rules
// (unregistering mid-load, shrinking a registered file, other users) must
// get an error while the daemon keeps serving the others.
//
// KVFS_MEASURE=1 go test -run Measure -v ./integration/ctl prints the
// throughput and control-path cost figures recorded in docs/abi.md and
// docs/performance.md; those are measurements, never assertions.
package ctl
