// Package fuseint holds the end-to-end tests of kvfs mount: the kvfs binary
// is built once, run as a separate daemon process on a store in a temporary
// directory, and exercised with the standard tools (ls, stat, cat, cp, dd,
// cmp, rm, getfattr) and with kill -9 and signals.
//
// The tests need root (or fusermount3) and /dev/fuse; without them they
// skip, saying so. TestMain installs the attr package (getfattr) with
// apt-get when it is missing. Run them with make test-fuse, or
// go test -race ./integration/fuse/.
package fuseint
