package ctl

import (
	"encoding/binary"
	"fmt"

	"github.com/kvfs/kvfs/ctl/abi"
)

// serve is the one table of the control ioctls: it maps a decoded
// request's operation to the function that serves it (issued by thread
// tid; in and out are the ioctl's argument bytes, out filled completely on
// success). The result is what the ioctl returns: 0, or for the batched
// loads and stores the number of entries with status OK. An operation with
// no entry fails with abi.ErrCommand (ENOTTY); the decoder refuses unknown
// commands before that.
//
// A switch rather than an array of functions: a call through a function
// value makes the request (over 4 KiB, for REGISTER_HOST's path) escape to
// the heap, an allocation per ioctl on the LOAD path; static calls keep it
// on the caller's stack.
func (ss *Session) serve(tid uint32, req *abi.Request, in, out []byte) (int32, error) {
	switch req.Op {
	case abi.OpInfo:
		return opInfo(ss, out)
	case abi.OpRegisterHost:
		return opRegisterHost(ss, tid, req, out)
	case abi.OpRegisterFD:
		return opRegisterFD(ss, tid, req, out)
	case abi.OpRegisterCUDA:
		return opRegisterCUDA(ss, tid, req, out)
	case abi.OpUnregister:
		return 0, ss.unregister(req.Unregister.Buffer)
	case abi.OpLoad, abi.OpStore:
		return ss.batch(req, in, out)
	case abi.OpRegisterTarget:
		return opRegisterTarget(ss, req, in, out)
	case abi.OpUnregisterTarget:
		return 0, ss.unregisterTarget(req.Blocks.UnregisterTarget.Target)
	case abi.OpLoadBlocks, abi.OpStoreBlocks:
		return ss.blocks(req, in, out)
	case abi.OpLookup:
		return ss.lookup(req, in, out)
	}
	return 0, fmt.Errorf("%w: op %v", abi.ErrCommand, req.Op)
}

func opInfo(ss *Session, out []byte) (int32, error) {
	i := ss.srv.info()
	i.Marshal(out)
	return 0, nil
}

func opRegisterHost(ss *Session, tid uint32, req *abi.Request, out []byte) (int32, error) {
	reg, err := ss.registerHost(tid, req.Path, req.Register.Length)
	if err != nil {
		return 0, err
	}
	r := req.Register
	r.Buffer, r.Length = reg.id, uint64(reg.n)
	r.Marshal(out)
	return 0, nil
}

func opRegisterFD(ss *Session, tid uint32, req *abi.Request, out []byte) (int32, error) {
	reg, err := ss.registerFD(tid, req.RegisterFD.FD, req.RegisterFD.Length)
	if err != nil {
		return 0, err
	}
	r := req.RegisterFD
	r.Buffer, r.Length = reg.id, uint64(reg.n)
	if reg.pinned {
		r.Pinned = 1
	}
	r.Marshal(out)
	return 0, nil
}

func opRegisterCUDA(ss *Session, tid uint32, req *abi.Request, out []byte) (int32, error) {
	reg, err := ss.registerCUDA(tid, &req.RegisterCUDA)
	if err != nil {
		return 0, err
	}
	r := req.RegisterCUDA
	r.Buffer, r.Length = reg.id, uint64(reg.n)
	r.Marshal(out)
	return 0, nil
}

func opRegisterTarget(ss *Session, req *abi.Request, in, out []byte) (int32, error) {
	id, err := ss.registerTarget(req.Blocks.Target)
	if err != nil {
		return 0, err
	}
	copy(out, in)
	binary.LittleEndian.PutUint32(out[abi.TargetOutOff:], id)
	return 0, nil
}
