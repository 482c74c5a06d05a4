package abi

import (
	"bytes"
	"errors"
	"math"
	"math/big"
	"testing"
)

func TestDecodeErrors(t *testing.T) {
	batch := func(fn func(b []byte)) []byte {
		b := make([]byte, BatchSize)
		(&BatchHeader{ABI: Version, Count: 2}).Marshal(b)
		if fn != nil {
			fn(b)
		}
		return b
	}
	reg := func(fn func(r *RegisterHost)) []byte {
		r := RegisterHost{ABI: Version}
		r.SetPath("/dev/shm/x")
		if fn != nil {
			fn(&r)
		}
		b := make([]byte, RegisterHostSize)
		r.Marshal(b)
		return b
	}
	for _, c := range []struct {
		name string
		cmd  uint32
		in   []byte
		out  int
		want error
	}{
		{"ok batch", CmdLoad, batch(nil), BatchSize, nil},
		{"ok store", CmdStore, batch(nil), BatchSize, nil},
		{"ok info", CmdInfo, nil, InfoSize, nil},
		{"ok register", CmdRegisterHost, reg(nil), RegisterHostSize, nil},
		{"ok unregister", CmdUnregister, []byte{1, 0, 0, 0, 5, 0, 0, 0}, 0, nil},
		{"unknown", 0x1234, nil, 0, ErrCommand},
		{"unknown nr", CmdLoad + 1<<16, batch(nil), BatchSize, ErrCommand},
		{"in size", CmdLoad, batch(nil)[:100], BatchSize, ErrSize},
		{"out size", CmdLoad, batch(nil), 0, ErrSize},
		{"info in", CmdInfo, make([]byte, InfoSize), InfoSize, ErrSize},
		{"unregister out", CmdUnregister, make([]byte, 8), 8, ErrSize},
		{"version", CmdLoad, batch(func(b []byte) { b[0] = 0 }), BatchSize, ErrVersion},
		{"count", CmdLoad, batch(func(b []byte) { le.PutUint32(b[4:], BatchMax+1) }), BatchSize, ErrCount},
		{"count huge", CmdLoad, batch(func(b []byte) { le.PutUint32(b[4:], math.MaxUint32) }), BatchSize, ErrCount},
		{"flags", CmdStore, batch(func(b []byte) { b[11] = 0x80 }), BatchSize, ErrFlags},
		{"register version", CmdRegisterHost, reg(func(r *RegisterHost) { r.ABI = 0 }), RegisterHostSize, ErrVersion},
		{"register flags", CmdRegisterHost, reg(func(r *RegisterHost) { r.Flags = 2 }), RegisterHostSize, ErrFlags},
		{"register reserved", CmdRegisterHost, reg(func(r *RegisterHost) { r.Reserved0 = 2 }), RegisterHostSize, ErrReserved},
		{"register path empty", CmdRegisterHost, reg(func(r *RegisterHost) { r.Path[0] = 0 }), RegisterHostSize, ErrPath},
		{"register path relative", CmdRegisterHost, reg(func(r *RegisterHost) { r.SetPath("x") }), RegisterHostSize, ErrPath},
		{"register path unterminated", CmdRegisterHost, reg(func(r *RegisterHost) {
			for i := range r.Path {
				r.Path[i] = '/'
			}
		}), RegisterHostSize, ErrPath},
		{"unregister version", CmdUnregister, []byte{2, 0, 0, 0, 5, 0, 0, 0}, 0, ErrVersion},
	} {
		r, err := Decode(c.cmd, c.in, c.out)
		if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if err == nil && (r.Op == OpLoad || r.Op == OpStore) && len(r.Entries) != 2*EntrySize {
			t.Errorf("%s: %d entry bytes", c.name, len(r.Entries))
		}
	}
}

var testTile = Tile{Layers: 32, KVHeads: 8, Rows: 16, RowBytes: 256}

func TestCheck(t *testing.T) {
	const gb = 16 * 256
	for _, c := range []struct {
		name   string
		e      Entry
		bufLen uint64
		known  bool
		want   error
		extent uint64
	}{
		{"packed", Entry{Offset: 0}, gb, true, nil, gb},
		{"packed at end", Entry{Offset: 10}, gb + 10, true, nil, gb},
		{"pitch = row", Entry{Pitch: 256}, gb, true, nil, gb},
		{"pitched", Entry{Pitch: 1000, Offset: 5}, 5 + 15*1000 + 256, true, nil, 15*1000 + 256},
		{"pitched one short", Entry{Pitch: 1000, Offset: 5}, 5 + 15*1000 + 255, true, ErrRange, 0},
		{"one short", Entry{Offset: 1}, gb, true, ErrRange, 0},
		{"offset beyond", Entry{Offset: gb + 1}, gb, true, ErrRange, 0},
		{"offset max", Entry{Offset: math.MaxUint64}, math.MaxUint64, true, ErrRange, 0},
		{"offset max, huge buffer", Entry{Offset: math.MaxUint64 - gb}, math.MaxUint64, true, nil, gb},
		{"pitch max", Entry{Pitch: math.MaxUint32}, 1 << 40, true, nil, 15*math.MaxUint32 + 256},
		{"pitch max, small buffer", Entry{Pitch: math.MaxUint32}, 1 << 30, true, ErrRange, 0},
		{"pitch small", Entry{Pitch: 255}, 1 << 30, true, ErrPitch, 0},
		{"unknown buffer", Entry{}, 0, false, ErrBuffer, 0},
		{"layer", Entry{Layer: 32}, gb, true, ErrKey, 0},
		{"head", Entry{Head: 8}, gb, true, ErrKey, 0},
		{"kind", Entry{Kind: 2}, gb, true, ErrKey, 0},
		{"reserved", Entry{Reserved: 1}, gb, true, ErrReserved, 0},
		{"key before buffer", Entry{Layer: 99}, 0, false, ErrKey, 0},
	} {
		ext, err := testTile.Check(&c.e, c.bufLen, c.known)
		if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
			continue
		}
		if err == nil && ext != c.extent {
			t.Errorf("%s: extent %d, want %d", c.name, ext, c.extent)
		}
		if d := DetailOf(err); (err == nil) != (d == BadNone) {
			t.Errorf("%s: detail %v", c.name, d)
		}
	}
}

// FuzzDecode feeds arbitrary commands and argument bytes to the decoder:
// it must never panic, and what it accepts must be self-consistent.
func FuzzDecode(f *testing.F) {
	b := make([]byte, BatchSize)
	(&BatchHeader{ABI: Version, Count: 3}).Marshal(b)
	f.Add(CmdLoad, b, BatchSize)
	f.Add(CmdStoreSmall, b[:BatchSmallSz], BatchSmallSz)
	r := make([]byte, RegisterHostSize)
	(&RegisterHost{ABI: Version}).Marshal(r)
	copy(r[32:], "/dev/shm/a\x00")
	f.Add(CmdRegisterHost, r, RegisterHostSize)
	f.Add(CmdUnregister, []byte{1, 0, 0, 0, 1, 0, 0, 0}, 0)
	rf := make([]byte, RegisterFDSize)
	(&RegisterFD{ABI: Version, FD: 3}).Marshal(rf)
	f.Add(CmdRegisterFD, rf, RegisterFDSize)
	f.Add(CmdInfo, []byte(nil), InfoSize)
	f.Add(uint32(0xdeadbeef), []byte("garbage"), 7)
	f.Fuzz(func(t *testing.T, cmd uint32, in []byte, outLen int) {
		req, err := Decode(cmd, in, outLen)
		if err != nil {
			return
		}
		if req.Size > MaxIoctlSize || (req.In && len(in) != req.Size) || (req.Out && outLen != req.Size) {
			t.Fatalf("accepted sizes in %d out %d for %+v", len(in), outLen, req.Command)
		}
		switch req.Op {
		case OpLoad, OpStore:
			if req.Header.ABI != Version || req.Header.Flags != 0 || int(req.Header.Count) > req.Max ||
				len(req.Entries) != int(req.Header.Count)*EntrySize {
				t.Fatalf("accepted batch %+v with %d entry bytes", req.Header, len(req.Entries))
			}
			for i := 0; i < len(req.Entries) && i < 64*EntrySize; i += EntrySize {
				var e Entry
				e.Unmarshal(req.Entries[i:])
				checkInvariant(t, &e, uint64(len(in))*1000003)
			}
		case OpRegisterHost:
			if req.Path == "" || req.Path[0] != '/' || len(req.Path) >= PathMax {
				t.Fatalf("accepted path %q", req.Path)
			}
		case OpRegisterFD:
			checkRegisterFD(t, &req.RegisterFD)
		}
	})
}

func checkRegisterFD(t *testing.T, q *RegisterFD) {
	if q.ABI != Version || q.Flags != 0 || q.Buffer != 0 || q.Pinned != 0 || q.Reserved0 != 0 ||
		q.Reserved != [4]uint64{} || q.FD < 0 {
		t.Fatalf("accepted register-fd %+v", *q)
	}
}

// FuzzRegisterFD decodes arbitrary REGISTER_FD arguments (of the right
// size, which is what the kernel passes): whatever is accepted has every
// checked field right, and encoding it again gives the same bytes.
func FuzzRegisterFD(f *testing.F) {
	b := make([]byte, RegisterFDSize)
	(&RegisterFD{ABI: Version, FD: 7, Length: 1 << 20}).Marshal(b)
	f.Add(b)
	(&RegisterFD{ABI: Version, FD: -1, Length: math.MaxUint64}).Marshal(b)
	f.Add(b)
	f.Add(make([]byte, 3))
	f.Fuzz(func(t *testing.T, in []byte) {
		in = append(in, make([]byte, max(0, RegisterFDSize-len(in)))...)[:RegisterFDSize]
		req, err := Decode(CmdRegisterFD, in, RegisterFDSize)
		if err != nil {
			if !errors.Is(err, ErrVersion) && !errors.Is(err, ErrFlags) && !errors.Is(err, ErrReserved) && !errors.Is(err, ErrFD) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		checkRegisterFD(t, &req.RegisterFD)
		out := make([]byte, RegisterFDSize)
		req.RegisterFD.Marshal(out)
		if !bytes.Equal(out, in) {
			t.Fatal("re-encoding differs")
		}
	})
}

// checkInvariant: whenever Check accepts, offset + extent ≤ bufLen in exact
// integers, the extent covers every row, and the key is in range.
func checkInvariant(t *testing.T, e *Entry, bufLen uint64) {
	ext, err := testTile.Check(e, bufLen, true)
	if err != nil {
		return
	}
	end := new(big.Int).Add(new(big.Int).SetUint64(e.Offset), new(big.Int).SetUint64(ext))
	if end.Cmp(new(big.Int).SetUint64(bufLen)) > 0 {
		t.Fatalf("accepted %+v: end %v beyond %d", e, end, bufLen)
	}
	pitch := uint64(e.Pitch)
	if pitch == 0 {
		pitch = uint64(testTile.RowBytes)
	}
	last := new(big.Int).Mul(big.NewInt(int64(testTile.Rows-1)), new(big.Int).SetUint64(pitch))
	last.Add(last, big.NewInt(int64(testTile.RowBytes)))
	if last.Cmp(new(big.Int).SetUint64(ext)) != 0 || pitch < uint64(testTile.RowBytes) {
		t.Fatalf("accepted %+v: extent %d, rows need %v", e, ext, last)
	}
	if uint32(e.Layer) >= testTile.Layers || uint32(e.Head) >= testTile.KVHeads || e.Kind > 1 || e.Reserved != 0 {
		t.Fatalf("accepted key %+v", e)
	}
}

// FuzzCheck drives the entry check with arbitrary fields and buffer lengths.
func FuzzCheck(f *testing.F) {
	f.Add(uint64(0), uint32(0), uint16(0), uint16(0), uint8(0), uint64(4096))
	f.Add(uint64(math.MaxUint64-100), uint32(math.MaxUint32), uint16(3), uint16(7), uint8(1), uint64(math.MaxUint64))
	f.Add(uint64(1<<40), uint32(300), uint16(31), uint16(7), uint8(0), uint64(1<<41))
	f.Fuzz(func(t *testing.T, off uint64, pitch uint32, layer, head uint16, kind uint8, bufLen uint64) {
		e := Entry{Offset: off, Pitch: pitch, Layer: layer, Head: head, Kind: kind}
		checkInvariant(t, &e, bufLen)
	})
}
