package ctl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/gpu/cuda"
	"github.com/kvfs/kvfs/gpu/gputest"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// fakeGPU is a gputest.Device whose "IPC handles" name allocations of its
// arena: bytes 0..8 the base, 8..16 the size, 16..24 a magic.
type fakeGPU struct {
	*gputest.Device
	mu     sync.Mutex
	opened int // mappings open now
	closed bool
}

const fakeMagic = 0x6b766673_67707521

func fakeHandle(base, size uint64) [64]byte {
	var h [64]byte
	binary.LittleEndian.PutUint64(h[0:], base)
	binary.LittleEndian.PutUint64(h[8:], size)
	binary.LittleEndian.PutUint64(h[16:], fakeMagic)
	binary.LittleEndian.PutUint32(h[24:], uint32(os.Getpid())) // the exporter: this process
	return h
}

func (g *fakeGPU) Exporter(h [64]byte) (uint32, bool) {
	pid := binary.LittleEndian.Uint32(h[24:])
	return pid, pid != 0
}

type fakeMem struct {
	g          *fakeGPU
	base, size uint64
	once       sync.Once
}

func (m *fakeMem) Range() (uint64, uint64) { return m.base, m.size }

func (m *fakeMem) Close() error {
	m.once.Do(func() {
		_ = m.g.Synchronize()
		m.g.mu.Lock()
		m.g.opened--
		m.g.mu.Unlock()
	})
	return nil
}

func (g *fakeGPU) OpenIPC(h [64]byte) (GPUMemory, error) {
	if binary.LittleEndian.Uint64(h[16:]) != fakeMagic {
		return nil, errors.New("fake: invalid handle")
	}
	g.mu.Lock()
	g.opened++
	g.mu.Unlock()
	return &fakeMem{g: g, base: binary.LittleEndian.Uint64(h[0:]), size: binary.LittleEndian.Uint64(h[8:])}, nil
}

func (g *fakeGPU) Close() error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	return nil
}

func (g *fakeGPU) open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.opened
}

const fakeArena = 1 << 20

// gpuFixture is a server whose devices 0 and 1 are fakes.
func gpuFixture(t testing.TB, devs int, mods ...func(*GPUOptions, []*fakeGPU)) (*fixture, []*fakeGPU) {
	return gpuFixtureSized(t, devs, 16, fakeArena, mods...)
}

// gpuFixtureSized is gpuFixture with a store of slots blocks and devices
// of arena bytes.
func gpuFixtureSized(t testing.TB, devs, slots, arena int, mods ...func(*GPUOptions, []*fakeGPU)) (*fixture, []*fakeGPU) {
	t.Helper()
	o, fakes := fakeGPUOptions(t, devs, arena, mods...)
	return newFixture(t, slots, Options{GPU: o}), fakes
}

// fakeGPUOptions are GPU options opening devs fake devices of arena bytes.
func fakeGPUOptions(t testing.TB, devs, arena int, mods ...func(*GPUOptions, []*fakeGPU)) (GPUOptions, []*fakeGPU) {
	fakes := make([]*fakeGPU, devs)
	for i := range fakes {
		fakes[i] = &fakeGPU{Device: gputest.NewDevice(arena)}
		t.Cleanup(fakes[i].Device.Close)
	}
	o := GPUOptions{
		Open: func(o int) (GPU, error) {
			if o >= len(fakes) {
				return nil, fmt.Errorf("fake: %w: %d", cuda.ErrNoDevice, o)
			}
			return fakes[o], nil
		},
		Available:    func() bool { return true },
		StagingCount: 4, StagingSize: 4 * testGeo.GroupBytes(),
	}
	for _, m := range mods {
		m(&o, fakes)
	}
	return o, fakes
}

// testTarget is a target of nb cache blocks of testGeo in buffer id, token-
// major (NHD) or head-major (HND), each (layer, kind) a tensor after the
// one before from offset 0.
func testTarget(id uint32, nb int, nhd bool) *abi.Target {
	geo := testGeo
	rb, T, H, L := geo.RowBytes(), geo.BlockTokens, geo.KVHeads, geo.Layers
	tg := &abi.Target{ABI: abi.Version, NumBlocks: uint32(nb), RowBytes: uint32(rb), LayerCount: uint16(L), HeadCount: uint16(H),
		BlockStride: uint64(T * H * rb), HeadStride: uint64(T * rb), RowPitch: uint32(rb)}
	if nhd {
		tg.HeadStride, tg.RowPitch = uint64(rb), uint32(H*rb)
	}
	for i := range 2 * L {
		tg.Regions[i] = abi.TargetRegion{Buffer: id, Offset: uint64(i * nb * T * H * rb)}
	}
	return tg
}

// registerTarget registers tg and returns its id.
func registerTarget(ss *Session, tg *abi.Target) (uint32, syscall.Errno) {
	in, out := make([]byte, abi.TargetSize), make([]byte, abi.TargetSize)
	tg.Marshal(in)
	_, errno := ss.Ioctl(abi.CmdRegisterTarget, in, out)
	return binary.LittleEndian.Uint32(out[abi.TargetOutOff:]), errno
}

func registerCUDA(ss *Session, tid uint32, r abi.RegisterCUDA) (abi.RegisterCUDA, syscall.Errno) {
	in := make([]byte, abi.RegisterCUDASize)
	if r.ABI == 0 {
		r.ABI = abi.Version
	}
	r.Marshal(in)
	out := make([]byte, abi.RegisterCUDASize)
	_, errno := ss.IoctlFrom(tid, abi.CmdRegisterCUDA, in, out)
	var got abi.RegisterCUDA
	got.Unmarshal(out)
	return got, errno
}

func mustRegisterCUDA(t testing.TB, ss *Session, dev uint32, base, size, off, n uint64) uint32 {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	got, errno := registerCUDA(ss, uint32(unix.Gettid()), abi.RegisterCUDA{Handle: fakeHandle(base, size), Offset: off, Length: n, Device: dev})
	if errno != 0 {
		t.Fatalf("register-cuda: %v", errno)
	}
	if got.Buffer == 0 || got.Length != n {
		t.Fatalf("register-cuda reply %+v", got)
	}
	return got.Buffer
}

func TestRegisterCUDAWithoutGPU(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    GPUOptions
	}{
		{"disabled", GPUOptions{Disable: true}},
		{"no driver", GPUOptions{
			Open:      func(int) (GPU, error) { return nil, fmt.Errorf("x: %w", cuda.ErrNoDriver) },
			Available: func() bool { return false },
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 4, Options{GPU: tc.o})
			ss := f.open(0, 0)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			_, errno := registerCUDA(ss, uint32(unix.Gettid()), abi.RegisterCUDA{Handle: fakeHandle(gputest.Base, 4096), Length: 4096})
			if errno != syscall.ENODEV {
				t.Fatalf("register-cuda without a GPU: %v, want ENODEV", errno)
			}
			info := make([]byte, abi.InfoSize)
			if _, errno := ss.Ioctl(abi.CmdInfo, nil, info); errno != 0 {
				t.Fatal(errno)
			}
			var i abi.Info
			i.Unmarshal(info)
			if i.Caps&abi.CapCUDA != 0 {
				t.Fatalf("INFO reports KVFS_CAP_CUDA without a GPU")
			}
			if ss.Buffers() != 0 {
				t.Fatalf("a failed registration left %d buffers", ss.Buffers())
			}
			// Host registrations and loads are unaffected.
			f.put(blockKeys(1), 1)
			s := newShm(t, f.gb, 0)
			id := mustRegister(t, ss, s)
			got := mustBatch(t, ss, true, []abi.Entry{entry(blockKeys(1)[0], id, 0, 0)})
			if got[0].Status != abi.OK || !bytes.Equal(s.mem[:f.gb], groupData(blockKeys(1)[0], 1)) {
				t.Fatalf("host load beside a GPU-less server: %v", got[0].Status)
			}
		})
	}
}

func TestRegisterCUDAHostile(t *testing.T) {
	f, fakes := gpuFixture(t, 1)
	ss := f.open(0, 0)
	base := gputest.Base + 4096
	good := abi.RegisterCUDA{Handle: fakeHandle(base, 8192), Offset: 0, Length: 8192}
	for _, tc := range []struct {
		name   string
		caller bool
		mod    func(r *abi.RegisterCUDA)
		want   syscall.Errno
	}{
		{"unknown caller", false, nil, syscall.ESRCH},
		{"bad handle", true, func(r *abi.RegisterCUDA) { binary.LittleEndian.PutUint64(r.Handle[16:], 7) }, syscall.EINVAL},
		{"handle without exporter", true, func(r *abi.RegisterCUDA) { r.Handle = [64]byte{1, 2, 3} }, syscall.EACCES},
		{"another process's handle", true, func(r *abi.RegisterCUDA) { binary.LittleEndian.PutUint32(r.Handle[24:], 1) }, syscall.EACCES},
		{"past the allocation", true, func(r *abi.RegisterCUDA) { r.Offset = 4096; r.Length = 4097 }, syscall.ERANGE},
		{"offset past the end", true, func(r *abi.RegisterCUDA) { r.Offset = 8193; r.Length = 1 }, syscall.ERANGE},
		{"overflowing range", true, func(r *abi.RegisterCUDA) { r.Offset = 1 << 63; r.Length = 1 << 63 }, syscall.ERANGE},
		{"zero length", true, func(r *abi.RegisterCUDA) { r.Length = 0 }, syscall.ERANGE},
		{"flags", true, func(r *abi.RegisterCUDA) { r.Flags = 1 }, syscall.EINVAL},
		{"reserved", true, func(r *abi.RegisterCUDA) { r.Reserved[3] = 1 }, syscall.EINVAL},
		{"buffer set on input", true, func(r *abi.RegisterCUDA) { r.Buffer = 7 }, syscall.EINVAL},
		{"no such device", true, func(r *abi.RegisterCUDA) { r.Device = 5 }, syscall.ENODEV},
		{"huge device ordinal", true, func(r *abi.RegisterCUDA) { r.Device = 1 << 31 }, syscall.ENODEV},
		{"old ABI", true, func(r *abi.RegisterCUDA) { r.ABI = 99 }, syscall.EPROTO},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			tid := uint32(unix.Gettid())
			if !tc.caller {
				tid = 0
			}
			r := good
			if tc.mod != nil {
				tc.mod(&r)
			}
			if _, errno := registerCUDA(ss, tid, r); errno != tc.want {
				t.Fatalf("errno %v, want %v", errno, tc.want)
			}
			if ss.Buffers() != 0 || fakes[0].open() != 0 {
				t.Fatalf("refused registration left %d buffers, %d mappings", ss.Buffers(), fakes[0].open())
			}
		})
	}
	// A registration is closed by UNREGISTER and by the session's release.
	id := mustRegisterCUDA(t, ss, 0, base, 8192, 512, 4096)
	if fakes[0].open() != 1 {
		t.Fatalf("mappings open: %d", fakes[0].open())
	}
	if errno := unregister(ss, id); errno != 0 {
		t.Fatal(errno)
	}
	mustRegisterCUDA(t, ss, 0, base, 8192, 0, 8192)
	mustRegisterCUDA(t, ss, 0, base, 8192, 0, 8192)
	if fakes[0].open() != 2 {
		t.Fatalf("mappings open: %d", fakes[0].open())
	}
	ss.Release()
	if fakes[0].open() != 0 {
		t.Fatalf("release left %d mappings open", fakes[0].open())
	}
}

func TestLoadStoreCUDA(t *testing.T) {
	f, fakes := gpuFixture(t, 1)
	dev := fakes[0]
	ss := f.open(0, 0)
	gb := uint64(f.gb)
	keys := blockKeys(3)
	f.put(keys, 1)
	bad := keys[5]
	f.corrupt(bad)
	base := gputest.Base
	n := uint64(len(keys)) * gb * 2
	id := mustRegisterCUDA(t, ss, 0, base, n, 0, n)
	dev.Fill(base, bytes.Repeat([]byte{0xAB}, int(n)))

	// Packed tiles in the first half, one pitched tile (pitch 2 rows) at
	// the start of the second half.
	var es []abi.Entry
	for i, k := range keys {
		es = append(es, entry(k, id, uint64(i)*gb, 0))
	}
	rowBytes := uint64(testGeo.RowBytes())
	pitched := entry(keys[1], id, n/2, uint32(2*rowBytes))
	es = append(es, pitched)
	got := mustBatch(t, ss, true, es)
	for i, k := range keys {
		tile := dev.Mem(base+uint64(i)*gb, int(gb))
		if k == bad {
			if got[i].Status != abi.Corrupt || !bytes.Equal(tile, make([]byte, gb)) {
				t.Fatalf("corrupt group: status %v, tile zeroed %v", got[i].Status, bytes.Equal(tile, make([]byte, gb)))
			}
			continue
		}
		if got[i].Status != abi.OK || !bytes.Equal(tile, groupData(k, 1)) {
			t.Fatalf("entry %d: status %v, bytes equal %v", i, got[i].Status, bytes.Equal(tile, groupData(k, 1)))
		}
	}
	if st := got[len(keys)].Status; st != abi.OK {
		t.Fatalf("pitched entry: %v", st)
	}
	want := groupData(keys[1], 1)
	for r := uint64(0); r < uint64(testGeo.BlockTokens); r++ {
		row := dev.Mem(base+n/2+r*2*rowBytes, int(rowBytes))
		if !bytes.Equal(row, want[r*rowBytes:(r+1)*rowBytes]) {
			t.Fatalf("pitched row %d wrong", r)
		}
		if gap := dev.Mem(base+n/2+r*2*rowBytes+rowBytes, int(rowBytes)); r+1 < uint64(testGeo.BlockTokens) && !bytes.Equal(gap, bytes.Repeat([]byte{0xAB}, int(rowBytes))) {
			t.Fatalf("pitched load wrote between rows (row %d)", r)
		}
	}

	// STORE the device tiles (packed, and the pitched one) as block 9.
	var ses []abi.Entry
	var skeys []layout.Key
	for i, k := range keys {
		if k == bad {
			continue
		}
		k2 := k
		k2.Block = 9
		ses = append(ses, entry(k2, id, uint64(i)*gb, 0))
		skeys = append(skeys, k)
	}
	got = mustBatch(t, ss, false, ses)
	for i := range got {
		if got[i].Status != abi.OK {
			t.Fatalf("store entry %d: %v", i, got[i].Status)
		}
	}
	for _, k := range skeys {
		k2 := k
		k2.Block = 9
		if !bytes.Equal(f.get(k2), groupData(k, 1)) {
			t.Fatalf("stored group %v differs from the device tile", k)
		}
	}
	if v := dev.Violations(); len(v) != 0 {
		t.Fatalf("fake device violations: %v", v)
	}

	// Entries past the registered range, and overlapping ones, are refused
	// without touching the device.
	got, _ = batch(t, ss, true, []abi.Entry{
		entry(keys[0], id, n-gb+1, 0),
		entry(keys[0], id, 0, 0), entry(keys[2], id, gb/2, 0),
	})
	if got[0].Status != abi.BadRequest || got[1].Status != abi.BadRequest || got[2].Status != abi.BadRequest {
		t.Fatalf("bad entries: %v %v %v", got[0].Status, got[1].Status, got[2].Status)
	}
}

// TestLoadCUDATwoDevices: one batch with tiles on two devices; device 0's
// copies cannot finish until device 1's have run, which deadlocks (and the
// test fails after a minute) if the devices are served one after the other.
func TestLoadCUDATwoDevices(t *testing.T) {
	f, fakes := gpuFixture(t, 2)
	ss := f.open(0, 0)
	gb := uint64(f.gb)
	keys := blockKeys(4)
	f.put(keys, 2)
	half := len(keys) / 2
	released := make(chan struct{})
	var once sync.Once
	fakes[1].FailCopy = func(int) error {
		once.Do(func() { close(released) })
		return nil
	}
	fakes[0].FailCopy = func(int) error {
		select {
		case <-released:
			return nil
		case <-time.After(time.Minute):
			return errors.New("device 0 waited on device 1's batch")
		}
	}
	n := uint64(half) * gb
	id0 := mustRegisterCUDA(t, ss, 0, gputest.Base, n, 0, n)
	id1 := mustRegisterCUDA(t, ss, 1, gputest.Base, n, 0, n)
	var es []abi.Entry
	for i, k := range keys {
		id := id0
		if i >= half {
			id = id1
		}
		es = append(es, entry(k, id, uint64(i%half)*gb, 0))
	}
	got := mustBatch(t, ss, true, es)
	for i, k := range keys {
		d := fakes[0]
		if i >= half {
			d = fakes[1]
		}
		if got[i].Status != abi.OK || !bytes.Equal(d.Mem(gputest.Base+uint64(i%half)*gb, int(gb)), groupData(k, 2)) {
			t.Fatalf("entry %d on device %d: %v", i, i/half, got[i].Status)
		}
	}
}

// TestLoadCUDACopyFails: a copy failing mid-batch fails the entries of its
// staging buffer (IOError), never reports them OK, and the others succeed.
func TestLoadCUDACopyFails(t *testing.T) {
	f, fakes := gpuFixture(t, 1)
	ss := f.open(0, 0)
	gb := uint64(f.gb)
	keys := blockKeys(5)
	f.put(keys, 3)
	fakes[0].FailCopy = func(i int) error {
		if i == 13 { // in the last staging buffer's copies
			return gputest.ErrInjected
		}
		return nil
	}
	n := uint64(len(keys)) * gb * 2
	id := mustRegisterCUDA(t, ss, 0, gputest.Base, n, 0, n)
	var es []abi.Entry
	for i, k := range keys {
		es = append(es, entry(k, id, uint64(i)*2*gb, 0)) // not contiguous: one copy each
	}
	got := mustBatch(t, ss, true, es)
	ok, failed := 0, 0
	for i, k := range keys {
		switch got[i].Status {
		case abi.OK:
			ok++
			if !bytes.Equal(fakes[0].Mem(gputest.Base+uint64(i)*2*gb, int(gb)), groupData(k, 3)) {
				t.Fatalf("entry %d reported OK with wrong bytes", i)
			}
		case abi.IOError:
			failed++
		default:
			t.Fatalf("entry %d: %v", i, got[i].Status)
		}
	}
	if failed == 0 || ok == 0 {
		t.Fatalf("ok %d, failed %d: want the failed copy's chunk failed and the rest loaded", ok, failed)
	}
}

// TestBlocksCUDA: LOAD_BLOCKS into an NHD target in (fake) device memory
// lands every group where the layout says, STORE_BLOCKS from it stores the
// same bytes, and a target mixing host and CUDA regions is refused.
func TestBlocksCUDA(t *testing.T) {
	f, fakes := gpuFixture(t, 1)
	dev := fakes[0]
	dev.Enable2D = true // NHD tiles: one 2D copy each
	ss := f.open(0, 0)
	geo := testGeo
	rb, T, H, L := geo.RowBytes(), geo.BlockTokens, geo.KVHeads, geo.Layers
	const nb = 3
	tensor := nb * T * H * rb
	n := uint64(2 * L * tensor)
	id := mustRegisterCUDA(t, ss, 0, gputest.Base, n, 0, n)
	for _, b := range []uint64{1, 2} {
		f.put(blockKeys(b), int(b))
	}
	tg := testTarget(id, nb, true)
	tid, errno := registerTarget(ss, tg)
	if errno != 0 {
		t.Fatalf("register target in CUDA memory: %v", errno)
	}
	blocks := func(cmd uint32, es []abi.BlockEntry) []abi.BlockEntry {
		t.Helper()
		return blocksInline(t, ss, tid, cmd, es)
	}
	whole := wholeBlock
	c0, c2d0 := dev.Copies(), dev.Copies2D()
	got := blocks(abi.CmdLoadBlocksInline, []abi.BlockEntry{whole(2, 0), whole(1, 2)})
	// The heads of one (layer, kind) of a cache block land interleaved in
	// staging, as on the device: whole NHD blocks move with plain copies,
	// at most one per (block, layer, kind), never one 2D copy per group.
	if n2, n := dev.Copies2D()-c2d0, dev.Copies()-c0; n2 != 0 || n > 2*2*L {
		t.Fatalf("loading 2 NHD blocks took %d copies and %d 2D copies, want ≤ %d and 0", n, n2, 2*2*L)
	}
	for i, e := range got {
		if e.Status != abi.OK || int(e.GroupsOK) != geo.GroupsPerBlock() {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
	tileOf := func(k layout.Key, cb int) []byte {
		b := make([]byte, 0, f.gb)
		for r := range T {
			off := (2*k.Layer+int(k.Kind))*tensor + (cb*T*H+r*H+k.Head)*rb
			b = append(b, dev.Mem(gputest.Base+uint64(off), rb)...)
		}
		return b
	}
	for cb, b := range map[int]uint64{0: 2, 2: 1} {
		for _, k := range blockKeys(b) {
			if !bytes.Equal(tileOf(k, cb), groupData(k, int(b))) {
				t.Fatalf("%v in cache block %d differs", k, cb)
			}
		}
	}
	// Store cache block 2 as block 7 and read it back from the store.
	got = blocks(abi.CmdStoreBlocksInline, []abi.BlockEntry{whole(7, 2)})
	if got[0].Status != abi.OK {
		t.Fatalf("store-blocks: %+v", got[0])
	}
	for _, k := range blockKeys(7) {
		k1 := k
		k1.Block = 1
		if !bytes.Equal(f.get(k), groupData(k1, 1)) {
			t.Fatalf("stored %v differs", k)
		}
	}
	if n := dev.Copies2D() - c2d0; n != geo.GroupsPerBlock() {
		t.Fatalf("%d 2D copies for storing one NHD block, want one per group (%d)", n, geo.GroupsPerBlock())
	}
	// A tensor-parallel shard (the upper half of the heads) of block 2 into
	// cache block 1: one 2D copy per (layer, kind), the other heads' rows
	// untouched.
	before := dev.Mem(gputest.Base, 2*L*tensor)
	c2d0 = dev.Copies2D()
	shard := abi.BlockEntry{Block: 2, CacheBlock: 1, LayerCount: uint16(L), HeadFirst: uint16(H / 2), HeadCount: uint16(H - H/2), Kinds: abi.KindsBoth}
	if got := blocks(abi.CmdLoadBlocksInline, []abi.BlockEntry{shard}); got[0].Status != abi.OK {
		t.Fatalf("shard load: %+v", got[0])
	}
	if n := dev.Copies2D() - c2d0; H/2 > 1 && n != 2*L {
		t.Fatalf("shard load took %d 2D copies, want %d", n, 2*L)
	}
	for _, k := range blockKeys(2) {
		tile := tileOf(k, 1)
		if k.Head >= H/2 {
			if !bytes.Equal(tile, groupData(k, 2)) {
				t.Fatalf("shard: %v differs", k)
			}
			continue
		}
		for r := range T {
			off := (2*k.Layer+int(k.Kind))*tensor + (1*T*H+r*H+k.Head)*rb
			if !bytes.Equal(tile[r*rb:(r+1)*rb], before[off:off+rb]) {
				t.Fatalf("shard load wrote %v's row %d, outside its heads", k, r)
			}
		}
	}
	// A target mixing host and CUDA regions is refused.
	s := newShm(t, tensor, 0)
	hid := mustRegister(t, ss, s)
	tg.Regions[1] = abi.TargetRegion{Buffer: hid}
	if _, errno := registerTarget(ss, tg); errno != syscall.EINVAL {
		t.Fatalf("mixed target: %v, want EINVAL", errno)
	}
	if v := dev.Violations(); len(v) != 0 {
		t.Fatal(v)
	}
}

// fakeChecker is a gpu.Checker over a fake device: Verify checks tiles
// where they landed (the CPU over the fake's memory), Sum checksums staged
// groups (as the kernel reads pinned staging), flipping the sum of the
// flip-th group it sees (a kernel gone wrong) or failing when sumErr is set.
type fakeChecker struct {
	mu       sync.Mutex // Verify and Sum may be called concurrently (a direct load's workers)
	dev      *fakeGPU
	geo      gpu.Geometry
	verified *int
	summed   int
	flip     int // 1-based; 0: none
	sumErr   error
}

func (c *fakeChecker) Verify(items []*gpu.Item) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	geo, dev := c.geo, c.dev
	eachGroup(items, geo, func(it *gpu.Item, _, j int, dst uint64, pitch int, crc uint32) {
		*c.verified++
		var b []byte
		for r := range geo.Rows {
			b = append(b, dev.Mem(dst+uint64(r*pitch), geo.RowBytes)...)
		}
		if store.CRC32C(b) != crc {
			for r := range geo.Rows {
				dev.Fill(dst+uint64(r*pitch), make([]byte, geo.RowBytes))
			}
			it.FailHead(j, fmt.Errorf("fake verify: %w", store.ErrCorrupt))
		}
	})
	return nil
}

// eachGroup calls f for every group of items a checker checks (a tile's
// heads one by one, those that failed before skipped): its item (the
// i-th), head, address, row pitch and recorded checksum.
func eachGroup(items []*gpu.Item, geo gpu.Geometry, f func(it *gpu.Item, i, j int, dst uint64, pitch int, crc uint32)) {
	for i, it := range items {
		pitch := it.Pitch
		if pitch == 0 {
			pitch = geo.RowBytes
		}
		for j := range it.Groups() {
			if it.Skip(j) {
				continue
			}
			dst, crc := it.Group(j)
			f(it, i, j, dst, pitch, crc)
		}
	}
}

func (c *fakeChecker) Sum(staged [][]byte, crcs []uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sumErr != nil {
		return c.sumErr
	}
	for i, b := range staged {
		c.summed++
		crcs[i] = store.CRC32C(b)
		if c.summed == c.flip {
			crcs[i] ^= 1
		}
	}
	return nil
}

func (c *fakeChecker) Close() error { return nil }

// TestStoreCUDASumOnGPU: with VerifyOnGPU a STORE from GPU memory has the
// device checksum the staged groups and the store records those sums
// (reads of the stored groups verify against them); when the device's
// checksum fails the store computes them, and a wrong sum from the device
// makes that group read as corrupt, never served.
func TestStoreCUDASumOnGPU(t *testing.T) {
	for _, mode := range []string{"ok", "sum-fails", "wrong-sum"} {
		t.Run(mode, func(t *testing.T) {
			var chk *fakeChecker
			verified := 0
			f, fakes := gpuFixture(t, 1, func(o *GPUOptions, fakes []*fakeGPU) {
				o.VerifyOnGPU = true
				o.NewVerifier = func(ordinal int, geo gpu.Geometry) (gpu.Checker, error) {
					chk = &fakeChecker{dev: fakes[ordinal], geo: geo, verified: &verified}
					switch mode {
					case "sum-fails":
						chk.sumErr = errors.New("fake: kernel launch failed")
					case "wrong-sum":
						chk.flip = 3
					}
					return chk, nil
				}
			})
			dev := fakes[0]
			ss := f.open(0, 0)
			gb := uint64(f.gb)
			keys := blockKeys(2)
			n := uint64(len(keys)) * gb
			id := mustRegisterCUDA(t, ss, 0, gputest.Base, n, 0, n)
			var es []abi.Entry
			for i, k := range keys {
				dev.Fill(gputest.Base+uint64(i)*gb, groupData(k, 7))
				es = append(es, entry(k, id, uint64(i)*gb, 0))
			}
			for i, r := range mustBatch(t, ss, false, es) {
				if r.Status != abi.OK {
					t.Fatalf("store entry %d: %v", i, r.Status)
				}
			}
			if want := map[string]int{"ok": len(keys), "sum-fails": 0, "wrong-sum": len(keys)}[mode]; chk.summed != want {
				t.Fatalf("the device summed %d staged groups, want %d", chk.summed, want)
			}
			m := f.srv.Metrics()
			if mode == "sum-fails" {
				if m.GPUSummed != 0 || m.GPUSumFailed != uint64(len(keys)) {
					t.Fatalf("metrics: %d summed, %d failed", m.GPUSummed, m.GPUSumFailed)
				}
			} else if m.GPUSummed != uint64(len(keys)) || m.GPUSumFailed != 0 {
				t.Fatalf("metrics: %d summed, %d failed", m.GPUSummed, m.GPUSumFailed)
			}
			for i, k := range keys {
				buf := make([]byte, gb)
				rr := []store.ReadReq{{Key: k, Buf: buf}}
				if err := f.st.Read(rr); err != nil {
					t.Fatal(err)
				}
				if mode == "wrong-sum" && i == chk.flip-1 {
					// The stored sum is the device's: the read fails.
					if !errors.Is(rr[0].Err, store.ErrCorrupt) || !bytes.Equal(buf, make([]byte, gb)) {
						t.Fatalf("group %v with a wrong sum: %v", k, rr[0].Err)
					}
					continue
				}
				if rr[0].Err != nil || !bytes.Equal(buf, groupData(k, 7)) {
					t.Fatalf("stored group %v: %v", k, rr[0].Err)
				}
			}
		})
	}
}

// TestLoadCUDAVerifyOnGPU: with VerifyOnGPU the store does not check the
// groups; the device-side verifier (here the CPU over the fake's memory)
// gets each group's recorded CRC, and a corrupt group ends zeroed on the
// device and reported Corrupt, packed or pitched, while the rest load.
func TestLoadCUDAVerifyOnGPU(t *testing.T) {
	verified := 0
	f, fakes := gpuFixture(t, 1, func(o *GPUOptions, fakes []*fakeGPU) {
		o.VerifyOnGPU = true
		o.NewVerifier = func(ordinal int, geo gpu.Geometry) (gpu.Checker, error) {
			return &fakeChecker{dev: fakes[ordinal], geo: geo, verified: &verified}, nil
		}
	})
	dev := fakes[0]
	ss := f.open(0, 0)
	gb := uint64(f.gb)
	keys := blockKeys(6)
	f.put(keys, 4)
	bad := keys[2]
	f.corrupt(bad)
	n := uint64(len(keys)+1) * gb * 2
	id := mustRegisterCUDA(t, ss, 0, gputest.Base, n, 0, n)
	var es []abi.Entry
	for i, k := range keys {
		es = append(es, entry(k, id, uint64(i)*gb, 0))
	}
	rowBytes := uint64(testGeo.RowBytes())
	es = append(es, entry(bad, id, n/2, uint32(2*rowBytes))) // pitched, corrupt
	corrupt := f.st.Metrics().Corrupt
	got := mustBatch(t, ss, true, es)
	// the store handed the groups out unchecked; the two the device found
	// corrupt are in its corrupt count, as those it checks itself are
	if c := f.st.Metrics().Corrupt - corrupt; c != 2 {
		t.Errorf("store's corrupt count rose by %d, want 2", c)
	}
	for i, k := range keys {
		tile := dev.Mem(gputest.Base+uint64(i)*gb, int(gb))
		if k == bad {
			if got[i].Status != abi.Corrupt || !bytes.Equal(tile, make([]byte, gb)) {
				t.Fatalf("corrupt group: %v", got[i].Status)
			}
			continue
		}
		if got[i].Status != abi.OK || !bytes.Equal(tile, groupData(k, 4)) {
			t.Fatalf("entry %d: %v", i, got[i].Status)
		}
	}
	if st := got[len(keys)].Status; st != abi.Corrupt {
		t.Fatalf("pitched corrupt entry: %v", st)
	}
	for r := uint64(0); r < uint64(testGeo.BlockTokens); r++ {
		if row := dev.Mem(gputest.Base+n/2+r*2*rowBytes, int(rowBytes)); !bytes.Equal(row, make([]byte, rowBytes)) {
			t.Fatalf("pitched corrupt row %d not zeroed", r)
		}
	}
	if verified != len(es) {
		t.Fatalf("verifier saw %d groups, want %d", verified, len(es))
	}
}

// TestGPULoadBlocksAllocationsPerGroup: once warm, a LOAD_BLOCKS into a
// target in GPU memory allocates nothing per group in the control path or
// the pipeline: the items, their owners, each staging buffer's working
// memory and the read groups' requests are reused from call to call. They
// were 330 bytes per group, allocated and faulted in on every call (over
// 100 MiB for 1,024 blocks of a Llama-3-8B-class model). What remains is
// the fake device's own record of every copy it was asked for (it keeps
// them all): under 64 bytes per group, where the items alone were 84.
func TestGPULoadBlocksAllocationsPerGroup(t *testing.T) {
	if raceOn {
		t.Skip("the call's scratch is pooled, and the pool drops items at random under the race detector")
	}
	f, _ := gpuFixture(t, 1, func(o *GPUOptions, _ []*fakeGPU) {
		o.StagingSize = 2 * testGeo.GroupsPerBlock() * testGeo.GroupBytes()
	})
	ss := f.open(0, 0)
	geo := testGeo
	rb, T, H, L := geo.RowBytes(), geo.BlockTokens, geo.KVHeads, geo.Layers
	const nb = 12
	tensor := nb * T * H * rb
	n := uint64(2 * L * tensor)
	id := mustRegisterCUDA(t, ss, 0, gputest.Base, n, 0, n)
	for b := range uint64(nb) {
		f.put(blockKeys(b), int(b))
	}
	tid, errno := registerTarget(ss, testTarget(id, nb, false))
	if errno != 0 {
		t.Fatalf("register target: %v", errno)
	}
	in, out := make([]byte, abi.BlocksInlineSize), make([]byte, abi.BlocksInlineSize)
	load := func(blocks int) {
		(&abi.Blocks{ABI: abi.Version, Target: tid, Count: uint32(blocks)}).Marshal(in)
		for i := range blocks {
			(&abi.BlockEntry{Block: uint64(i), CacheBlock: uint32(i), LayerCount: uint16(L), HeadCount: uint16(H), Kinds: abi.KindsBoth}).
				Marshal(in[abi.BlocksSize+i*abi.BlockEntrySize:])
		}
		if n, errno := ss.Ioctl(abi.CmdLoadBlocksInline, in, out); errno != 0 || int(n) != blocks {
			t.Fatalf("load blocks: %d ok, %v", n, errno)
		}
	}
	perCall := func(blocks int) float64 {
		const calls = 20
		load(blocks) // warm
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range calls {
			load(blocks)
		}
		runtime.ReadMemStats(&m1)
		return float64(m1.TotalAlloc-m0.TotalAlloc) / calls
	}
	small, large := perCall(2), perCall(nb)
	perGroup := (large - small) / float64((nb-2)*geo.GroupsPerBlock())
	t.Logf("%.0f bytes per call of 2 blocks, %.0f of %d: %.1f per group", small, large, nb, perGroup)
	if perGroup >= 64 {
		t.Errorf("a GPU load allocates %.1f bytes per group", perGroup)
	}
}

// TestLoadCUDADirect: with the GPU verifying and the store's file in host
// memory, the server registers the file with the device once, in the
// background, and loads of packed tiles (v1 entries and LOAD_BLOCKS into
// an HND target) then copy straight from it: every byte right, a corrupt
// group zeroed where it landed and reported Corrupt, an absent one left
// alone; a batch with a pitched tile goes through staging; a refused
// registration leaves every load on staging; Close unregisters the file.
func TestLoadCUDADirect(t *testing.T) {
	for _, mode := range []string{"direct", "refused", "no-direct"} {
		t.Run(mode, func(t *testing.T) {
			verified := 0
			f, fakes := gpuFixture(t, 1, func(o *GPUOptions, fakes []*fakeGPU) {
				o.VerifyOnGPU = true
				o.NoDirect = mode == "no-direct"
				o.NewVerifier = func(ordinal int, geo gpu.Geometry) (gpu.Checker, error) {
					return &fakeChecker{dev: fakes[ordinal], geo: geo, verified: &verified}, nil
				}
				if mode == "refused" {
					fakes[0].FailRegister = func() error { return errors.New("fake: cannot pin") }
				}
			})
			f.mem.SetHostView(true)
			dev := fakes[0]
			ss := f.open(0, 0)
			geo := testGeo
			gb := uint64(f.gb)
			rb, T, H, L := geo.RowBytes(), geo.BlockTokens, geo.KVHeads, geo.Layers
			const nb = 4
			tensor := nb * T * H * rb
			n := uint64(2 * L * tensor)
			id := mustRegisterCUDA(t, ss, 0, gputest.Base, n, 0, n)
			deadline := time.Now().Add(10 * time.Second)
			for mode == "direct" && !f.srv.Metrics().GPUHostRegistered {
				if time.Now().After(deadline) {
					t.Fatal("the store file was never registered with the device")
				}
				time.Sleep(time.Millisecond)
			}
			if mode != "direct" {
				time.Sleep(20 * time.Millisecond) // a registration would be done by now
				if f.srv.Metrics().GPUHostRegistered || dev.Registered() != 0 {
					t.Fatal("registered")
				}
			}
			for _, b := range []uint64{1, 2, 3} {
				f.put(blockKeys(b), int(b))
			}
			bad := blockKeys(2)[3]
			f.corrupt(bad)
			// v1 entries: block 1's groups, then an absent group.
			keys := blockKeys(1)
			var es []abi.Entry
			for i, k := range keys {
				es = append(es, entry(k, id, uint64(i)*gb, 0))
			}
			absent := layout.Key{Block: 9}
			old := bytes.Repeat([]byte{0x5A}, int(gb))
			dev.Fill(gputest.Base+uint64(len(keys))*gb, old)
			es = append(es, entry(absent, id, uint64(len(keys))*gb, 0))
			got := mustBatch(t, ss, true, es)
			for i, k := range keys {
				if got[i].Status != abi.OK || !bytes.Equal(dev.Mem(gputest.Base+uint64(i)*gb, int(gb)), groupData(k, 1)) {
					t.Fatalf("entry %d: %v", i, got[i].Status)
				}
			}
			if got[len(keys)].Status != abi.Absent || !bytes.Equal(dev.Mem(gputest.Base+uint64(len(keys))*gb, int(gb)), old) {
				t.Fatalf("absent entry: %v", got[len(keys)].Status)
			}
			wantDirect := uint64(0)
			if mode == "direct" {
				wantDirect = uint64(len(es))
			}
			if m := f.srv.Metrics(); m.GPUDirect != wantDirect {
				t.Fatalf("%d groups loaded directly, want %d", m.GPUDirect, wantDirect)
			}
			// LOAD_BLOCKS of blocks 3 and 2 (corrupt group) into an HND target.
			tid, errno := registerTarget(ss, testTarget(id, nb, false))
			if errno != 0 {
				t.Fatal(errno)
			}
			in := make([]byte, abi.BlocksInlineSize)
			bes := []abi.BlockEntry{
				{Block: 3, CacheBlock: 0, LayerCount: uint16(L), HeadCount: uint16(H), Kinds: abi.KindsBoth},
				{Block: 2, CacheBlock: 3, LayerCount: uint16(L), HeadCount: uint16(H), Kinds: abi.KindsBoth},
			}
			(&abi.Blocks{ABI: abi.Version, Target: tid, Count: uint32(len(bes))}).Marshal(in)
			for i := range bes {
				bes[i].Marshal(in[abi.BlocksSize+i*abi.BlockEntrySize:])
			}
			out := make([]byte, len(in))
			if _, errno := ss.Ioctl(abi.CmdLoadBlocksInline, in, out); errno != 0 {
				t.Fatal(errno)
			}
			for i := range bes {
				bes[i].Unmarshal(out[abi.BlocksSize+i*abi.BlockEntrySize:])
			}
			if bes[0].Status != abi.OK || int(bes[0].GroupsOK) != geo.GroupsPerBlock() ||
				bes[1].Status != abi.Corrupt || int(bes[1].GroupsOK) != geo.GroupsPerBlock()-1 {
				t.Fatalf("blocks: %+v, %+v", bes[0], bes[1])
			}
			for cb, b := range map[int]uint64{0: 3, 3: 2} {
				for _, k := range blockKeys(b) {
					off := (2*k.Layer+int(k.Kind))*tensor + (cb*H+k.Head)*T*rb
					tile := dev.Mem(gputest.Base+uint64(off), int(gb))
					want := groupData(k, int(b))
					if k == bad {
						want = make([]byte, gb)
					}
					if !bytes.Equal(tile, want) {
						t.Fatalf("%v in cache block %d differs", k, cb)
					}
				}
			}
			if mode == "direct" {
				wantDirect += uint64(2 * geo.GroupsPerBlock())
			}
			// A pitched tile in the batch: staged, the same bytes.
			es = []abi.Entry{entry(keys[0], id, n/2, 0), entry(keys[1], id, n/2+gb, uint32(2*rb))}
			if got := mustBatch(t, ss, true, es); got[0].Status != abi.OK || got[1].Status != abi.OK {
				t.Fatalf("batch with a pitched tile: %v, %v", got[0].Status, got[1].Status)
			}
			if m := f.srv.Metrics(); m.GPUDirect != wantDirect {
				t.Fatalf("%d groups loaded directly, want %d", m.GPUDirect, wantDirect)
			}
			if v := dev.Violations(); len(v) != 0 {
				t.Fatal(v)
			}
			ss.Release()
			if err := f.srv.Close(); err != nil {
				t.Fatal(err)
			}
			if r := dev.Registered(); r != 0 {
				t.Fatalf("%d host ranges still registered after Close", r)
			}
		})
	}
}

// TestVerifyOnGPUFallback: a device whose checksum kernel cannot load is
// refused with VerifyOnGPU alone (ENODEV), and with VerifyFallback (kvfs
// mount --gpu-verify auto) serves loads checksummed on the CPU: a corrupt
// group zeroed and reported, the others right.
func TestVerifyOnGPUFallback(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		t.Run(fmt.Sprint("fallback=", fallback), func(t *testing.T) {
			f, fakes := gpuFixture(t, 1, func(o *GPUOptions, fakes []*fakeGPU) {
				o.VerifyOnGPU, o.VerifyFallback = true, fallback
				o.NewVerifier = func(int, gpu.Geometry) (gpu.Checker, error) { return nil, errors.New("fake: no kernel for this GPU") }
			})
			f.mem.SetHostView(true)
			ss := f.open(0, 0)
			gb := uint64(f.gb)
			keys := blockKeys(1)
			n := uint64(len(keys)) * gb
			if !fallback {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				_, errno := registerCUDA(ss, uint32(unix.Gettid()), abi.RegisterCUDA{Handle: fakeHandle(gputest.Base, n), Length: n})
				if errno != syscall.ENODEV {
					t.Fatalf("register with no kernel: %v, want ENODEV", errno)
				}
				return
			}
			id := mustRegisterCUDA(t, ss, 0, gputest.Base, n, 0, n)
			f.put(keys, 3)
			f.corrupt(keys[1])
			var es []abi.Entry
			for i, k := range keys {
				es = append(es, entry(k, id, uint64(i)*gb, 0))
			}
			for i, r := range mustBatch(t, ss, true, es) {
				want, st := groupData(keys[i], 3), abi.OK
				if i == 1 {
					want, st = make([]byte, gb), abi.Corrupt
				}
				if r.Status != st || !bytes.Equal(fakes[0].Mem(gputest.Base+uint64(i)*gb, int(gb)), want) {
					t.Fatalf("entry %d: %v", i, r.Status)
				}
			}
			if m := f.srv.Metrics(); m.GPUDirect != 0 || m.GPUHostRegistered {
				t.Fatalf("direct loads without the GPU checksum: %+v", m)
			}
		})
	}
}

// TestGPUBlocksInParts: a call's items are built and tallied by up to
// maxParts goroutines, split between entries. The same LOAD_BLOCKS and
// STORE_BLOCKS calls (entries that load, are absent, are refused and are
// stored) give the same statuses and the same GPU memory built in one
// part as in four, and every entry lies in exactly one part.
func TestGPUBlocksInParts(t *testing.T) {
	geo := testGeo
	gpb := geo.GroupsPerBlock()
	ents := make([]blockEnt, 9)
	n := 0
	for i := range ents {
		if i != 4 {
			ents[i] = blockEnt{valid: true, groups: int32(gpb)}
			n += gpb
		}
	}
	defer func(v int) { partGroups = v }(partGroups)
	partGroups = 1
	parts := splitGroups(ents, n, nil, false)
	if len(parts) != maxParts {
		t.Fatalf("%d parts of %d entries, want %d", len(parts), len(ents), maxParts)
	}
	next, first := 0, 0
	for _, p := range parts {
		if p.lo != next || p.first != first {
			t.Fatalf("parts %+v are not contiguous", parts)
		}
		g := 0
		for i := p.lo; i < p.hi; i++ {
			g += int(ents[i].groups)
		}
		if g != p.items || g != p.groups || p.firstGroup != first {
			t.Fatalf("part %+v counts %d items, %d groups, its entries have %d", p, p.items, p.groups, g)
		}
		next, first = p.hi, first+p.items
	}
	if next != len(ents) || first != n {
		t.Fatalf("parts %+v cover %d entries and %d groups, want %d and %d", parts, next, first, len(ents), n)
	}

	run := func(pg int) ([]abi.BlockEntry, []abi.BlockEntry, []byte) {
		partGroups = pg
		f, fakes := gpuFixture(t, 1)
		dev := fakes[0]
		ss := f.open(0, 0)
		rb, T, H, L := geo.RowBytes(), geo.BlockTokens, geo.KVHeads, geo.Layers
		const nb = 8
		size := uint64(2 * L * nb * T * H * rb)
		id := mustRegisterCUDA(t, ss, 0, gputest.Base, size, 0, size)
		for _, b := range []uint64{1, 2, 3, 5} {
			f.put(blockKeys(b), int(b))
		}
		tid, errno := registerTarget(ss, testTarget(id, nb, false))
		if errno != 0 {
			t.Fatalf("register target: %v", errno)
		}
		whole := wholeBlock
		call := func(cmd uint32, es []abi.BlockEntry) []abi.BlockEntry {
			return blocksInline(t, ss, tid, cmd, es)
		}
		loaded := call(abi.CmdLoadBlocksInline, []abi.BlockEntry{
			whole(1, 0), whole(9, 1), whole(2, 2), whole(3, 3),
			whole(5, nb), // no such cache block: refused
			whole(5, 4), whole(8, 5), whole(2, 6), whole(1, 7),
		})
		stored := call(abi.CmdStoreBlocksInline, []abi.BlockEntry{whole(11, 0), whole(12, nb+1), whole(13, 3), whole(14, 4)})
		for _, k := range blockKeys(13) {
			k3 := k
			k3.Block = 3
			if !bytes.Equal(f.get(k), groupData(k3, 3)) {
				t.Fatalf("stored %v differs from the block it came from", k)
			}
		}
		if v := dev.Violations(); len(v) != 0 {
			t.Fatal(v)
		}
		return loaded, stored, dev.Mem(gputest.Base, int(size))
	}
	l1, s1, m1 := run(1 << 30)
	l4, s4, m4 := run(1)
	for i := range l1 {
		if l1[i] != l4[i] {
			t.Fatalf("load entry %d: %+v in one part, %+v in four", i, l1[i], l4[i])
		}
	}
	for i := range s1 {
		if s1[i] != s4[i] {
			t.Fatalf("store entry %d: %+v in one part, %+v in four", i, s1[i], s4[i])
		}
	}
	if !bytes.Equal(m1, m4) {
		t.Fatal("GPU memory differs between one part and four")
	}
	want := []abi.Status{abi.OK, abi.Absent, abi.OK, abi.OK, abi.BadRequest, abi.OK, abi.Absent, abi.OK, abi.OK}
	for i, e := range l4 {
		if e.Status != want[i] || (want[i] == abi.OK) != (int(e.GroupsOK) == gpb) {
			t.Fatalf("load entry %d: %+v, want status %v", i, e, want[i])
		}
	}
	if s4[0].Status != abi.OK || s4[1].Status != abi.BadRequest || s4[2].Status != abi.OK || s4[3].Status != abi.OK {
		t.Fatalf("store entries: %+v", s4)
	}
}

// wholeBlock is the entry of every layer, head and kind of block b into
// cache block cb (testGeo).
func wholeBlock(b uint64, cb uint32) abi.BlockEntry {
	return abi.BlockEntry{Block: b, CacheBlock: cb, LayerCount: uint16(testGeo.Layers), HeadCount: uint16(testGeo.KVHeads), Kinds: abi.KindsBoth}
}

// blocksInline makes the LOAD_BLOCKS or STORE_BLOCKS call cmd of entries
// es on target tid with the entries inline, and returns them as answered.
func blocksInline(t testing.TB, ss *Session, tid, cmd uint32, es []abi.BlockEntry) []abi.BlockEntry {
	t.Helper()
	in := make([]byte, abi.BlocksInlineSize)
	(&abi.Blocks{ABI: abi.Version, Target: tid, Count: uint32(len(es))}).Marshal(in)
	for i := range es {
		es[i].Marshal(in[abi.BlocksSize+i*abi.BlockEntrySize:])
	}
	out := make([]byte, len(in))
	if _, errno := ss.Ioctl(cmd, in, out); errno != 0 {
		t.Fatalf("blocks ioctl: %v", errno)
	}
	got := make([]abi.BlockEntry, len(es))
	for i := range got {
		got[i].Unmarshal(out[abi.BlocksSize+i*abi.BlockEntrySize:])
	}
	return got
}

// nullChecker checks groups "on the GPU" at no CPU cost, as the kernel
// does, and finds every one good: what BenchmarkGPULoadBlocks measures is
// the daemon's own work around it.
type nullChecker struct{}

func (nullChecker) Verify([]*gpu.Item) error            { return nil }
func (nullChecker) Land([]*gpu.Item, []uint64) error    { return nil }
func (nullChecker) Sum(_ [][]byte, crcs []uint32) error { clear(crcs); return nil }
func (nullChecker) Close() error                        { return nil }

// BenchmarkGPULoadBlocks measures LOAD_BLOCKS of whole blocks into
// token-major (NHD) GPU memory, in process, on the fake device, with the
// checksums on the "GPU" (nullChecker) and the store in memory but without
// a host view, so through staging as from a disk: the groups staged packed
// into device scratch and landed. What a real GPU load of a disk store
// spends on the CPU besides the store's I/O is this path's work per group
// (items, store requests, copies queued, outcomes): ns/group is the call's
// wall time per group, one caller, the in-memory store's and the fake's
// copies of testGeo's 512-byte groups included. (Head-major tiles of
// testGeo, four heads, are staged in destination order, which the eight
// heads of a real model's are not: not measured here.) The fake device's
// arena holds a landing batch's scratch (128 MiB) besides the target.
func BenchmarkGPULoadBlocks(b *testing.B) {
	const nb = abi.BlocksInlineMax
	geo := testGeo
	gpb := geo.GroupsPerBlock()
	rb, T, H, L := geo.RowBytes(), geo.BlockTokens, geo.KVHeads, geo.Layers
	size := uint64(2 * L * nb * T * H * rb)
	f, _ := gpuFixtureSized(b, 1, nb, int(size)+160<<20, func(o *GPUOptions, _ []*fakeGPU) {
		o.VerifyOnGPU = true
		o.NewVerifier = func(int, gpu.Geometry) (gpu.Checker, error) { return nullChecker{}, nil }
		o.StagingCount, o.StagingSize = 32, 1<<20
	})
	ss := f.open(0, 0)
	id := mustRegisterCUDA(b, ss, 0, gputest.Base, size, 0, size)
	for blk := range uint64(nb) {
		f.put(blockKeys(blk), int(blk))
	}
	tid, errno := registerTarget(ss, testTarget(id, nb, true))
	if errno != 0 {
		b.Fatalf("register target: %v", errno)
	}
	in, out := make([]byte, abi.BlocksInlineSize), make([]byte, abi.BlocksInlineSize)
	(&abi.Blocks{ABI: abi.Version, Target: tid, Count: nb}).Marshal(in)
	for i := range nb {
		e := wholeBlock(uint64(nb-1-i), uint32(i)) // distinct blocks, not in slot order
		e.Marshal(in[abi.BlocksSize+i*abi.BlockEntrySize:])
	}
	b.SetBytes(int64(nb * gpb * geo.GroupBytes()))
	b.ResetTimer()
	for range b.N {
		if n, errno := ss.Ioctl(abi.CmdLoadBlocksInline, in, out); errno != 0 || int(n) != nb {
			b.Fatalf("load blocks: %d ok, %v", n, errno)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*nb*gpb), "ns/group")
}

// fakeLander is fakeChecker with Land: groups copied packed into device
// scratch are checked there and their rows written into their tiles,
// zeros for one that differs. tiles counts the tiles (items of several
// heads) it was given, by Verify or Land.
type fakeLander struct {
	fakeChecker
	tiles int
}

func (c *fakeLander) Verify(items []*gpu.Item) error {
	c.count(items)
	return c.fakeChecker.Verify(items)
}

func (c *fakeLander) count(items []*gpu.Item) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, it := range items {
		if it.Tile != nil {
			c.tiles++
		}
	}
}

func (c *fakeLander) Land(items []*gpu.Item, srcs []uint64) error {
	c.count(items)
	c.mu.Lock()
	defer c.mu.Unlock()
	geo, dev := c.geo, c.dev
	eachGroup(items, geo, func(it *gpu.Item, i, j int, dst uint64, pitch int, crc uint32) {
		*c.verified++
		g := dev.Mem(srcs[i]+uint64(j*geo.GroupBytes), geo.GroupBytes)
		ok := store.CRC32C(g) == crc
		for r := range geo.Rows {
			b := make([]byte, geo.RowBytes)
			if ok {
				copy(b, g[r*geo.RowBytes:])
			}
			dev.Fill(dst+uint64(r*pitch), b)
		}
		if !ok {
			it.FailHead(j, fmt.Errorf("fake land: %w", store.ErrCorrupt))
		}
	})
	return nil
}

// layoutTarget is testTarget for layout lay: "hnd", "nhd", or "hf" (a
// Hugging Face sequence per (layer, kind), [heads, nb*block_tokens,
// head_dim]: cache block c's group of head h at h*seq + c*group bytes).
func layoutTarget(id uint32, nb int, lay string) *abi.Target {
	tg := testTarget(id, nb, lay == "nhd")
	if lay == "hf" {
		gb := uint64(testGeo.BlockTokens * testGeo.RowBytes())
		tg.BlockStride, tg.HeadStride = gb, uint64(nb)*gb
	}
	return tg
}

// tileLoad runs one LOAD_BLOCKS of es into an HND, NHD or HF target of nb
// cache blocks on a fake device whose memory starts as 0x5A, checked on
// the "GPU" (fakeLander) through staging, after put stored the blocks;
// with tiles off, one group per item. It returns the answered entries,
// the device memory and how many tiles the checker was given.
func tileLoad(t *testing.T, nb int, lay string, tiles bool, put func(f *fixture), es []abi.BlockEntry) ([]abi.BlockEntry, []byte, int) {
	t.Helper()
	// lay "-direct": the store's file in memory, registered with the
	// device, so loads copy straight from it.
	lay, direct := strings.CutSuffix(lay, "-direct")
	defer func(v bool) { noTiles = v }(noTiles)
	noTiles = !tiles
	geo := testGeo
	size := uint64(2 * geo.Layers * nb * geo.BlockTokens * geo.KVHeads * geo.RowBytes())
	verified := 0
	var chk *fakeLander
	// Room for a landing batch's device scratch (128 MiB) above the
	// target.
	f, fakes := gpuFixtureSized(t, 1, 16, int(size)+129<<20, func(o *GPUOptions, fakes []*fakeGPU) {
		o.VerifyOnGPU = true
		if lay == "hf" {
			// Room for several blocks per staging buffer: the tiles of
			// consecutive cache blocks are staged head by head.
			o.StagingSize = 2 * geo.GroupsPerBlock() * geo.GroupBytes()
		}
		o.NewVerifier = func(ordinal int, geo gpu.Geometry) (gpu.Checker, error) {
			chk = &fakeLander{fakeChecker: fakeChecker{dev: fakes[ordinal], geo: geo, verified: &verified}}
			return chk, nil
		}
	})
	dev := fakes[0]
	f.mem.SetHostView(direct)
	ss := f.open(0, 0)
	id := mustRegisterCUDA(t, ss, 0, gputest.Base, size, 0, size)
	for deadline := time.Now().Add(10 * time.Second); direct && !f.srv.Metrics().GPUHostRegistered; {
		if time.Now().After(deadline) {
			t.Fatal("the store file was never registered with the device")
		}
		time.Sleep(time.Millisecond)
	}
	dev.Fill(gputest.Base, bytes.Repeat([]byte{0x5A}, int(size)))
	put(f)
	tid, errno := registerTarget(ss, layoutTarget(id, nb, lay))
	if errno != 0 {
		t.Fatalf("register target: %v", errno)
	}
	got := blocksInline(t, ss, tid, abi.CmdLoadBlocksInline, es)
	if v := dev.Violations(); len(v) != 0 {
		t.Fatal(v)
	}
	if d := f.srv.Metrics().GPUDirect; direct != (d > 0) {
		t.Fatalf("%s, direct %v: %d groups loaded direct", lay, direct, d)
	}
	return got, dev.Mem(gputest.Base, int(size)), chk.tiles
}

// sameAsGroups fails t unless a load as tiles gave exactly what the same
// load a group per item gave: statuses, group counts and GPU memory. It
// returns the entries and how many tiles the checker was given.
func sameAsGroups(t *testing.T, nb int, lay string, put func(f *fixture), es []abi.BlockEntry) ([]abi.BlockEntry, int) {
	t.Helper()
	want, wmem, wt := tileLoad(t, nb, lay, false, put, es)
	got, gmem, gt := tileLoad(t, nb, lay, true, put, es)
	if wt != 0 {
		t.Fatalf("%s: %d tiles checked with tiles off", lay, wt)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: entry %d: %+v as tiles, %+v a group per item", lay, i, got[i], want[i])
		}
	}
	if !bytes.Equal(gmem, wmem) {
		t.Fatalf("%s: GPU memory differs between tiles and a group per item", lay)
	}
	return want, gt
}

// TestGPUBlocksTiles: a GPU load checked on the GPU through staging moves
// each (layer, kind) of an entry as one tile of its heads, into
// head-major (HND), token-major (NHD, landed from device scratch) and
// Hugging Face targets (heads a sequence apart), through staging and, the
// packed ones, straight from the store's file in memory, and gives exactly what it gives one group per item: the same
// GPU memory (a corrupt group zeroed, missing heads' tiles left alone, the
// heads outside a shard untouched) and the same statuses and group counts,
// for whole blocks, partial blocks, absent blocks, head ranges and single
// heads.
func TestGPUBlocksTiles(t *testing.T) {
	geo := testGeo
	H, L := geo.KVHeads, geo.Layers
	put := func(f *fixture) {
		for _, b := range []uint64{1, 2, 5} {
			f.put(blockKeys(b), int(b))
		}
		f.corrupt(blockKeys(2)[5])
		// Block 3: heads 0 and 2 of every (layer, kind); its layer 1 V
		// not at all.
		var part []layout.Key
		for _, k := range blockKeys(3) {
			if k.Head%2 == 0 && (k.Layer != 1 || k.Kind != layout.V) {
				part = append(part, k)
			}
		}
		f.put(part, 3)
	}
	es := []abi.BlockEntry{
		wholeBlock(1, 0), wholeBlock(2, 1), wholeBlock(3, 2), wholeBlock(4, 3),
		{Block: 5, CacheBlock: 4, LayerCount: uint16(L), HeadFirst: 1, HeadCount: 2, Kinds: abi.KindsBoth},
		{Block: 5, CacheBlock: 5, LayerFirst: 1, LayerCount: 1, HeadFirst: 3, HeadCount: 1, Kinds: abi.KindsV},
		{Block: 3, CacheBlock: 6, LayerCount: uint16(L), HeadFirst: 2, HeadCount: 2, Kinds: abi.KindsK},
	}
	for _, lay := range []string{"hnd", "nhd", "hf", "hnd-direct", "hf-direct"} {
		want, tiles := sameAsGroups(t, 8, lay, put, es)
		if tiles == 0 {
			t.Fatalf("%s: the checker was given no tiles", lay)
		}
		// What a group per item gives is right.
		gpb := uint32(geo.GroupsPerBlock())
		st := []abi.Status{abi.OK, abi.Corrupt, abi.Absent, abi.Absent, abi.OK, abi.OK, abi.Absent}
		ok := []uint32{gpb, gpb - 1, gpb/2 - uint32(H)/2, 0, gpb / 2, 1, uint32(L)}
		for i := range want {
			if want[i].Status != st[i] || want[i].GroupsOK != ok[i] {
				t.Fatalf("%s: entry %d: %v, %d groups, want %v, %d", lay, i, want[i].Status, want[i].GroupsOK, st[i], ok[i])
			}
		}
	}
}

// TestGPUBlocksTilesRandom: tiles give what a group per item gives for
// random stores (each group of 8 blocks stored or not, some corrupt) and
// random entries (layer, head and kind ranges of those blocks and absent
// ones), into HND, NHD and Hugging Face targets, and into Hugging Face
// ones straight from the store's file in memory.
func TestGPUBlocksTilesRandom(t *testing.T) {
	geo := testGeo
	H, L := geo.KVHeads, geo.Layers
	const nb = 8
	tiles := 0
	for seed := range uint64(6) {
		r := rand.New(rand.NewPCG(seed, 27))
		var stored, bad []layout.Key
		for b := range uint64(nb) {
			p := r.IntN(4) // 0: absent, 1: whole, else about half its groups
			for _, k := range blockKeys(b) {
				if p == 1 || p > 1 && r.IntN(2) == 0 {
					stored = append(stored, k)
					if r.IntN(40) == 0 {
						bad = append(bad, k)
					}
				}
			}
		}
		put := func(f *fixture) {
			f.put(stored, 1)
			for _, k := range bad {
				f.corrupt(k)
			}
		}
		es := make([]abi.BlockEntry, nb)
		for i := range es {
			lf, hf := r.IntN(L), r.IntN(H)
			es[i] = abi.BlockEntry{Block: uint64(r.IntN(nb + 2)), CacheBlock: uint32(i), LayerFirst: uint16(lf), LayerCount: uint16(1 + r.IntN(L-lf)),
				HeadFirst: uint16(hf), HeadCount: uint16(1 + r.IntN(H-hf)), Kinds: abi.KindsBoth}
			if k := r.IntN(3); k < 2 {
				es[i].Kinds = 1 << k
			}
		}
		for _, lay := range []string{"hnd", "nhd", "hf", "hf-direct"} {
			t.Run(fmt.Sprintf("seed=%d/%s", seed, lay), func(t *testing.T) {
				_, n := sameAsGroups(t, nb, lay, put, es)
				tiles += n
			})
		}
	}
	if tiles == 0 {
		t.Fatal("no load moved a tile")
	}
}
