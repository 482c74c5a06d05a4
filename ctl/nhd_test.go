package ctl

import (
	"bytes"
	"encoding/binary"
	"sync"
	"testing"
	"unsafe"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// landing wraps a Mem engine and counts the bytes every read lands inside
// [lo, hi) (the client's mapping) and elsewhere (daemon memory).
type landing struct {
	*storetest.Mem
	mu             sync.Mutex
	lo, hi         uintptr
	inside, beside int
}

// watch makes [lo, hi) the daemon's mapping of registered buffer id of ss
// and zeroes the counts.
func (l *landing) watch(ss *Session, id uint32) {
	ss.mu.Lock()
	dm := ss.mu.bufs[id].mem
	ss.mu.Unlock()
	l.mu.Lock()
	l.lo = uintptr(unsafe.Pointer(&dm[0]))
	l.hi = l.lo + uintptr(len(dm))
	l.inside, l.beside = 0, 0
	l.mu.Unlock()
}

func (l *landing) Do(ios []store.IO) error {
	l.mu.Lock()
	for i := range ios {
		if ios[i].Op != store.OpRead {
			continue
		}
		segs := ios[i].Vec
		if segs == nil {
			segs = [][]byte{ios[i].Buf}
		}
		for _, v := range segs {
			p := uintptr(unsafe.Pointer(unsafe.SliceData(v)))
			if p >= l.lo && p+uintptr(len(v)) <= l.hi {
				l.inside += len(v)
			} else {
				l.beside += len(v)
			}
		}
	}
	l.mu.Unlock()
	return l.Mem.Do(ios)
}

// TestLoadNHDNoBounce: a LOAD into a token-major (NHD) cache, rows of
// 512 bytes and the store's ScatterMin at 512, lands every byte straight in
// the client's mapping (vector reads; nothing read into daemon memory, no
// copy), every tile byte right and every byte between tiles untouched; the
// same for LOAD_BLOCKS (ABI v2) into an NHD target.
func TestLoadNHDNoBounce(t *testing.T) {
	geo := layout.Geometry{Layers: 2, KVHeads: 4, HeadDim: 256, BlockTokens: 16, DType: layout.BF16, Align: 512}
	m := storetest.Formatted(t, geo, 4, 512)
	m.SetVectorReads(true)
	eng := &landing{Mem: m}
	st := storetest.Open(t, eng, store.Options{ScatterMin: 512})
	n, gb, rb := geo.GroupsPerBlock(), geo.GroupBytes(), geo.RowBytes()
	data := make([][]byte, n)
	w := make([]store.WriteReq, n)
	for i := range w {
		data[i] = bytes.Repeat([]byte{byte(i + 1)}, gb)
		for j := range data[i] {
			data[i][j] ^= byte(j / rb)
		}
		w[i] = store.WriteReq{Key: geo.KeyAt(9, i), Data: data[i]}
	}
	if err := st.Write(w); err != nil {
		t.Fatal(err)
	}
	srv := NewServer(st, Options{})
	defer srv.Close()
	ss, errno := srv.Open(0, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	defer ss.Release()
	sh := newShm(t, n*gb, 4096)
	id := mustRegister(t, ss, sh)
	for i := range sh.n {
		sh.mem[i] = 0x5A
	}
	pitch := geo.KVHeads * rb
	es := make([]abi.Entry, 0, n)
	want := bytes.Repeat([]byte{0x5A}, sh.n)
	for i := range n {
		k := geo.KeyAt(9, i)
		if k.Head == 2 {
			continue // its rows stay as they were
		}
		off := (k.Layer*2+int(k.Kind))*gb*geo.KVHeads + k.Head*rb
		es = append(es, entry(k, id, uint64(off), uint32(pitch)))
		for r := range geo.BlockTokens {
			copy(want[off+r*pitch:], data[i][r*rb:(r+1)*rb])
		}
	}
	// The daemon's own mapping of the registered file.
	eng.watch(ss, id)
	before := st.Metrics().Bounced
	got := mustBatch(t, ss, true, es)
	for i := range got {
		if got[i].Status != abi.OK {
			t.Fatalf("entry %d: status %v", i, got[i].Status)
		}
	}
	if !bytes.Equal(sh.mem[:sh.n], want) {
		t.Fatal("the cache differs from the groups scattered by hand")
	}
	sh.checkGuard(t)
	if eng.beside != 0 || eng.inside != len(es)*gb {
		t.Fatalf("reads landed %d bytes in the mapping, %d in daemon memory; want %d and 0", eng.inside, eng.beside, len(es)*gb)
	}
	if b := st.Metrics().Bounced - before; b != 0 {
		t.Fatalf("%d bytes copied from bounce memory", b)
	}

	// The same through ABI v2: LOAD_BLOCKS of the whole block into cache
	// block 1 of a two-block NHD target, the entry array in another
	// registered buffer.
	const nb = 2
	T, H := geo.BlockTokens, geo.KVHeads
	tensor := nb * T * H * rb
	tsh := newShm(t, 2*geo.Layers*tensor, 4096)
	tid := mustRegister(t, ss, tsh)
	for i := range tsh.n {
		tsh.mem[i] = 0x5A
	}
	tg := &abi.Target{ABI: abi.Version, NumBlocks: nb, RowBytes: uint32(rb), LayerCount: uint16(geo.Layers), HeadCount: uint16(H),
		BlockStride: uint64(T * H * rb), HeadStride: uint64(rb), RowPitch: uint32(H * rb)}
	for i := range 2 * geo.Layers {
		tg.Regions[i] = abi.TargetRegion{Buffer: tid, Offset: uint64(i * tensor)}
	}
	tin, tout := make([]byte, abi.TargetSize), make([]byte, abi.TargetSize)
	tg.Marshal(tin)
	if _, errno := ss.Ioctl(abi.CmdRegisterTarget, tin, tout); errno != 0 {
		t.Fatalf("register target: %v", errno)
	}
	ash := newShm(t, abi.BlockEntrySize, 0)
	aid := mustRegister(t, ss, ash)
	(&abi.BlockEntry{Block: 9, CacheBlock: 1, LayerCount: uint16(geo.Layers), HeadCount: uint16(H), Kinds: abi.KindsBoth}).Marshal(ash.mem)
	var bin, bout [abi.BlocksSize]byte
	(&abi.Blocks{ABI: abi.Version, Target: binary.LittleEndian.Uint32(tout[abi.TargetOutOff:]), Count: 1, Buffer: aid}).Marshal(bin[:])
	want = bytes.Repeat([]byte{0x5A}, tsh.n)
	for i := range n {
		k := geo.KeyAt(9, i)
		off := (k.Layer*2+int(k.Kind))*tensor + T*H*rb + k.Head*rb
		for r := range T {
			copy(want[off+r*pitch:], data[i][r*rb:(r+1)*rb])
		}
	}
	eng.watch(ss, tid)
	before = st.Metrics().Bounced
	if nok, errno := ss.Ioctl(abi.CmdLoadBlocks, bin[:], bout[:]); errno != 0 || nok != 1 {
		t.Fatalf("LOAD_BLOCKS: %d ok, %v", nok, errno)
	}
	if !bytes.Equal(tsh.mem[:tsh.n], want) {
		t.Fatal("LOAD_BLOCKS: the cache differs from the groups scattered by hand")
	}
	tsh.checkGuard(t)
	if eng.beside != 0 || eng.inside != n*gb {
		t.Fatalf("LOAD_BLOCKS: reads landed %d bytes in the mapping, %d in daemon memory; want %d and 0", eng.inside, eng.beside, n*gb)
	}
	if b := st.Metrics().Bounced - before; b != 0 {
		t.Fatalf("LOAD_BLOCKS: %d bytes copied from bounce memory", b)
	}
}
