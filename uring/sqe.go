package uring

import "unsafe"

// SQE is the first 64 bytes of a submission queue entry, laid out as the
// kernel's struct io_uring_sqe. With SQE128 another 64 bytes follow it in
// the ring (see Ring.CmdArea).
//
// The Prep* methods overwrite all 64 bytes (fields they do not name become
// zero), and Ring.GetSQE zeroes the whole entry, so no field of an earlier
// request leaks into the next one (a stale rw_flags turns READ_FIXED into
// EINVAL).
type SQE struct {
	Opcode      Opcode
	Flags       uint8
	Ioprio      uint16
	Fd          int32
	Off         uint64 // file offset; for URING_CMD: cmd_op (low 32 bits)
	Addr        uint64
	Len         uint32
	OpFlags     uint32 // rw_flags, fsync_flags, uring_cmd_flags …
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	FileIndex   int32
	Addr3       uint64
	_           uint64
}

func bufAddr(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}

// PrepNop prepares IORING_OP_NOP.
func (s *SQE) PrepNop() { *s = SQE{Opcode: OpNop, Fd: -1} }

// PrepRead prepares IORING_OP_READ of len(b) bytes at off into b. b must
// stay valid (and reachable) until the completion is reaped.
func (s *SQE) PrepRead(fd int32, b []byte, off uint64) {
	*s = SQE{Opcode: OpRead, Fd: fd, Off: off, Addr: bufAddr(b), Len: uint32(len(b))}
}

// PrepWrite prepares IORING_OP_WRITE of b at off.
func (s *SQE) PrepWrite(fd int32, b []byte, off uint64) {
	*s = SQE{Opcode: OpWrite, Fd: fd, Off: off, Addr: bufAddr(b), Len: uint32(len(b))}
}

// PrepReadFixed prepares IORING_OP_READ_FIXED: b must lie inside the
// registered buffer bufIndex.
func (s *SQE) PrepReadFixed(fd int32, b []byte, off uint64, bufIndex uint16) {
	*s = SQE{Opcode: OpReadFixed, Fd: fd, Off: off, Addr: bufAddr(b), Len: uint32(len(b)), BufIndex: bufIndex}
}

// PrepWriteFixed prepares IORING_OP_WRITE_FIXED from registered buffer
// bufIndex.
func (s *SQE) PrepWriteFixed(fd int32, b []byte, off uint64, bufIndex uint16) {
	*s = SQE{Opcode: OpWriteFixed, Fd: fd, Off: off, Addr: bufAddr(b), Len: uint32(len(b)), BufIndex: bufIndex}
}

// PrepFsync prepares IORING_OP_FSYNC; flags FsyncDatasync makes it an
// fdatasync.
func (s *SQE) PrepFsync(fd int32, flags uint32) {
	*s = SQE{Opcode: OpFsync, Fd: fd, OpFlags: flags}
}

// PrepRW prepares any read/write-shaped opcode from raw fields.
func (s *SQE) PrepRW(op Opcode, fd int32, addr uintptr, n uint32, off uint64) {
	*s = SQE{Opcode: op, Fd: fd, Off: off, Addr: uint64(addr), Len: n}
}

// SetUserData sets the value returned in the CQE.
func (s *SQE) SetUserData(u uint64) { s.UserData = u }

// SetFlags adds IOSQE_* flags (SQEFixedFile: Fd is an index into the
// registered files; SQEIOLink: the next SQE starts after this one
// completes, and is cancelled if this one fails).
func (s *SQE) SetFlags(f uint8) { s.Flags |= f }

// Cancel flags of IORING_OP_ASYNC_CANCEL (the SQE's cancel_flags).
const (
	// AsyncCancelAll cancels every request that matches, not only the
	// first (kernel 5.19).
	AsyncCancelAll uint32 = 1 << 0
	// AsyncCancelAny matches any request regardless of user_data (kernel
	// 5.19; older kernels answer EINVAL).
	AsyncCancelAny uint32 = 1 << 2
)

// PrepCancel prepares IORING_OP_ASYNC_CANCEL of the request whose user_data
// is target (or, with AsyncCancelAny, of any request). The completion's Res
// is 0 or the number cancelled, -ENOENT when none matched, -EALREADY when
// the request is running and may still complete.
func (s *SQE) PrepCancel(target uint64, flags uint32) {
	*s = SQE{Opcode: OpAsyncCancel, Fd: -1, Addr: target, OpFlags: flags}
}
