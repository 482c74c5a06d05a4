package ctl

import (
	"math/rand/v2"
	"testing"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/layout"
)

// FuzzIoctl sends arbitrary commands and bytes to a session that has a
// registered buffer with guard bytes after it. Nothing may panic, the guard
// must stay intact, and no ioctl may touch the buffer outside the tiles of
// entries it reports as done (checked coarsely: a rejected ioctl changes
// nothing).
func FuzzIoctl(f *testing.F) {
	fx := newFixture(f, 8, Options{})
	fx.put(blockKeys(1), 1)
	ss := fx.open(0, 0)
	s := newShm(f, 16*fx.gb, 8192)
	id := mustRegister(f, ss, s)

	valid := []abi.Entry{
		entry(layout.Key{Block: 1}, id, 0, 0),
		entry(layout.Key{Block: 1, Layer: 1, Head: 3, Kind: 1}, id, uint64(s.n-fx.gb), 0),
		entry(layout.Key{Block: 1, Head: 2}, id, 100, 33),
		entry(layout.Key{Block: 2}, id, 512, 0),
	}
	// Inputs are short; pad makes them the command's size (the kernel
	// always passes exactly that), !pad passes them as they are.
	used := abi.BatchHeaderSize + len(valid)*abi.EntrySize
	for _, load := range []bool{true, false} {
		for _, small := range []bool{true, false} {
			cmd, in := encodeBatch(load, small, valid)
			f.Add(cmd, in[:used], true)
		}
	}
	f.Add(abi.CmdInfo, []byte(nil), true)
	f.Add(abi.CmdUnregister, []byte{1, 0, 0, 0, 9, 0, 0, 0}, true)
	junk := make([]byte, 200)
	for i := range junk {
		junk[i] = byte(rand.Uint32())
	}
	f.Add(abi.CmdLoad, junk, true)
	f.Add(abi.CmdStore, junk, false)

	f.Fuzz(func(t *testing.T, cmd uint32, in []byte, pad bool) {
		if cmd == abi.CmdUnregister || cmd == abi.CmdRegisterHost {
			return // keep the one registration; registration has its own tests
		}
		outLen := 0
		if abi.IoctlDir(cmd)&2 != 0 {
			outLen = abi.IoctlSize(cmd)
		}
		if pad {
			n := 0
			if abi.IoctlDir(cmd)&1 != 0 {
				n = abi.IoctlSize(cmd)
			}
			in = append(in, make([]byte, max(0, n-len(in)))...)[:n]
		}
		before := append([]byte(nil), s.mem[:s.n]...)
		_, errno := ss.Ioctl(cmd, in, make([]byte, outLen))
		s.checkGuard(t)
		if errno != 0 && string(before) != string(s.mem[:s.n]) {
			t.Fatalf("rejected ioctl %#x (%v) changed the buffer", cmd, errno)
		}
	})
}
