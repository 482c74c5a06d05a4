package gpu

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/ctl"
	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/gpu/cuda"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/tier"
)

// geo: 4 layers × 4 kv heads × 128 bf16 × 16 tokens: 4 KiB groups, 32 per
// block.
var geo = layout.Geometry{Layers: 4, KVHeads: 4, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}

type env struct {
	t   *testing.T
	dir string
	st  *store.Store
	mem *storetest.Mem
	// path is the store file in /dev/shm when the store is on a real
	// engine (mountDirect); mem is nil then.
	path string
	srv  *ctl.Server
	tier *tier.Tier // the DRAM tier in front of the store (mountTier), or nil
}

// requireGPU skips without root, /dev/fuse or a CUDA device.
func requireGPU(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to mount")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("skipping: /dev/fuse is missing")
	}
	if !cuda.Available() {
		t.Skipf("skipping: no CUDA device (%v)", cuda.Load())
	}
}

// mountStreams is the copy streams per device of the daemons mount starts
// (0: the default, one).
var mountStreams int

// mountDirect puts mount's store in a file in /dev/shm on the uring
// engine instead of memory of the test's: with the GPU verifying, packed
// loads then copy straight from the file (gpu.Pipeline.SetHost).
var mountDirect bool

// mountTier, when not 0, puts a DRAM tier of that many blocks in front of
// mount's store, as kvfs mount --dram does.
var mountTier int64

// mount mounts an in-memory store holding blocks 0..nblocks-1 in this
// process (the daemon).
// mount serves a store of nblocks blocks through a real FUSE mount, the
// daemon in this process. trustHandles turns the exporter check off: the
// tests that register another process's memory from this process (the
// daemon cannot open its own process's handles) need it.
func mount(t *testing.T, nblocks int, verifyOnGPU, trustHandles bool) *env {
	requireGPU(t)
	e := &env{t: t}
	size := store.SizeFor(geo, int64(nblocks)+64)
	var st *store.Store
	closeStore := func() error { return st.Close() }
	if mountDirect {
		// A store file in tmpfs on the uring engine: its host view is a
		// real mapping of the file, which the server registers with the
		// GPU.
		dir, err := os.MkdirTemp("/dev/shm", "kvfs-gpu-test-")
		if err != nil {
			t.Skipf("skipping: no /dev/shm: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		e.path = filepath.Join(dir, "store.kvfs")
		eo := engine.Options{Kind: engine.KindUring}
		if _, err := engine.FormatPath(e.path, engine.FormatPathOptions{Geometry: geo, Size: size, Engine: eo}); err != nil {
			t.Fatal(err)
		}
		if st, closeStore, err = engine.OpenStore(e.path, eo, store.Options{}); err != nil {
			t.Fatal(err)
		}
		if st.HostView() == nil {
			t.Fatal("a store file in /dev/shm offers no host view")
		}
	} else {
		e.mem = storetest.NewMem(size, 4096)
		if _, err := store.Format(e.mem, geo, store.FormatOptions{}); err != nil {
			t.Fatal(err)
		}
		var err error
		if st, err = store.Open(e.mem, store.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	e.st = st
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	var tr *tier.Tier
	if mountTier > 0 {
		var err error
		if tr, err = tier.New(st, tier.Options{Bytes: mountTier * geo.PayloadBytes(), Logger: log}); err != nil {
			t.Fatal(err)
		}
		e.tier = tr
	}
	e.srv = ctl.NewServer(st, ctl.Options{Logger: log, GPU: ctl.GPUOptions{StagingCount: 8, StagingSize: 1 << 20, VerifyOnGPU: verifyOnGPU, TrustHandles: trustHandles,
		Streams: mountStreams}, Tier: tr})
	e.dir = t.TempDir()
	srv, err := fs.Mount(e.dir, st, fs.Options{Logger: log, Ctl: fs.Handler(e.srv.Open), Tier: tr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 100 {
			if err = srv.Unmount(); err == nil || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		srv.Wait()
		if m := e.srv.Metrics(); m.Buffers != 0 {
			t.Errorf("registrations left: %+v", m)
		}
		if err := e.srv.Close(); err != nil {
			t.Errorf("server close: %v", err)
		}
		if tr != nil {
			tr.Close()
		}
		if err := st.CheckInvariants(); err != nil {
			t.Error(err)
		}
		if err := closeStore(); err != nil {
			t.Error(err)
		}
	})
	for b := range nblocks {
		e.put(uint64(b))
	}
	return e
}

func data(k layout.Key) []byte {
	b := make([]byte, geo.GroupBytes())
	r := rand.New(rand.NewPCG(k.Block, uint64(geo.Index(k))))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func (e *env) put(block uint64) {
	reqs := make([]store.WriteReq, geo.GroupsPerBlock())
	for i := range reqs {
		k := geo.KeyAt(block, i)
		reqs[i] = store.WriteReq{Key: k, Data: data(k)}
	}
	if err := e.st.Write(reqs); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) get(k layout.Key) []byte {
	buf := make([]byte, geo.GroupBytes())
	rr := []store.ReadReq{{Key: k, Buf: buf}}
	if err := e.st.Read(rr); err != nil || rr[0].Err != nil {
		e.t.Fatalf("read %v: %v %v", k, err, rr[0].Err)
	}
	return buf
}

// corrupt flips a byte of a stored group's payload.
func (e *env) corrupt(k layout.Key) {
	gi, err := e.st.Stat(k)
	if err != nil {
		e.t.Fatal(err)
	}
	sb := e.st.Superblock()
	off := sb.DataOffset + gi.Slot*sb.SlotBytes + 2*sb.HeaderBytes + geo.Offset(geo.Index(k))
	if e.mem == nil {
		f, err := os.OpenFile(e.path, os.O_RDWR, 0)
		if err != nil {
			e.t.Fatal(err)
		}
		defer f.Close()
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, off+7); err != nil {
			e.t.Fatal(err)
		}
		b[0] ^= 0xff
		if _, err := f.WriteAt(b, off+7); err != nil {
			e.t.Fatal(err)
		}
		return
	}
	img := e.mem.Image()
	e.mem.Poke(off+7, []byte{img[off+7] ^ 0xff})
}

// proc is a helper process of this test binary.
type proc struct {
	t   *testing.T
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func start(t *testing.T, mode string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{"KVFS_GPU_HELPER=" + mode}, env...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() {
		in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return p
}

// line reads the helper's next line; "error ..." fails the test.
func (p *proc) line() string {
	p.t.Helper()
	if !p.out.Scan() {
		p.t.Fatalf("helper ended: %v", p.out.Err())
	}
	l := p.out.Text()
	if strings.HasPrefix(l, "error") {
		p.t.Fatalf("helper: %s", l)
	}
	return l
}

// exporter starts a process owning n bytes of GPU memory and returns it
// and its IPC handle.
func exporterProc(t *testing.T, n int) (*proc, [64]byte) {
	p := start(t, "export", "KVFS_GPU_SIZE="+strconv.Itoa(n))
	f := strings.Fields(p.line())
	var h [64]byte
	if b, err := hex.DecodeString(f[len(f)-1]); err != nil || len(b) != 64 || f[0] != "handle" {
		t.Fatalf("exporter said %q", f)
	} else {
		copy(h[:], b)
	}
	return p, h
}

// dump returns the exporter's whole allocation.
func (p *proc) dump() []byte {
	p.t.Helper()
	path := filepath.Join(p.t.TempDir(), "dump")
	if _, err := io.WriteString(p.in, "dump "+path+"\n"); err != nil {
		p.t.Fatal(err)
	}
	p.line()
	b, err := os.ReadFile(path)
	if err != nil {
		p.t.Fatal(err)
	}
	return b
}

// nhdTile is the group's tile gathered from an NHD target's memory.
func nhdTile(mem []byte, tensor int, k layout.Key, cb int) []byte {
	rb, T, H := geo.RowBytes(), geo.BlockTokens, geo.KVHeads
	out := make([]byte, 0, geo.GroupBytes())
	for r := range T {
		off := (2*k.Layer+int(k.Kind))*tensor + (cb*T*H+r*H+k.Head)*rb
		out = append(out, mem[off:off+rb]...)
	}
	return out
}

// TestRoundTrip: blocks go from the store into another process's GPU memory
// (an NHD target through LOAD_BLOCKS, packed tiles through LOAD), land byte
// for byte, a corrupt group lands as zeros reported Corrupt, and STORE and
// STORE_BLOCKS from that memory store the same bytes.
func TestRoundTrip(t *testing.T) {
	for _, onGPU := range []bool{false, true} {
		t.Run(fmt.Sprintf("verify-on-gpu=%v", onGPU), func(t *testing.T) { roundTrip(t, onGPU) })
	}
	// Three copy streams: consecutive loads and stores take different
	// ones.
	mountStreams = 3
	defer func() { mountStreams = 0 }()
	t.Run("streams=3", func(t *testing.T) { roundTrip(t, false) })
	mountStreams = 0
	// The store file in tmpfs, registered with the GPU: loads copy
	// straight from it, packed tiles (LOAD) into place, pitched ones
	// (LOAD_BLOCKS into NHD) into device scratch that the kernel lands.
	mountDirect = true
	defer func() { mountDirect = false }()
	t.Run("direct", func(t *testing.T) { roundTrip(t, true) })
	mountDirect = false
	// A DRAM tier of half the blocks in front of the store: loads read
	// through it (promoting, evicting, the repeats hits), stores write
	// through it, and every outcome is the same.
	mountTier = 8
	defer func() { mountTier = 0 }()
	for _, onGPU := range []bool{false, true} {
		t.Run(fmt.Sprintf("dram-tier/verify-on-gpu=%v", onGPU), func(t *testing.T) {
			roundTrip(t, onGPU)
		})
	}
}

func roundTrip(t *testing.T, verifyOnGPU bool) {
	const nb = 16
	e := mount(t, nb, verifyOnGPU, true)
	c, err := client.Open(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info := c.Info()
	if !info.Has(abi.CapCUDA) {
		t.Fatal("INFO lacks KVFS_CAP_CUDA on a machine with a GPU")
	}
	tg := info.NHD(nb, 0, geo.KVHeads)
	tensor := int(tg.RegionBytes(info))
	gb := geo.GroupBytes()
	v1 := 2 * geo.Layers * tensor // packed tiles after the target
	size := v1 + nb*geo.GroupsPerBlock()*gb
	exp, h := exporterProc(t, size)
	id, err := c.RegisterCUDA(h, 0, uint64(size), 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 * geo.Layers {
		tg.Regions = append(tg.Regions, client.Region{Buffer: id, Offset: uint64(i * tensor)})
	}
	tid, err := c.RegisterTarget(tg)
	if err != nil {
		t.Fatal(err)
	}
	bad := geo.KeyAt(3, 5)
	e.corrupt(bad)
	if mountDirect {
		deadline := time.Now().Add(30 * time.Second)
		for !e.srv.Metrics().GPUHostRegistered {
			if time.Now().After(deadline) {
				t.Fatal("the store file was never registered with the GPU")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// LOAD_BLOCKS: block b into cache block nb-1-b.
	es := make([]client.BlockEntry, nb)
	for b := range es {
		es[b] = tg.WholeBlock(uint64(b), nb-1-b)
	}
	if n, err := c.LoadBlocks(tid, es); err != nil || n != nb-1 {
		t.Fatalf("load-blocks: %d ok, %v", n, err)
	}
	if es[3].Status != client.Corrupt || es[3].GroupsOK != uint32(geo.GroupsPerBlock()-1) {
		t.Fatalf("block with a corrupt group: %+v", es[3])
	}
	// LOAD: every group packed in order into the tail.
	var ents []client.Entry
	for b := range nb {
		for i := range geo.GroupsPerBlock() {
			ents = append(ents, client.Entry{Key: geo.KeyAt(uint64(b), i), Buffer: id, Offset: uint64(v1 + len(ents)*gb)})
		}
	}
	st, err := c.Load(ents)
	if err != nil {
		t.Fatal(err)
	}
	// Direct: the LOAD_BLOCKS into the NHD target (pitched tiles, landed
	// from device scratch by the kernel) and the LOAD (packed tiles).
	if m := e.srv.Metrics(); mountDirect && m.GPUDirect != uint64(nb*geo.GroupsPerBlock()+len(ents)) {
		t.Fatalf("%d groups loaded straight from the store file, want %d", m.GPUDirect, nb*geo.GroupsPerBlock()+len(ents))
	}
	mem := exp.dump()
	zero := make([]byte, gb)
	for b := range nb {
		for i := range geo.GroupsPerBlock() {
			k := geo.KeyAt(uint64(b), i)
			want, wantSt := data(k), client.OK
			if k == bad {
				want, wantSt = zero, client.Corrupt
			}
			if got := nhdTile(mem, tensor, k, nb-1-b); !bytes.Equal(got, want) {
				t.Fatalf("LOAD_BLOCKS: %v differs on the GPU", k)
			}
			n := b*geo.GroupsPerBlock() + i
			if st[n] != wantSt || !bytes.Equal(mem[v1+n*gb:v1+(n+1)*gb], want) {
				t.Fatalf("LOAD: %v: status %v, bytes equal %v", k, st[n], bytes.Equal(mem[v1+n*gb:v1+(n+1)*gb], want))
			}
		}
	}
	// Through a tier: the same block loaded twice in a row is a hit the
	// second time, and lands the same bytes.
	if e.tier != nil {
		again := func() {
			t.Helper()
			es := []client.BlockEntry{tg.WholeBlock(uint64(nb-1), 0)}
			if n, err := c.LoadBlocks(tid, es); err != nil || n != 1 {
				t.Fatalf("load-blocks again: %d ok, %v", n, err)
			}
		}
		again()
		hits := e.tier.Metrics().Hits
		again()
		if e.tier.Metrics().Hits == hits {
			t.Fatalf("a block loaded twice in a row missed the DRAM tier: %+v", e.tier.Metrics())
		}
		mem := exp.dump()
		for i := range geo.GroupsPerBlock() {
			if k := geo.KeyAt(uint64(nb-1), i); !bytes.Equal(nhdTile(mem, tensor, k, 0), data(k)) {
				t.Fatalf("LOAD_BLOCKS from the DRAM tier: %v differs on the GPU", k)
			}
		}
	}
	// STORE_BLOCKS cache block nb-1 (block 0) as block 1000, STORE the
	// packed tiles of block 1 as block 1001.
	sb := []client.BlockEntry{tg.WholeBlock(1000, nb-1)}
	if n, err := c.StoreBlocks(tid, sb); err != nil || n != 1 {
		t.Fatalf("store-blocks: %d, %v", n, err)
	}
	var sents []client.Entry
	for i := range geo.GroupsPerBlock() {
		k := geo.KeyAt(1001, i)
		sents = append(sents, client.Entry{Key: k, Buffer: id, Offset: uint64(v1 + (geo.GroupsPerBlock()+i)*gb)})
	}
	if st, err := c.Store(sents); err != nil {
		t.Fatal(err)
	} else {
		for i, s := range st {
			if s != client.OK {
				t.Fatalf("store entry %d: %v", i, s)
			}
		}
	}
	for i := range geo.GroupsPerBlock() {
		k0, k1 := geo.KeyAt(0, i), geo.KeyAt(1, i)
		if !bytes.Equal(e.get(geo.KeyAt(1000, i)), data(k0)) || !bytes.Equal(e.get(geo.KeyAt(1001, i)), data(k1)) {
			t.Fatalf("group %d stored from the GPU differs", i)
		}
	}
	// With the GPU checksum, the kernel summed every stored group over
	// pinned staging (and the reads above verified against those sums).
	if m := e.srv.Metrics(); verifyOnGPU && (m.GPUSummed != uint64(2*geo.GroupsPerBlock()) || m.GPUSumFailed != 0) {
		t.Fatalf("GPU checksums of stored groups: %d summed, %d failed; want %d, 0", m.GPUSummed, m.GPUSumFailed, 2*geo.GroupsPerBlock())
	}
	// LOAD_BLOCKS into a head-major (HND) target over the tail: block 3
	// (its corrupt group) into cache block 0, and a block stored with
	// heads 0 and 2 only into cache block 1, whose other heads' tiles keep
	// what LOAD put there. Checked on the GPU through staging, a block's
	// (layer, kind) moves as one tile of its heads.
	partial := uint64(nb + 1)
	var preqs []store.WriteReq
	for i := range geo.GroupsPerBlock() {
		if k := geo.KeyAt(partial, i); k.Head%2 == 0 {
			preqs = append(preqs, store.WriteReq{Key: k, Data: data(k)})
		}
	}
	if err := e.st.Write(preqs); err != nil {
		t.Fatal(err)
	}
	hnd := info.HND(nb, 0, geo.KVHeads)
	for i := range 2 * geo.Layers {
		hnd.Regions = append(hnd.Regions, client.Region{Buffer: id, Offset: uint64(v1 + i*tensor)})
	}
	hid, err := c.RegisterTarget(hnd)
	if err != nil {
		t.Fatal(err)
	}
	before := exp.dump()
	hes := []client.BlockEntry{hnd.WholeBlock(3, 0), hnd.WholeBlock(partial, 1)}
	if n, err := c.LoadBlocks(hid, hes); err != nil || n != 0 {
		t.Fatalf("HND load-blocks: %d ok, %v", n, err)
	}
	if hes[0].Status != client.Corrupt || hes[0].GroupsOK != uint32(geo.GroupsPerBlock()-1) ||
		hes[1].Status != client.Absent || hes[1].GroupsOK != uint32(geo.GroupsPerBlock()/2) {
		t.Fatalf("HND load-blocks: %+v, %+v", hes[0], hes[1])
	}
	// loaded checks blocks[cb] in cache block cb, each group where off
	// puts it: its bytes, zeros for the corrupt group, and what was there
	// before for the partial block's missing heads.
	loaded := func(what string, blocks []uint64, off func(k layout.Key, cb int) int) {
		t.Helper()
		mem := exp.dump()
		for cb, b := range blocks {
			for i := range geo.GroupsPerBlock() {
				k := geo.KeyAt(b, i)
				o := off(k, cb)
				want := data(k)
				switch {
				case k == bad:
					want = zero
				case b == partial && k.Head%2 == 1:
					want = before[o : o+gb]
				}
				if !bytes.Equal(mem[o:o+gb], want) {
					t.Fatalf("%s LOAD_BLOCKS: %v in cache block %d differs", what, k, cb)
				}
			}
		}
	}
	loaded("HND", []uint64{3, partial}, func(k layout.Key, cb int) int {
		return v1 + (2*k.Layer+int(k.Kind))*tensor + (cb*geo.KVHeads+k.Head)*gb
	})
	// LOAD_BLOCKS into a Hugging Face target (heads a sequence apart) over
	// the tail: block 3 into cache block 2, the partial block into cache
	// block 0 and block 5 into cache block 1. Direct from the store file
	// or the tier's memory, a (layer, kind)'s heads go packed into device
	// scratch and the kernel checks and places them.
	hf := info.HF(nb*geo.BlockTokens, 0, geo.KVHeads)
	for i := range 2 * geo.Layers {
		hf.Regions = append(hf.Regions, client.Region{Buffer: id, Offset: uint64(v1 + i*tensor)})
	}
	fid, err := c.RegisterTarget(hf)
	if err != nil {
		t.Fatal(err)
	}
	before = exp.dump()
	fes := []client.BlockEntry{hf.WholeBlock(3, 2), hf.WholeBlock(partial, 0), hf.WholeBlock(5, 1)}
	if n, err := c.LoadBlocks(fid, fes); err != nil || n != 1 {
		t.Fatalf("HF load-blocks: %d ok, %v", n, err)
	}
	if fes[0].Status != client.Corrupt || fes[0].GroupsOK != uint32(geo.GroupsPerBlock()-1) ||
		fes[1].Status != client.Absent || fes[1].GroupsOK != uint32(geo.GroupsPerBlock()/2) || fes[2].Status != client.OK {
		t.Fatalf("HF load-blocks: %+v, %+v, %+v", fes[0], fes[1], fes[2])
	}
	loaded("HF", []uint64{partial, 5, 3}, func(k layout.Key, cb int) int {
		return v1 + (2*k.Layer+int(k.Kind))*tensor + (k.Head*nb+cb)*gb
	})
	// Two prefixes forced onto one id: block 2000 stored from the GPU
	// under tag A (cache block nb-1 of the NHD target holds block 0's
	// bytes). A load into GPU memory that expects tag B is Absent with
	// TagMismatch and writes none of the block's bytes; one that expects
	// A lands them.
	ta, tb := client.Tag{0xA}, client.Tag{0xB}
	se := []client.BlockEntry{tg.WholeBlock(2000, nb-1)}
	se[0].Tag = ta
	if n, err := c.StoreBlocks(tid, se); err != nil || n != 1 {
		t.Fatalf("tagged store-blocks: %d, %v", n, err)
	}
	before = exp.dump()
	le := []client.BlockEntry{tg.WholeBlock(2000, 0)}
	le[0].Tag = tb
	if n, err := c.LoadBlocks(tid, le); err != nil || n != 0 || le[0].Status != client.Absent || le[0].Detail != client.TagMismatch {
		t.Fatalf("load-blocks expecting another tag: %d ok, %v, %+v", n, err, le[0])
	}
	if !bytes.Equal(exp.dump(), before) {
		t.Fatal("a load expecting another tag changed GPU memory")
	}
	le = []client.BlockEntry{tg.WholeBlock(2000, 0)}
	le[0].Tag = ta
	if n, err := c.LoadBlocks(tid, le); err != nil || n != 1 {
		t.Fatalf("load-blocks expecting the stored tag: %d ok, %v, %+v", n, err, le[0])
	}
	mem = exp.dump()
	for i := range geo.GroupsPerBlock() {
		if k := geo.KeyAt(2000, i); !bytes.Equal(nhdTile(mem, tensor, k, 0), data(geo.KeyAt(0, i))) {
			t.Fatalf("tagged LOAD_BLOCKS: %v differs on the GPU", k)
		}
	}
	for _, tid := range []client.TargetID{tid, hid, fid} {
		if err := c.UnregisterTarget(tid); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Unregister(id); err != nil {
		t.Fatal(err)
	}
	// A handle the driver cannot open, and a range past the allocation.
	if _, err := c.RegisterCUDA([64]byte{1}, 0, 4096, 0); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("garbage handle: %v, want EINVAL", err)
	}
	if _, err := c.RegisterCUDA(h, uint64(size)-4096, 8192, 0); !errors.Is(err, syscall.ERANGE) {
		t.Fatalf("range past the allocation: %v, want ERANGE", err)
	}
}

// TestClientKilledMidLoad: a client process loading into its own GPU
// memory is killed mid-call; its session's registrations are released and
// another client's loads go on, byte for byte.
func TestClientKilledMidLoad(t *testing.T) {
	const nb = 64
	e := mount(t, nb, false, true)
	c, err := client.Open(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info := c.Info()
	tg := info.NHD(nb, 0, geo.KVHeads)
	tensor := int(tg.RegionBytes(info))
	size := 2 * geo.Layers * tensor
	exp, h := exporterProc(t, size)
	id, err := c.RegisterCUDA(h, 0, uint64(size), 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 * geo.Layers {
		tg.Regions = append(tg.Regions, client.Region{Buffer: id, Offset: uint64(i * tensor)})
	}
	tid, err := c.RegisterTarget(tg)
	if err != nil {
		t.Fatal(err)
	}
	load := func(round int) {
		es := make([]client.BlockEntry, nb)
		for b := range es {
			es[b] = tg.WholeBlock(uint64((b+round)%nb), b)
		}
		if n, err := c.LoadBlocks(tid, es); err != nil || n != nb {
			t.Fatalf("round %d: %d ok, %v", round, n, err)
		}
	}
	check := func(round int) {
		mem := exp.dump()
		for cb := range nb {
			b := uint64((cb + round) % nb)
			for i := range geo.GroupsPerBlock() {
				k := geo.KeyAt(b, i)
				if !bytes.Equal(nhdTile(mem, tensor, k, cb), data(k)) {
					t.Fatalf("round %d: %v in cache block %d differs", round, k, cb)
				}
			}
		}
	}
	victim := start(t, "loader", "KVFS_GPU_MOUNT="+e.dir, "KVFS_GPU_BLOCKS="+strconv.Itoa(nb))
	if l := victim.line(); l != "loading" {
		t.Fatalf("loader said %q", l)
	}
	for round := range 3 {
		load(round)
	}
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.cmd.Wait()
	// The victim's session goes (its registration with it); ours stays.
	for i := 0; e.srv.Sessions() != 1; i++ {
		if i == 500 {
			t.Fatalf("%d sessions after the kill, want 1", e.srv.Sessions())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m := e.srv.Metrics(); m.Buffers != 1 {
		t.Fatalf("%d buffers registered after the kill, want ours only", m.Buffers)
	}
	for round := 3; round < 6; round++ {
		load(round)
	}
	check(5)
	c.UnregisterTarget(tid)
	c.Unregister(id)
}

// TestExporterChecked: with the exporter check on (kvfs mount's default),
// a caller cannot register memory another process exported (EACCES), and
// a client registering its own memory, from its own process, loads.
func TestExporterChecked(t *testing.T) {
	const nb = 8
	e := mount(t, nb, false, false)
	c, err := client.Open(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	exp, h := exporterProc(t, 1<<20)
	_ = exp
	if _, err := c.RegisterCUDA(h, 0, 1<<20, 0); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("registering another process's handle: %v, want EACCES", err)
	}
	if m := e.srv.Metrics(); m.Buffers != 0 {
		t.Fatalf("%d buffers registered after a refused registration", m.Buffers)
	}
	own := start(t, "loader", "KVFS_GPU_MOUNT="+e.dir, "KVFS_GPU_BLOCKS="+strconv.Itoa(nb))
	if l := own.line(); l != "loading" {
		t.Fatalf("a client registering its own memory said %q", l)
	}
	if err := own.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = own.cmd.Wait()
}
