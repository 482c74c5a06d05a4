package ctl

import (
	"errors"
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
	rf := make([]byte, abi.RegisterFDSize)
	(&abi.RegisterFD{ABI: abi.Version, FD: 0}).Marshal(rf)
	f.Add(abi.CmdRegisterFD, rf, true)
	f.Add(abi.CmdUnregister, []byte{1, 0, 0, 0, 9, 0, 0, 0}, true)
	// LOOKUP, inline and in the registered buffer (near its end too).
	lk := make([]byte, abi.LookupSize+2*abi.LookupPairSize)
	(&abi.LookupHeader{ABI: abi.Version, Count: 2}).Marshal(lk)
	(&abi.LookupPair{Block: 1}).Marshal(lk[abi.LookupSize:])
	(&abi.LookupPair{Block: 1, Tag: abi.Tag{1}}).Marshal(lk[abi.LookupSize+abi.LookupPairSize:])
	f.Add(abi.CmdLookupInline, lk, true)
	for _, off := range []uint64{64, uint64(s.n - abi.LookupPairSize)} {
		lr := make([]byte, abi.LookupSize)
		(&abi.LookupHeader{ABI: abi.Version, Count: 3, Buffer: id, Offset: off}).Marshal(lr)
		f.Add(abi.CmdLookup, lr, true)
	}
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
		// REGISTER_FD reaches the server too: without a caller (Ioctl
		// passes none) it must fail whatever the bytes.
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

// FuzzOverlap drives markOverlaps with arbitrary packed and pitched tiles on
// two buffers and compares it with a byte map: an entry is refused exactly
// when one of its bytes is also another valid entry's.
func FuzzOverlap(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})                // the same tile twice
	f.Add([]byte{0, 0, 0, 64, 0, 0, 32, 0, 64, 0, 0, 0})             // interleaved heads
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 5, 0, 0, 3}) // other buffer, shifted
	const rows, rowBytes = 4, 8
	f.Fuzz(func(t *testing.T, in []byte) {
		bufs := [2]*buffer{{mem: make([]byte, 1)}, {mem: make([]byte, 1)}}
		var ents []ent
		for len(in) >= 4 && len(ents) < 64 {
			b, off, pitch, valid := in[0]&1, uint64(in[1])|uint64(in[2]&3)<<8, uint32(in[3]), in[0]&2 == 0
			in = in[4:]
			if pitch != 0 && pitch < rowBytes {
				pitch = rowBytes
			}
			e := ent{b: bufs[b], valid: valid}
			e.e.Offset, e.e.Pitch = off, pitch
			e.pitched = pitch != 0 && pitch != rowBytes
			ents = append(ents, e)
		}
		// Brute force: who owns each byte.
		type owner struct{ buf, off uint64 }
		cover := map[owner][]int{}
		for i := range ents {
			e := &ents[i]
			if !e.valid {
				continue
			}
			bi := uint64(0)
			if e.b == bufs[1] {
				bi = 1
			}
			sp := spanOf(e, rows, rowBytes)
			for r := range sp.n {
				for x := range sp.w {
					o := owner{bi, sp.start + r*sp.pitch + x}
					cover[o] = append(cover[o], i)
				}
			}
		}
		want := make([]bool, len(ents))
		for _, who := range cover {
			if len(who) > 1 {
				for _, i := range who {
					want[i] = true
				}
			}
		}
		wasValid := make([]bool, len(ents))
		for i := range ents {
			wasValid[i] = ents[i].valid
		}
		n := markOverlaps(ents, rows, rowBytes, new(scratch))
		got := 0
		for i := range ents {
			refused := wasValid[i] && !ents[i].valid
			if refused != want[i] {
				t.Fatalf("entry %d (%+v): refused %v, byte map says %v", i, ents[i].e, refused, want[i])
			}
			if refused {
				got++
				if ents[i].st != abi.BadRequest || ents[i].det != abi.BadOverlap {
					t.Fatalf("entry %d: status %v/%v", i, ents[i].st, ents[i].det)
				}
			}
		}
		if got != n {
			t.Fatalf("returned %d, refused %d", n, got)
		}
	})
}

// FuzzParseStatus feeds arbitrary /proc/<tid>/status text to parseStatus:
// no panic, and an accepted status has every field it needs.
func FuzzParseStatus(f *testing.F) {
	f.Add([]byte("Name:\tx\nTgid:\t7\nUid:\t1\t2\t3\t4\nGid:\t5\t6\t7\t8\nGroups:\t9 10 \nCapEff:\t000001ffffffffff\n"))
	f.Add([]byte("Tgid:\t1\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\nCapEff:\t0\n"))
	f.Add([]byte("Uid:\t1\t2\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseStatus(1, b)
		if err != nil {
			if !errors.Is(err, ErrCaller) {
				t.Fatalf("error %v does not wrap ErrCaller", err)
			}
			return
		}
		if c.tid != 1 {
			t.Fatalf("tid %d", c.tid)
		}
	})
}
