package abi

import "fmt"

// RegisterCUDASize is the size of struct kvfs_register_cuda.
const RegisterCUDASize = 128

// CmdRegisterCUDA registers a range of a CUDA allocation of the caller
// (REGISTER_CUDA, 0x04).
var CmdRegisterCUDA = ioc(dirRead|dirWrite, 0x04, RegisterCUDASize)

// OpRegisterCUDA is REGISTER_CUDA. Its value is outside the iota list of
// the other operations so that list can grow without renumbering it.
const OpRegisterCUDA Op = 0x40

// RegisterCUDA is struct kvfs_register_cuda: the raw CUipcMemHandle of an
// allocation (taken at its base), the byte range inside it to register, and
// the device ordinal (as the daemon's driver numbers devices: set
// CUDA_VISIBLE_DEVICES alike, or leave it unset in both).
type RegisterCUDA struct {
	ABI      uint32
	Flags    uint32
	Handle   [64]byte // cuIpcGetMemHandle of the allocation's base
	Offset   uint64   // first registered byte, from the allocation's base
	Length   uint64   // bytes; in: > 0; out: registered
	Device   uint32   // device ordinal
	Buffer   uint32   // out: buffer id; 0 on input
	Reserved [4]uint64
}

// Offsets of struct kvfs_register_cuda.
const (
	regCUDAHandleOff = 8
	regCUDAOffsetOff = 72
	regCUDALengthOff = 80
	regCUDADeviceOff = 88
	regCUDABufferOff = 92
	regCUDAResOff    = 96
)

// Marshal encodes r into b (RegisterCUDASize bytes).
func (r *RegisterCUDA) Marshal(b []byte) {
	_ = b[RegisterCUDASize-1]
	le.PutUint32(b[0:], r.ABI)
	le.PutUint32(b[4:], r.Flags)
	copy(b[regCUDAHandleOff:regCUDAHandleOff+64], r.Handle[:])
	le.PutUint64(b[regCUDAOffsetOff:], r.Offset)
	le.PutUint64(b[regCUDALengthOff:], r.Length)
	le.PutUint32(b[regCUDADeviceOff:], r.Device)
	le.PutUint32(b[regCUDABufferOff:], r.Buffer)
	for i, v := range r.Reserved {
		le.PutUint64(b[regCUDAResOff+8*i:], v)
	}
}

// Unmarshal decodes r from b (RegisterCUDASize bytes).
func (r *RegisterCUDA) Unmarshal(b []byte) {
	_ = b[RegisterCUDASize-1]
	r.ABI = le.Uint32(b[0:])
	r.Flags = le.Uint32(b[4:])
	copy(r.Handle[:], b[regCUDAHandleOff:regCUDAHandleOff+64])
	r.Offset = le.Uint64(b[regCUDAOffsetOff:])
	r.Length = le.Uint64(b[regCUDALengthOff:])
	r.Device = le.Uint32(b[regCUDADeviceOff:])
	r.Buffer = le.Uint32(b[regCUDABufferOff:])
	for i := range r.Reserved {
		r.Reserved[i] = le.Uint64(b[regCUDAResOff+8*i:])
	}
}

// decode checks a REGISTER_CUDA request: version, flags, reserved fields,
// a nonzero length whose end does not overflow.
func (r *RegisterCUDA) decode(in []byte) error {
	r.Unmarshal(in)
	if err := checkVersion(r.ABI); err != nil {
		return err
	}
	if r.Flags != 0 {
		return fmt.Errorf("%w: register-cuda flags %#x", ErrFlags, r.Flags)
	}
	if r.Buffer != 0 || r.Reserved != [4]uint64{} {
		return fmt.Errorf("%w: in register-cuda request", ErrReserved)
	}
	if r.Length == 0 || r.Offset+r.Length < r.Offset {
		return fmt.Errorf("%w: register-cuda length %d at offset %d", ErrRange, r.Length, r.Offset)
	}
	return nil
}
