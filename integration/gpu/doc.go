// Package gpu holds the device tests of the GPU path: a store mounted in
// the test process (the daemon) moves blocks to and from GPU memory that a
// separate client process allocated and exported with cuIpcGetMemHandle
// (CUDA refuses to open a handle in the process that exported it). The
// test binary doubles as that client (KVFS_GPU_HELPER). The tests need
// root, /dev/fuse and a CUDA device, and skip cleanly without them; build
// them for a machine without Go with CGO_ENABLED=0 go test -c.
package gpu
