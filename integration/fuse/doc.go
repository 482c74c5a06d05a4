// Package fuseint holds the end-to-end tests of kvfs mount: the kvfs binary
// is built once, run as a separate daemon process on a store in a temporary
// directory, and exercised with the standard tools (ls, stat, cat, cp, dd,
// cmp, rm, getfattr) and with kill -9 and signals.
//
// The tests need root (or fusermount3) and /dev/fuse; without them they
// skip, saying so. TestMain installs the attr package (getfattr) with
// apt-get when it is missing. Run them with make test-fuse, or
// go test -race ./integration/fuse/.
//
// The daemon runs in its own process, as in production and so that a test
// never deadlocks against its own FUSE server; every test mounts on its own
// temporary directory (never /mnt/kvcache) and unmounts in t.Cleanup. What
// a user relies on is asserted through the kernel: bytes read equal bytes
// written, a corrupt group reads as EIO, a killed daemon leaves a mount
// that the next kvfs mount detaches. KVFS_MEASURE=1 runs the file-read
// measurements of docs/performance.md; they assert nothing about speed.
package fuseint
