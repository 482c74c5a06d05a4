package nvme

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	nvmedev "github.com/kvfs/kvfs/nvme"
	"github.com/kvfs/kvfs/store"
)

// testRings is the ring count of the tests that do not choose one: more
// than one, so the tests cover the spreading over rings (the rig's guest
// would get one from AutoRings).
const testRings = 2

func openTestEngine(t *testing.T, o EngineOptions) *Engine {
	t.Helper()
	path := testDevicePath(t)
	if o.Rings == 0 {
		o.Rings = testRings
	}
	if o.Logger == nil {
		o.Logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	e, err := OpenEngine(path, o)
	if err != nil {
		t.Fatalf("OpenEngine(%s): %v", path, err)
	}
	t.Cleanup(func() { _ = e.Close() })
	t.Logf("%s", e)
	return e
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}

func alloc(t *testing.T, e *Engine, n int, fixed bool) []byte {
	t.Helper()
	var (
		b   []byte
		err error
	)
	if fixed {
		b, err = e.AllocBuffer(n)
		t.Cleanup(func() { e.FreeBuffer(b) })
	} else {
		b, err = store.AllocAligned(n)
		t.Cleanup(func() { store.FreeAligned(b) })
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func doOK(t *testing.T, e *Engine, ios []store.IO) {
	t.Helper()
	if err := e.Do(ios); err != nil {
		t.Fatalf("Do: %v", err)
	}
	for i, io := range ios {
		if io.Err != nil {
			t.Fatalf("IO %d (%s %d bytes at %d): %v", i, io.Op, len(io.Buf), io.Off, io.Err)
		}
	}
}

func TestEngineRoundTrip(t *testing.T) {
	e := openTestEngine(t, EngineOptions{QueueDepth: 8})
	lba := e.Align()
	if e.Name() != "nvme" || e.Size() <= 0 || lba < 512 {
		t.Fatalf("name %q size %d align %d", e.Name(), e.Size(), lba)
	}
	before := e.Stats()
	for _, fixed := range []bool{true, false} {
		t.Run(fmt.Sprintf("fixed=%v", fixed), func(t *testing.T) {
			sizes := []int{lba, 3 * lba, 64 << 10, 256 << 10}
			var ios, reads []store.IO
			off := int64(1 << 20)
			if !fixed {
				off += 16 << 20
			}
			for i, n := range sizes {
				w := alloc(t, e, n, fixed)
				fill(w, uint64(i)+1)
				ios = append(ios, store.IO{Op: store.OpWrite, Off: off, Buf: w, Stream: store.StreamData + uint16(i)})
				reads = append(reads, store.IO{Op: store.OpRead, Off: off, Buf: alloc(t, e, n, fixed)})
				off += int64(n) + int64(lba)
			}
			doOK(t, e, ios)
			if err := e.Sync(); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			doOK(t, e, reads)
			for i := range ios {
				if !bytes.Equal(ios[i].Buf, reads[i].Buf) {
					t.Fatalf("IO %d: read back differs from what was written", i)
				}
			}
		})
	}
	s := e.Stats()
	t.Logf("stats %s", s)
	if s.FixedCommands == before.FixedCommands {
		t.Errorf("no command used a fixed buffer (kernel %s)", kernelRelease())
	}
	if s.Flushes < 2 {
		t.Errorf("flushes %d", s.Flushes)
	}
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// TestEngineBatchAboveTransferLimit: IOs larger than the transfer limit are
// split, and more commands than the queue depth are kept flowing.
func TestEngineBatchAboveTransferLimit(t *testing.T) {
	e := openTestEngine(t, EngineOptions{QueueDepth: 4})
	mx := e.MaxTransfer()
	lba := e.Align()
	sizes := []int{4*mx + 3*lba, mx, mx + lba, 2 << 20, lba}
	var writes, reads []store.IO
	off := int64(64 << 20)
	wantCmds := 0
	for i, n := range sizes {
		w := alloc(t, e, n, i%2 == 0)
		fill(w, uint64(100+i))
		writes = append(writes, store.IO{Op: store.OpWrite, Off: off, Buf: w, Stream: store.StreamData + uint16(i%store.DataStreams)})
		reads = append(reads, store.IO{Op: store.OpRead, Off: off, Buf: alloc(t, e, n, i%2 == 1)})
		off += int64(n)
		wantCmds += (n + mx - 1) / mx
	}
	before := e.Stats()
	doOK(t, e, writes)
	if got := e.Stats().Commands - before.Commands; got != uint64(wantCmds) {
		t.Errorf("%d commands for the writes, want %d (max transfer %d)", got, wantCmds, mx)
	}
	doOK(t, e, reads)
	for i := range writes {
		if !bytes.Equal(writes[i].Buf, reads[i].Buf) {
			t.Fatalf("IO %d of %d bytes: read back differs", i, len(writes[i].Buf))
		}
	}
	// One read spanning all of the writes at once.
	all := alloc(t, e, int(off-64<<20), true)
	doOK(t, e, []store.IO{{Op: store.OpRead, Off: 64 << 20, Buf: all}})
	var want []byte
	for _, w := range writes {
		want = append(want, w.Buf...)
	}
	if !bytes.Equal(all, want) {
		t.Fatal("spanning read differs")
	}
	t.Logf("max transfer %d, %d commands for %d bytes of writes; %s", mx, wantCmds, len(want), e.Stats())
}

func TestEngineErrors(t *testing.T) {
	e := openTestEngine(t, EngineOptions{QueueDepth: 4})
	lba := e.Align()
	b := alloc(t, e, 2*lba, true)
	ios := []store.IO{
		{Op: store.OpRead, Off: e.Size() - int64(lba), Buf: b}, // past the end
		{Op: store.OpWrite, Off: e.Size(), Buf: b[:lba]},       // past the end
		{Op: store.OpRead, Off: 7, Buf: b[:lba]},               // misaligned offset
		{Op: store.OpRead, Off: 0, Buf: b[:lba/2]},             // misaligned length
		{Op: store.OpRead, Off: int64(lba), Buf: b[1 : lba+1]}, // misaligned address
		{Op: store.OpRead, Off: int64(2 * lba), Buf: b[:lba]},  // fine
		{Op: store.OpWrite, Off: int64(3 * lba), Buf: b[:0]},   // empty: nothing to do
	}
	if err := e.Do(ios); err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{io.ErrUnexpectedEOF, nvmedev.ErrRange, nvmedev.ErrAlign, nvmedev.ErrAlign, nvmedev.ErrAlign, nil, nil} {
		if got := ios[i].Err; (want == nil) != (got == nil) || (want != nil && !errors.Is(got, want)) {
			t.Errorf("IO %d: %v, want %v", i, got, want)
		}
	}

	// A device status: make the engine believe the namespace is one block
	// larger and read that block. The controller answers LBA Out of Range.
	e.size += int64(lba)
	ios = []store.IO{{Op: store.OpRead, Off: e.size - int64(lba), Buf: b[:lba]}, {Op: store.OpRead, Off: 0, Buf: b[lba:]}}
	err := e.Do(ios)
	e.size -= int64(lba)
	if err != nil {
		t.Fatal(err)
	}
	var se *nvmedev.StatusError
	// Linux's NVMe over Fabrics target (bdev backend) does not check the
	// range itself: the block layer refuses the bio and the target answers
	// Internal Error (sc 06h, DNR). Accepted on a fabric namespace only.
	fabricInternal := func(err error) bool {
		var se *nvmedev.StatusError
		a := e.Attachment()
		ok := a != nil && a.Fabric() && errors.As(err, &se) && se.Status.SCT() == nvmedev.SCTGeneric && se.Status.SC() == 0x06 && se.Status.DNR()
		if ok {
			t.Logf("fabric target answered a read past the end with %v (not LBA Out of Range)", err)
		}
		return ok
	}
	if fabricInternal(ios[0].Err) {
		// checked
	} else if !errors.As(ios[0].Err, &se) || !errors.Is(ios[0].Err, nvmedev.ErrRange) || se.Status.SCT() != nvmedev.SCTGeneric || se.Status.SC() != 0x80 {
		t.Fatalf("read past the namespace: %v, want an LBA out of range status", ios[0].Err)
	}
	t.Logf("device status reported as: %v", ios[0].Err)
	if ios[1].Err != nil {
		t.Fatalf("the other IO of the batch: %v", ios[1].Err)
	}

	// The same through the ioctl path.
	d := e.Device()
	c, _ := nvmedev.ReadCmd(nvmedev.RW{NSID: d.NSID, SLBA: d.NS.NSZE, NLB: 1, Addr: addrOf(b), Len: uint32(lba)})
	if _, err := d.IO(c, b); !fabricInternal(err) && (!errors.As(err, &se) || !errors.Is(err, nvmedev.ErrRange)) {
		t.Fatalf("ioctl read past the end: %v", err)
	}

	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Do(ios); !errors.Is(err, store.ErrEngineClosed) {
		t.Fatalf("Do after Close: %v", err)
	}
	if err := e.Sync(); !errors.Is(err, store.ErrEngineClosed) {
		t.Fatalf("Sync after Close: %v", err)
	}
}

func TestEngineRegisterMemory(t *testing.T) {
	e := openTestEngine(t, EngineOptions{QueueDepth: 4, BufferPool: -1})
	mem := alloc(t, e, 1<<20, false)
	unregister, err := e.RegisterMemory(mem)
	if err != nil {
		t.Fatal(err)
	}
	fill(mem, 42)
	before := e.Stats().FixedCommands
	doOK(t, e, []store.IO{{Op: store.OpWrite, Off: 200 << 20, Buf: mem}})
	if e.Stats().FixedCommands == before {
		t.Errorf("registered memory not used as a fixed buffer")
	}
	unregister()
	got := alloc(t, e, 1<<20, false)
	doOK(t, e, []store.IO{{Op: store.OpRead, Off: 200 << 20, Buf: got}})
	if !bytes.Equal(got, mem) {
		t.Fatal("read back differs")
	}
	fixed := e.Stats().FixedCommands
	doOK(t, e, []store.IO{{Op: store.OpRead, Off: 200 << 20, Buf: mem}})
	if e.Stats().FixedCommands != fixed {
		t.Errorf("unregistered memory still used as a fixed buffer")
	}
}

// TestEnginePlacement checks, through the reclaim unit handle status, that
// a write tagged for a stream lowers exactly the available space of that
// stream's handle. (QEMU accepts invalid placement identifiers silently,
// so only the handle status proves where a write went.)
func TestEnginePlacement(t *testing.T) {
	if wantFDP() == "off" {
		t.Skip("booted without FDP")
	}
	e := openTestEngine(t, EngineOptions{QueueDepth: 8})
	info, err := e.FDPInfo()
	if err != nil {
		t.Fatal(err)
	}
	if !info.Enabled {
		t.Skipf("namespace without FDP: %s", info.Reason)
	}
	lba := e.Align()
	const blocks = 5
	buf := alloc(t, e, blocks*lba, true)
	off := int64(300 << 20)
	streams := []uint16{store.StreamMeta}
	for i := 0; i < store.DataStreams; i++ {
		streams = append(streams, store.StreamData+uint16(i))
	}
	seen := map[int]bool{}
	for _, s := range streams {
		h := e.Placement().Handle(s)
		seen[h] = true
		before, err := e.FDPInfo()
		if err != nil {
			t.Fatal(err)
		}
		fill(buf, uint64(s))
		doOK(t, e, []store.IO{{Op: store.OpWrite, Off: off, Buf: buf, Stream: s}})
		off += int64(len(buf))
		after, err := e.FDPInfo()
		if err != nil {
			t.Fatal(err)
		}
		for i := range after.Handles {
			want := before.Handles[i].RUAMW
			if i == h {
				want -= blocks
			}
			if after.Handles[i].RUAMW != want {
				t.Errorf("stream %d (handle %d, pid %d): handle %d available %d → %d, want %d",
					s, h, e.Placement().PID(s), i, before.Handles[i].RUAMW, after.Handles[i].RUAMW, want)
			}
		}
	}
	if len(info.Handles) >= 8 && len(seen) != 8 {
		t.Errorf("8 streams on %d handles, want 8", len(seen))
	}
	t.Logf("stats %s", e.Stats())

	// FDP "off" on the same namespace: writes go untagged, which the
	// controller places on placement handle 0, whatever the stream.
	e.Close()
	off2 := openTestEngine(t, EngineOptions{FDP: "off"})
	if len(off2.Placement().PIDs) != 0 {
		t.Fatalf("placement with FDP off: %v", off2.Placement())
	}
	before, err := off2.Device().RUHStatus()
	if err != nil {
		t.Fatal(err)
	}
	doOK(t, off2, []store.IO{{Op: store.OpWrite, Off: off, Buf: buf, Stream: store.StreamData + 4}})
	after, err := off2.Device().RUHStatus()
	if err != nil {
		t.Fatal(err)
	}
	for i := range after {
		want := before[i].RUAMW
		if i == 0 {
			want -= blocks
		}
		if after[i].RUAMW != want {
			t.Errorf("FDP off: handle %d available %d → %d, want %d", i, before[i].RUAMW, after[i].RUAMW, want)
		}
	}
}

// TestEngineNoFDP: on a namespace without FDP the engine works without
// placement (the fallback path) and says why.
func TestEngineNoFDP(t *testing.T) {
	if wantFDP() == "on" {
		t.Skip("booted with FDP")
	}
	e := openTestEngine(t, EngineOptions{})
	info, err := e.FDPInfo()
	if err != nil {
		t.Fatal(err)
	}
	if info.Enabled || info.Reason == "" || len(e.Placement().PIDs) != 0 {
		t.Fatalf("FDP info %+v, placement %v", info, e.Placement())
	}
	t.Logf("no FDP: %s", info.Reason)
	w := alloc(t, e, 128<<10, true)
	r := alloc(t, e, 128<<10, true)
	fill(w, 9)
	doOK(t, e, []store.IO{{Op: store.OpWrite, Off: 4 << 20, Buf: w, Stream: store.StreamData + 3}})
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	doOK(t, e, []store.IO{{Op: store.OpRead, Off: 4 << 20, Buf: r}})
	if !bytes.Equal(w, r) {
		t.Fatal("read back differs")
	}
}

func TestEngineBlockDevicePath(t *testing.T) {
	ng := testDevicePath(t)
	blk := strings.Replace(ng, "/ng", "/nvme", 1)
	if _, err := os.Stat(blk); err != nil {
		t.Skipf("no %s", blk)
	}
	e, err := OpenEngine(blk, EngineOptions{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Device().Path != ng {
		t.Fatalf("block device mapped to %s", e.Device().Path)
	}
}

// TestOpenNotNVMe: paths that are not NVMe namespaces are turned away.
func TestOpenNotNVMe(t *testing.T) {
	for _, path := range []string{"/dev/null", "/dev/nonexistent-ng9n9", "/proc/self/status"} {
		if _, err := OpenEngine(path, EngineOptions{}); !errors.Is(err, nvmedev.ErrUnavailable) {
			t.Errorf("OpenEngine(%s) = %v", path, err)
		}
	}
	if _, err := OpenEngine("/dev/null", EngineOptions{FDP: "sometimes"}); err == nil {
		t.Error("bad FDP option accepted")
	}
}

// testDevicePath returns the NVMe namespace to test on, or skips.
func testDevicePath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("KVFS_NVME_DEV")
	if p == "" {
		if _, err := os.Stat("/dev/ng0n1"); err != nil {
			t.Skip("no NVMe namespace: KVFS_NVME_DEV is unset and /dev/ng0n1 does not exist; `make test-nvme` runs this test under QEMU")
		}
		p = "/dev/ng0n1"
	}
	return p
}

// wantFDP is what the rig booted: KVFS_FDP=on|off ("" = don't check).
func wantFDP() string { return os.Getenv("KVFS_FDP") }

// TestEngineConcurrentBatches: two goroutines' Do batches share the ring's
// queue depth. Each batch is 8 single-command IOs, so a design that serves
// one batch at a time (the engine lock held for a whole batch, as before
// the shared ring owner) never has more than 8 commands in flight; here the
// batches overlap and the high-water mark passes 8. Every read returns
// what was written.
func TestEngineConcurrentBatches(t *testing.T) {
	for _, rings := range []int{1, 3} {
		t.Run(fmt.Sprintf("rings=%d", rings), func(t *testing.T) { testConcurrentBatches(t, rings) })
	}
}

func testConcurrentBatches(t *testing.T, rings int) {
	e := openTestEngine(t, EngineOptions{QueueDepth: 32, Rings: rings})
	if e.Rings() != rings {
		t.Fatalf("%d rings, want %d", e.Rings(), rings)
	}
	lba := e.Align()
	const perBatch, rounds = 8, 200
	n := max(lba, 16<<10)
	base := int64(256 << 20)
	type batch struct{ w, r []store.IO }
	mk := func(g int) batch {
		var b batch
		for i := 0; i < perBatch; i++ {
			off := base + int64((g*perBatch+i)*n)
			w := alloc(t, e, n, i%2 == 0)
			fill(w, uint64(1000+g*perBatch+i))
			b.w = append(b.w, store.IO{Op: store.OpWrite, Off: off, Buf: w})
			b.r = append(b.r, store.IO{Op: store.OpRead, Off: off, Buf: alloc(t, e, n, i%2 == 1)})
		}
		return b
	}
	batches := []batch{mk(0), mk(1)}
	for g := range batches {
		doOK(t, e, batches[g].w)
	}
	overlapped := -1
	for round := 0; round < rounds && overlapped < 0; round++ {
		start := make(chan struct{})
		errs := make(chan error, len(batches))
		for g := range batches {
			go func(b batch) {
				<-start
				if err := e.Do(b.r); err != nil {
					errs <- err
					return
				}
				for i := range b.r {
					if b.r[i].Err != nil {
						errs <- b.r[i].Err
						return
					}
					if !bytes.Equal(b.r[i].Buf, b.w[i].Buf) {
						errs <- fmt.Errorf("read %d at %d differs from what was written", i, b.r[i].Off)
						return
					}
				}
				errs <- nil
			}(batches[g])
		}
		close(start)
		for range batches {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if e.Stats().MaxInFlight > perBatch {
			overlapped = round
		}
	}
	st := e.Stats()
	t.Logf("after %d rounds of two concurrent %d-command batches: %s", overlapped+1, perBatch, st)
	if st.MaxInFlight <= perBatch {
		t.Fatalf("at most %d commands in flight over %d rounds of two concurrent batches of %d: the batches never overlapped", st.MaxInFlight, rounds, perBatch)
	}
}
