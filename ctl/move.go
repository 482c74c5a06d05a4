package ctl

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/internal/fault"
	"github.com/kvfs/kvfs/store"
)

// The one path from an admitted request to the store. LOAD/STORE (v1
// entries, batch.go) and LOAD_BLOCKS/STORE_BLOCKS (block entries,
// blocks.go) differ only in how entries name their tiles. Both are
// admitted (admit) and counted (took, count) alike; once their entries
// are checked, both turn the valid ones into store requests (host memory)
// or pipeline items (CUDA memory) and move them through the functions
// here: readGroups and writeGroups, the two calls into the store; gpuMove,
// the one call into a device's pipeline; and loadOutcome and
// writeOutcome, which turn a group's result into the entry status the ABI
// reports. Every access to client memory runs under guard.

// admit starts a transfer (LOAD, STORE, LOAD_BLOCKS, STORE_BLOCKS): a
// store is refused on a read-only server (ErrReadOnly), and out starts as
// a copy of in, into which the outcomes are then written. The call's time
// runs from start (took).
func (ss *Session) admit(load bool, in, out []byte) (start time.Time, err error) {
	if !load && ss.srv.opts.ReadOnly {
		return time.Time{}, ErrReadOnly
	}
	start = time.Now()
	copy(out, in)
	return start, nil
}

// took counts the time of a transfer admitted at start, whatever its
// outcome.
func (ss *Session) took(start time.Time) { ss.srv.m.batchNs.Add(uint64(time.Since(start))) }

// count counts a transfer served: its entries refused as bad requests and
// the groups it moved.
func (ss *Session) count(load bool, bad int, moved uint64) {
	m := &ss.srv.m
	m.bad.Add(uint64(bad))
	if load {
		m.loads.Add(1)
		m.loaded.Add(moved)
	} else {
		m.stores.Add(1)
		m.stored.Add(moved)
	}
}

// guard runs f with memory faults turned into panics (fault.Guard) and
// turns a fault at an address mine claims (inside the registrations the
// call touches) into ErrFault; any other fault or panic propagates.
func (ss *Session) guard(mine func(addr uintptr) bool, f func() error) error {
	addr, faulted, err := fault.Guard(mine, f)
	if faulted {
		ss.srv.m.faults.Add(1)
		return fmt.Errorf("%w: at %#x", ErrFault, addr)
	}
	return err
}

// readGroups and writeGroups are the two calls into the store (through
// the DRAM tier when there is one, Options.Tier); the time they take is
// what the store costs, the rest of a call is the control path. A read
// lands in client memory: the caller runs it under guard, which catches
// the daemon's own accesses that fault; a read(2) of the engine's into
// that memory gets EFAULT instead, and fails the call the same way
// (ErrFault), not its groups as I/O errors of the device.
func (ss *Session) readGroups(reqs []store.ReadReq) error {
	if err := ss.readStore(reqs); err != nil {
		return err
	}
	for i := range reqs {
		if e := reqs[i].Err; e != nil && isFault(e) {
			return ss.readFault(e)
		}
	}
	return nil
}

// readStore is readGroups without its pass over the outcomes, for a caller
// that reads each request's outcome anyway: it looks for EFAULT (isFault)
// as it does, and fails the call with readFault before its next read. A
// pass of its own over a large call's requests is a pass over memory.
func (ss *Session) readStore(reqs []store.ReadReq) error {
	t0 := time.Now()
	err := ss.srv.io.Read(reqs)
	ss.srv.m.storeNs.Add(uint64(time.Since(t0)))
	return err
}

// isFault reports whether a request's error is the engine's read(2) into
// client memory that faulted.
func isFault(err error) bool { return errors.Is(err, syscall.EFAULT) }

// readFault is the call's error for a request whose read faulted (e, its
// error), counted as the daemon's own faults are.
func (ss *Session) readFault(e error) error {
	ss.srv.m.faults.Add(1)
	return fmt.Errorf("%w: %v", ErrFault, e)
}

// writeGroups writes reqs durably. The error is the store call's as a
// whole: store.ErrClosed fails the ioctl (the caller returns it); any
// other is logged here and reported per request (writeOutcome).
func (ss *Session) writeGroups(reqs []store.WriteReq) error {
	t0 := time.Now()
	err := ss.srv.io.Write(reqs)
	ss.srv.m.storeNs.Add(uint64(time.Since(t0)))
	if err != nil && !errors.Is(err, store.ErrClosed) {
		ss.srv.log.Warn("ctl: store batch failed", zap.Uint64("session", ss.id), zap.Error(err))
	}
	return err
}

// gpuSource is what loads into GPU memory read from: the DRAM tier when
// there is one and the store's file is not in memory (a store on a disk:
// hits then reach the device by DMA from the tier's memory where it is
// registered, gpus.registerHost, else through staging; no disk read), else
// the store itself, whose file in memory (tmpfs) the GPU loads straight
// from where it can (gpu.Pipeline.SetHost), which a tier in front of it
// would only take away. Stores into the store go through the tier
// whenever there is one (s.io), so that it drops the copies they replace.
func (s *Server) gpuSource() gpu.Reader {
	if s.opts.Tier != nil && !s.hostView {
		return s.opts.Tier
	}
	return s.st
}

// loadOutcome is the status of a group a load moved (err its result), and
// logs a corrupt one: the store (or the device's checker) verified it in
// memory only the daemon writes before calling it corrupt. d is the
// device of a GPU load, nil for host memory.
func (ss *Session) loadOutcome(err error, d *gpuDev) (abi.Status, abi.Detail) {
	st, det := loadStatus(err)
	if st == abi.Corrupt {
		if d != nil {
			ss.srv.log.Warn("ctl: load found a corrupt group", zap.Uint64("session", ss.id), zap.Int("device", d.ordinal), zap.Error(err))
		} else {
			ss.srv.log.Warn("ctl: load found a corrupt group", zap.Uint64("session", ss.id), zap.Error(err))
		}
	}
	return st, det
}

// writeOutcome is the status of a group a store moved: err its result,
// werr the write call's as a whole. A call that failed as a whole claims
// nothing: its groups that report no error of their own are IOError.
func writeOutcome(err, werr error) (abi.Status, abi.Detail) {
	st, det := storeStatus(err)
	if werr != nil && st == abi.OK {
		st = abi.IOError
	}
	return st, det
}

// gpuMove moves items between the store and device d through its
// pipeline's one entry point per direction (package gpu chooses the
// route): a load when load is set (tiles: items may be tiles,
// gpu.Item.Tile, built because the pipeline takes them), else a store. Outcomes are per
// item; the error is store.ErrClosed, which fails the ioctl, or nil (any
// other failure of the call as a whole is logged and left in the items).
func (ss *Session) gpuMove(d *gpuDev, items []gpu.Item, load, tiles bool) error {
	s := ss.srv
	var err error
	if load {
		err = d.pipe.Load(s.gpuSource(), items, tiles)
	} else {
		err = d.pipe.Store(s.io, items)
	}
	if errors.Is(err, store.ErrClosed) {
		return err
	}
	if err != nil {
		s.log.Warn("ctl: GPU batch failed", zap.Int("device", d.ordinal), zap.Bool("load", load), zap.Error(err))
	}
	return nil
}

func loadStatus(err error) (abi.Status, abi.Detail) {
	switch {
	case err == nil:
		return abi.OK, abi.BadNone
	case errors.Is(err, store.ErrTagMismatch):
		return abi.Absent, abi.TagMismatch
	case errors.Is(err, store.ErrNotFound):
		return abi.Absent, abi.BadNone
	case errors.Is(err, store.ErrCorrupt):
		return abi.Corrupt, abi.BadNone
	case errors.Is(err, store.ErrInvalid), errors.Is(err, store.ErrSize):
		return abi.BadRequest, abi.BadKey
	}
	return abi.IOError, abi.BadNone
}

func storeStatus(err error) (abi.Status, abi.Detail) {
	switch {
	case err == nil:
		return abi.OK, abi.BadNone
	case errors.Is(err, store.ErrFull):
		return abi.NoSpace, abi.BadNone
	case errors.Is(err, store.ErrVersion):
		// A tag or parent for a format version 1 store, which has no
		// room for them.
		return abi.BadRequest, abi.BadMeta
	case errors.Is(err, store.ErrInvalid), errors.Is(err, store.ErrSize):
		return abi.BadRequest, abi.BadKey
	}
	return abi.IOError, abi.BadNone
}
