package uring

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FixedBuffer is one entry of the registered buffer table.
type FixedBuffer struct {
	Index  uint16 // buf_index for READ_FIXED / WRITE_FIXED
	Buf    []byte // the memory this entry covers
	Source int    // which caller buffer it came from
	Offset int    // where Buf starts inside that buffer
}

// Contains reports whether b lies entirely inside the entry.
func (f FixedBuffer) Contains(b []byte) bool {
	if len(b) == 0 || len(f.Buf) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&f.Buf[0]))
	p := uintptr(unsafe.Pointer(&b[0]))
	return p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(f.Buf))
}

// SplitBuffers cuts each buffer into pieces of at most MaxFixedBuffer
// bytes (the kernel's limit for one fixed buffer) and numbers them from
// first. Empty buffers give no entry.
func SplitBuffers(bufs [][]byte, first int) []FixedBuffer {
	var out []FixedBuffer
	idx := first
	for src, b := range bufs {
		for off := 0; off < len(b); off += MaxFixedBuffer {
			end := min(off+MaxFixedBuffer, len(b))
			out = append(out, FixedBuffer{Index: uint16(idx), Buf: b[off:end:end], Source: src, Offset: off})
			idx++
		}
	}
	return out
}

func iovecs(pieces []FixedBuffer) []unix.Iovec {
	iov := make([]unix.Iovec, len(pieces))
	for i, p := range pieces {
		if len(p.Buf) > 0 {
			iov[i].Base = &p.Buf[0]
			iov[i].SetLen(len(p.Buf))
		}
	}
	return iov
}

// RegisterBuffers registers bufs as the ring's fixed buffer table (pinning
// their pages; it needs RLIMIT_MEMLOCK room for non-root users). Buffers
// over 1 GiB are split; the result says which index covers which range.
// The memory must stay mapped, and must not be freed or reused for other
// purposes, until UnregisterBuffers (or Close) returns; memory outside the
// Go heap (mmap) is the safe choice.
func (r *Ring) RegisterBuffers(bufs [][]byte) ([]FixedBuffer, error) {
	pieces := SplitBuffers(bufs, 0)
	if len(pieces) == 0 {
		return nil, fmt.Errorf("uring: register no buffers: %w", unix.EINVAL)
	}
	iov := iovecs(pieces)
	_, err := sysRegister(r.fd, regBuffers, unsafe.Pointer(&iov[0]), uint32(len(iov)))
	runtime.KeepAlive(bufs)
	if err != nil {
		return nil, fmt.Errorf("uring: register %d buffers: %w", len(iov), err)
	}
	return pieces, nil
}

// RegisterBuffersSparse registers an empty fixed buffer table of n slots
// (kernel ≥ 5.19), to be filled with UpdateBuffers.
func (r *Ring) RegisterBuffersSparse(n int) error {
	arg := rsrcRegister{Nr: uint32(n), Flags: rsrcRegisterSparse}
	_, err := sysRegister(r.fd, regBuffers2, unsafe.Pointer(&arg), uint32(unsafe.Sizeof(arg)))
	if err != nil {
		return fmt.Errorf("uring: register sparse buffer table of %d: %w", n, err)
	}
	return nil
}

// UpdateBuffers replaces the table slots pieces[i].Index with pieces[i].Buf
// (an empty Buf clears the slot), without disturbing other slots or
// requests in flight (the kernel keeps a replaced buffer pinned until the
// requests using it complete). The indexes must be consecutive.
func (r *Ring) UpdateBuffers(pieces []FixedBuffer) error {
	if len(pieces) == 0 {
		return nil
	}
	for i := range pieces {
		if pieces[i].Index != pieces[0].Index+uint16(i) {
			return fmt.Errorf("uring: buffer update with non-consecutive indexes: %w", unix.EINVAL)
		}
	}
	iov := iovecs(pieces)
	arg := rsrcUpdate2{Offset: uint32(pieces[0].Index), Data: uint64(uintptr(unsafe.Pointer(&iov[0]))), Nr: uint32(len(iov))}
	_, err := sysRegister(r.fd, regBuffersUpdate, unsafe.Pointer(&arg), uint32(unsafe.Sizeof(arg)))
	runtime.KeepAlive(iov)
	runtime.KeepAlive(pieces)
	if err != nil {
		return fmt.Errorf("uring: update buffers %d..%d: %w", pieces[0].Index, int(pieces[0].Index)+len(pieces)-1, err)
	}
	return nil
}

// UnregisterBuffers drops the fixed buffer table.
func (r *Ring) UnregisterBuffers() error {
	if _, err := sysRegister(r.fd, unregBuffers, nil, 0); err != nil {
		return fmt.Errorf("uring: unregister buffers: %w", err)
	}
	return nil
}

// RegisterFiles registers fds as the fixed file table: an SQE with
// SQEFixedFile uses the index in fds instead of a descriptor.
func (r *Ring) RegisterFiles(fds []int) error {
	if len(fds) == 0 {
		return fmt.Errorf("uring: register no files: %w", unix.EINVAL)
	}
	f32 := make([]int32, len(fds))
	for i, fd := range fds {
		f32[i] = int32(fd)
	}
	if _, err := sysRegister(r.fd, regFiles, unsafe.Pointer(&f32[0]), uint32(len(f32))); err != nil {
		return fmt.Errorf("uring: register %d files: %w", len(fds), err)
	}
	return nil
}

// UnregisterFiles drops the fixed file table.
func (r *Ring) UnregisterFiles() error {
	if _, err := sysRegister(r.fd, unregFiles, nil, 0); err != nil {
		return fmt.Errorf("uring: unregister files: %w", err)
	}
	return nil
}

// ProbeResult says which opcodes the running kernel supports.
type ProbeResult struct {
	LastOp    Opcode // highest opcode the kernel knows
	supported [256]bool
}

// Supported reports whether op is supported.
func (p *ProbeResult) Supported(op Opcode) bool { return p.supported[op] }

// Ops lists the supported opcodes.
func (p *ProbeResult) Ops() []Opcode {
	var out []Opcode
	for i, ok := range p.supported {
		if ok {
			out = append(out, Opcode(i))
		}
	}
	return out
}

// Probe asks the kernel which opcodes it supports (IORING_REGISTER_PROBE,
// kernel ≥ 5.6).
func (r *Ring) Probe() (*ProbeResult, error) {
	const nOps = 256
	buf := make([]byte, unsafe.Sizeof(probeHdr{})+nOps*unsafe.Sizeof(probeOp{}))
	if _, err := sysRegister(r.fd, regProbe, unsafe.Pointer(&buf[0]), nOps); err != nil {
		return nil, fmt.Errorf("uring: probe: %w", err)
	}
	hdr := (*probeHdr)(unsafe.Pointer(&buf[0]))
	ops := unsafe.Slice((*probeOp)(unsafe.Pointer(&buf[unsafe.Sizeof(probeHdr{})])), nOps)
	res := &ProbeResult{LastOp: Opcode(hdr.LastOp)}
	for i := 0; i < int(hdr.OpsLen) && i < nOps; i++ {
		if ops[i].Flags&probeOpSupported != 0 {
			res.supported[ops[i].Op] = true
		}
	}
	return res, nil
}
