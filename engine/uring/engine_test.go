package uring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/engine/posix"
	"github.com/kvfs/kvfs/store"
	iouring "github.com/kvfs/kvfs/uring"
)

// ---- a generic store.Engine conformance suite ----

// engineOpener opens an engine on an existing file.
type engineOpener func(t *testing.T, path string) store.Engine

func allocBuf(t *testing.T, e store.Engine, n int) []byte {
	t.Helper()
	if a, ok := e.(store.BufferAllocator); ok {
		b, err := a.AllocBuffer(n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.FreeBuffer(b) })
		return b
	}
	b, err := store.AllocAligned(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.FreeAligned(b) })
	return b
}

func newFile(t *testing.T, dir string, size int) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "engine-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

var errStale = errors.New("stale error the engine must clear")

// testEngineConformance checks the store.Engine contract on a file in dir.
func testEngineConformance(t *testing.T, dir string, open engineOpener) {
	const size = 4 << 20
	const unit = 4096

	t.Run("WriteSyncRead", func(t *testing.T) {
		path := newFile(t, dir, size)
		e := open(t, path)
		if e.Size() != size {
			t.Fatalf("Size = %d, want %d", e.Size(), size)
		}
		if a := e.Align(); a < 1 || a > unit {
			t.Fatalf("Align = %d", a)
		}
		var ios []store.IO
		off := int64(0)
		for i := 0; i < 24; i++ {
			n := unit * (1 + i%5)
			b := allocBuf(t, e, n)
			fill(b, uint64(i))
			ios = append(ios, store.IO{Op: store.OpWrite, Off: off, Buf: b, Stream: store.StreamData, Err: errStale})
			off += int64(n) + unit // leave holes
		}
		if err := e.Do(ios); err != nil {
			t.Fatal(err)
		}
		for i, w := range ios {
			if w.Err != nil {
				t.Fatalf("write %d: %v", i, w.Err)
			}
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
		check := func(e store.Engine) {
			t.Helper()
			rs := make([]store.IO, len(ios))
			for i, w := range ios {
				rs[i] = store.IO{Op: store.OpRead, Off: w.Off, Buf: allocBuf(t, e, len(w.Buf)), Err: errStale}
			}
			if err := e.Do(rs); err != nil {
				t.Fatal(err)
			}
			for i, r := range rs {
				if r.Err != nil {
					t.Fatalf("read %d: %v", i, r.Err)
				}
				if !bytes.Equal(r.Buf, pattern(len(r.Buf), uint64(i))) {
					t.Fatalf("read %d: data differs", i)
				}
			}
		}
		check(e)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		check(open(t, path))
	})

	t.Run("ErrorPerRequest", func(t *testing.T) {
		path := newFile(t, dir, size)
		e := open(t, path)
		good := allocBuf(t, e, unit)
		fill(good, 42)
		w := []store.IO{{Op: store.OpWrite, Off: unit, Buf: good}}
		if err := e.Do(w); err != nil || w[0].Err != nil {
			t.Fatalf("write: %v %v", err, w[0].Err)
		}
		ios := []store.IO{
			{Op: store.OpRead, Off: unit, Buf: allocBuf(t, e, unit), Err: errStale},
			{Op: store.OpRead, Off: size, Buf: allocBuf(t, e, unit), Err: errStale},          // past the end
			{Op: store.OpRead, Off: -unit, Buf: allocBuf(t, e, unit), Err: errStale},         // invalid
			{Op: store.OpRead, Off: size - unit, Buf: allocBuf(t, e, 2*unit), Err: errStale}, // across the end
			{Op: store.OpRead, Off: unit, Buf: allocBuf(t, e, unit), Err: errStale},
		}
		if err := e.Do(ios); err != nil {
			t.Fatalf("Do: %v (per-request failures must not fail the batch)", err)
		}
		for _, i := range []int{0, 4} {
			if ios[i].Err != nil || !bytes.Equal(ios[i].Buf, good) {
				t.Fatalf("good read %d: %v", i, ios[i].Err)
			}
		}
		if !errors.Is(ios[1].Err, io.ErrUnexpectedEOF) {
			t.Fatalf("read past the end: %v, want io.ErrUnexpectedEOF", ios[1].Err)
		}
		if !errors.Is(ios[2].Err, unix.EINVAL) {
			t.Fatalf("negative offset: %v, want EINVAL", ios[2].Err)
		}
		if ios[3].Err == nil {
			t.Fatal("read across the end succeeded")
		}
		// The engine keeps working after failures.
		again := []store.IO{{Op: store.OpRead, Off: unit, Buf: allocBuf(t, e, unit)}}
		if err := e.Do(again); err != nil || again[0].Err != nil || !bytes.Equal(again[0].Buf, good) {
			t.Fatalf("read after failures: %v %v", err, again[0].Err)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		path := newFile(t, dir, size)
		e := open(t, path)
		const workers, rounds, region = 8, 12, size / 8
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wbufs := make([][]byte, 4)
			rbufs := make([][]byte, 4)
			for i := range wbufs {
				wbufs[i] = allocBuf(t, e, 2*unit)
				rbufs[i] = allocBuf(t, e, 2*unit)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				base := int64(w * region)
				for r := 0; r < rounds; r++ {
					ws := make([]store.IO, len(wbufs))
					rs := make([]store.IO, len(wbufs))
					for i := range ws {
						off := base + int64((r*len(wbufs)+i)%(region/(2*unit)))*2*unit
						fill(wbufs[i], uint64(w<<20|r<<8|i))
						ws[i] = store.IO{Op: store.OpWrite, Off: off, Buf: wbufs[i]}
						rs[i] = store.IO{Op: store.OpRead, Off: off, Buf: rbufs[i]}
					}
					if err := e.Do(ws); err != nil {
						errs <- err
						return
					}
					if err := e.Do(rs); err != nil {
						errs <- err
						return
					}
					for i := range rs {
						if ws[i].Err != nil || rs[i].Err != nil {
							errs <- fmt.Errorf("worker %d: %v / %v", w, ws[i].Err, rs[i].Err)
							return
						}
						if !bytes.Equal(rs[i].Buf, wbufs[i]) {
							errs <- fmt.Errorf("worker %d round %d io %d: data differs", w, r, i)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	})

	t.Run("Closed", func(t *testing.T) {
		path := newFile(t, dir, size)
		e := open(t, path)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if err := e.Do([]store.IO{{Op: store.OpRead, Off: 0, Buf: allocBuf(t, e, unit)}}); err == nil {
			t.Fatal("Do after Close succeeded")
		}
		if err := e.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

func openUringT(o EngineOptions) engineOpener {
	return func(t *testing.T, path string) store.Engine {
		t.Helper()
		o := o
		o.Logger = zaptest.NewLogger(t)
		e, err := OpenEngine(path, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
}

func TestEngineConformance(t *testing.T) {
	needURing(t)
	for _, rings := range []int{1, testRings} {
		t.Run(fmt.Sprintf("uring-direct-rings=%d", rings), func(t *testing.T) {
			testEngineConformance(t, diskDir(t), openUringT(EngineOptions{Direct: true, QueueDepth: 16, BufferPool: 1 << 20, Rings: rings}))
		})
		t.Run(fmt.Sprintf("uring-buffered-shm-rings=%d", rings), func(t *testing.T) {
			dir, err := os.MkdirTemp("/dev/shm", "kvfs-uring-test-")
			if err != nil {
				t.Skipf("skipping: no /dev/shm: %v", err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			testEngineConformance(t, dir, openUringT(EngineOptions{Direct: true, QueueDepth: 4, Rings: rings}))
		})
	}
	// The suite itself is checked against the posix baseline.
	t.Run("posix-direct", func(t *testing.T) {
		testEngineConformance(t, diskDir(t), func(t *testing.T, path string) store.Engine {
			e, err := posix.Open(path, posix.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return e
		})
	})
}

// ---- uring engine specifics ----

// testRings is the ring count of the tests that do not choose one: more
// than one, so every test also exercises the spreading over rings (a
// 2-core machine's AutoRings is 1).
const testRings = 3

func openEngineT(t *testing.T, path string, o EngineOptions) *Engine {
	t.Helper()
	needURing(t)
	if o.Rings == 0 {
		o.Rings = testRings
	}
	o.Logger = zaptest.NewLogger(t)
	e, err := OpenEngine(path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func TestEngineRoundTripQD(t *testing.T) {
	needURing(t)
	dir := diskDir(t)
	const block = 16 << 10
	for qd := 1; qd <= 256; qd *= 2 {
		t.Run(fmt.Sprintf("QD=%d", qd), func(t *testing.T) {
			n := max(2*qd, 16)
			path := newFile(t, dir, n*block)
			// Half of the buffers come from the pool (fixed buffers), half
			// from elsewhere (plain READ/WRITE).
			e := openEngineT(t, path, EngineOptions{Direct: true, QueueDepth: qd, BufferPool: n * block})
			alloc := func(i int) []byte {
				if i%2 == 0 {
					b, err := e.AllocBuffer(block)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { e.FreeBuffer(b) })
					return b
				}
				return alignedBuf(t, block)
			}
			if !e.Direct() || e.Align() < 512 {
				t.Fatalf("direct %v align %d", e.Direct(), e.Align())
			}
			ws := make([]store.IO, n)
			rs := make([]store.IO, n)
			for i := range ws {
				b := alloc(i)
				fill(b, uint64(qd<<20|i))
				r := alloc(i)
				ws[i] = store.IO{Op: store.OpWrite, Off: int64(i * block), Buf: b}
				rs[i] = store.IO{Op: store.OpRead, Off: int64(i * block), Buf: r}
			}
			if err := e.Do(ws); err != nil {
				t.Fatal(err)
			}
			if err := e.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := e.Do(rs); err != nil {
				t.Fatal(err)
			}
			for i := range rs {
				if ws[i].Err != nil || rs[i].Err != nil {
					t.Fatalf("io %d: %v / %v", i, ws[i].Err, rs[i].Err)
				}
				if !bytes.Equal(rs[i].Buf, ws[i].Buf) {
					t.Fatalf("io %d: data differs", i)
				}
			}
			st := e.Stats()
			if st.IOs != uint64(2*n) || st.FixedSQEs != uint64(n) || st.SQEs != uint64(2*n) || st.Syncs != 1 {
				t.Fatalf("stats %v", st)
			}
		})
	}
}

func TestEngineShortReadEOF(t *testing.T) {
	needURing(t)
	dir := diskDir(t)
	for _, tc := range []struct {
		name       string
		size       int
		off, n     int
		wantPrefix int
	}{
		// A size that is not a multiple of the block: O_DIRECT returns the
		// partial block, the rest is past the end.
		{"partial-block", 10*4096 + 100, 8 * 4096, 4 * 4096, 2*4096 + 100},
		// A block-aligned size that is not a multiple of the request.
		{"aligned-size", 3<<20 + 4096, 3 << 20, 1 << 20, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			want := pattern(tc.size, 5)
			if err := os.WriteFile(p, want, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, direct := range []bool{true, false} {
				e := openEngineT(t, p, EngineOptions{Direct: direct, QueueDepth: 4, BufferPool: 2 << 20})
				b, err := e.AllocBuffer(tc.n)
				if err != nil {
					t.Fatal(err)
				}
				ios := []store.IO{
					{Op: store.OpRead, Off: int64(tc.off), Buf: b},
					{Op: store.OpRead, Off: 0, Buf: make([]byte, 0)},
				}
				if err := e.Do(ios); err != nil {
					t.Fatal(err)
				}
				if !errors.Is(ios[0].Err, io.ErrUnexpectedEOF) {
					t.Fatalf("direct=%v: %v, want io.ErrUnexpectedEOF", direct, ios[0].Err)
				}
				if !bytes.Equal(b[:tc.wantPrefix], want[tc.off:tc.off+tc.wantPrefix]) {
					t.Fatalf("direct=%v: bytes before the end differ", direct)
				}
				if ios[1].Err != nil {
					t.Fatalf("empty read: %v", ios[1].Err)
				}
				e.FreeBuffer(b)
			}
		})
	}
}

func TestEngineContinuesShortTransfers(t *testing.T) {
	// maxChunk cuts every request into odd-sized SQEs: the continuation
	// path that finishes short reads and writes.
	p := newFile(t, t.TempDir(), 0)
	e := openEngineT(t, p, EngineOptions{QueueDepth: 3, BufferPool: -1, maxChunk: 5000})
	const n = 1<<20 + 123
	w := pattern(n, 77)
	r := make([]byte, n)
	ios := []store.IO{{Op: store.OpWrite, Off: 11, Buf: w}}
	if err := e.Do(ios); err != nil || ios[0].Err != nil {
		t.Fatal(err, ios[0].Err)
	}
	ios = []store.IO{{Op: store.OpRead, Off: 11, Buf: r}}
	if err := e.Do(ios); err != nil || ios[0].Err != nil {
		t.Fatal(err, ios[0].Err)
	}
	if !bytes.Equal(r, w) {
		t.Fatal("data differs")
	}
	if st := e.Stats(); st.SQEs != 2*(n/5000+1) {
		t.Fatalf("stats %v", st)
	}
}

func TestEngineBufferedFallback(t *testing.T) {
	needURing(t)
	check := func(t *testing.T, e *Engine) {
		t.Helper()
		if e.Direct() || e.Align() != 1 {
			t.Fatalf("direct %v align %d, want buffered and 1", e.Direct(), e.Align())
		}
		w := pattern(1000, 3)
		r := make([]byte, 1000)
		ios := []store.IO{{Op: store.OpWrite, Off: 7, Buf: w}}
		if err := e.Do(ios); err != nil || ios[0].Err != nil {
			t.Fatal(err, ios[0].Err)
		}
		ios = []store.IO{{Op: store.OpRead, Off: 7, Buf: r}}
		if err := e.Do(ios); err != nil || ios[0].Err != nil || !bytes.Equal(r, w) {
			t.Fatal(err, ios[0].Err)
		}
	}
	t.Run("refused", func(t *testing.T) {
		check(t, openEngineT(t, newFile(t, t.TempDir(), 4096), EngineOptions{Direct: true, refuseDirect: true}))
	})
	t.Run("tmpfs", func(t *testing.T) {
		// tmpfs accepts O_DIRECT since Linux 6.6 but does page-cache I/O
		// with no alignment; older kernels refuse it (EINVAL). Either way
		// nothing needs aligning.
		dir, err := os.MkdirTemp("/dev/shm", "kvfs-uring-test-")
		if err != nil {
			t.Skipf("skipping: no /dev/shm: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		e := openEngineT(t, newFile(t, dir, 4096), EngineOptions{Direct: true})
		if e.Align() != 1 {
			t.Fatalf("align %d on tmpfs", e.Align())
		}
		w := pattern(1000, 3)
		ios := []store.IO{{Op: store.OpWrite, Off: 7, Buf: w}}
		if err := e.Do(ios); err != nil || ios[0].Err != nil {
			t.Fatal(err, ios[0].Err)
		}
	})
	t.Run("ramfs", func(t *testing.T) {
		// ramfs really refuses O_DIRECT at open.
		if os.Geteuid() != 0 {
			t.Skip("skipping: mounting ramfs needs root")
		}
		dir := t.TempDir()
		if err := unix.Mount("none", dir, "ramfs", 0, ""); err != nil {
			t.Skipf("skipping: cannot mount ramfs: %v", err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
			t.Fatal(err)
		}
		e, err := OpenEngine(p, EngineOptions{Direct: true, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		check(t, e)
	})
}

func TestEngineRegisterMemory(t *testing.T) {
	needURing(t)
	dir := diskDir(t)
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			path := newFile(t, dir, 1<<20)
			e := openEngineT(t, path, EngineOptions{Direct: true, QueueDepth: 8, BufferPool: 64 << 10, legacyBuffers: legacy, extraSlots: 2})
			mem := alignedBuf(t, 256<<10)
			fill(mem, 1)
			fixedDelta := func() uint64 {
				before := e.Stats().FixedSQEs
				// Requests of one batch run concurrently: write, then read.
				for _, rq := range []store.IO{
					{Op: store.OpWrite, Off: 0, Buf: mem[:64<<10]},
					{Op: store.OpRead, Off: 0, Buf: mem[128<<10 : 192<<10]},
				} {
					ios := []store.IO{rq}
					if err := e.Do(ios); err != nil || ios[0].Err != nil {
						t.Fatal(err, ios[0].Err)
					}
				}
				if !bytes.Equal(mem[:64<<10], mem[128<<10:192<<10]) {
					t.Fatal("data differs")
				}
				return e.Stats().FixedSQEs - before
			}
			if d := fixedDelta(); d != 0 {
				t.Fatalf("unregistered memory used %d fixed SQEs", d)
			}
			undo, err := e.RegisterMemory(mem)
			if err != nil {
				t.Fatal(err)
			}
			if d := fixedDelta(); d != 2 {
				t.Fatalf("registered memory used %d fixed SQEs, want 2", d)
			}
			// The pool still works alongside.
			pb, err := e.AllocBuffer(4096)
			if err != nil {
				t.Fatal(err)
			}
			ios := []store.IO{{Op: store.OpRead, Off: 0, Buf: pb}}
			before := e.Stats().FixedSQEs
			if err := e.Do(ios); err != nil || ios[0].Err != nil || e.Stats().FixedSQEs != before+1 {
				t.Fatal("pool read not fixed", err, ios[0].Err)
			}
			e.FreeBuffer(pb)
			if !legacy {
				// Two extra slots: the third registration does not fit.
				m2, m3 := alignedBuf(t, 8192), alignedBuf(t, 8192)
				undo2, err := e.RegisterMemory(m2)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := e.RegisterMemory(m3); !errors.Is(err, unix.ENOSPC) {
					t.Fatalf("third registration: %v, want ENOSPC", err)
				}
				undo2()
			}
			undo()
			undo() // idempotent
			if d := fixedDelta(); d != 0 {
				t.Fatalf("memory used %d fixed SQEs after undo", d)
			}
		})
	}
}

func TestEngineReadOnly(t *testing.T) {
	p := newFile(t, t.TempDir(), 8192)
	e := openEngineT(t, p, EngineOptions{ReadOnly: true, BufferPool: -1})
	ios := []store.IO{
		{Op: store.OpWrite, Off: 0, Buf: make([]byte, 4096)},
		{Op: store.OpRead, Off: 0, Buf: make([]byte, 4096)},
	}
	if err := e.Do(ios); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(ios[0].Err, unix.EBADF) || ios[1].Err != nil {
		t.Fatalf("write %v, read %v", ios[0].Err, ios[1].Err)
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
}

func TestEnginePool(t *testing.T) {
	p := newFile(t, t.TempDir(), 4096)
	e := openEngineT(t, p, EngineOptions{BufferPool: 1 << 20, BufferPoolMax: -1}) // rounded up to 2 MiB; no growth
	if len(e.ring.PoolMem()) != 2<<20 || addrOf(e.ring.PoolMem())%(2<<20) != 0 {
		t.Fatalf("pool of %d bytes at %#x, want 2 MiB aligned to 2 MiB", len(e.ring.PoolMem()), addrOf(e.ring.PoolMem()))
	}
	const chunk = 128 << 10
	var bufs [][]byte
	for i := 0; i < 16; i++ {
		b, err := e.AllocBuffer(chunk - 100) // rounds to a page
		if err != nil {
			t.Fatal(err)
		}
		if !e.ring.PoolOwns(b) || len(b) != chunk-100 || addrOf(b)%4096 != 0 {
			t.Fatalf("buffer %d not from the pool", i)
		}
		bufs = append(bufs, b)
	}
	over, err := e.AllocBuffer(4096) // pool exhausted: falls back
	if err != nil || e.ring.PoolOwns(over) || addrOf(over)%4096 != 0 {
		t.Fatalf("fallback buffer: %v", err)
	}
	e.FreeBuffer(over)
	// Free in an order that needs merging on both sides.
	for _, i := range []int{1, 3, 2, 0, 15, 14, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} {
		e.FreeBuffer(bufs[i])
	}
	if e.ring.PoolInUse() != 0 || e.ring.PoolFreeExtents() != 1 {
		t.Fatalf("pool not coalesced: used %d, %d free extents", e.ring.PoolInUse(), e.ring.PoolFreeExtents())
	}
	whole, err := e.AllocBuffer(2 << 20)
	if err != nil || !e.ring.PoolOwns(whole) {
		t.Fatalf("whole pool: %v", err)
	}
	e.FreeBuffer(whole)
}

func TestEngineCloseWhileBusy(t *testing.T) {
	p := newFile(t, t.TempDir(), 1<<20)
	needURing(t)
	e, err := OpenEngine(p, EngineOptions{QueueDepth: 4, BufferPool: -1, Rings: testRings})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := 0; ; i++ {
				ios := []store.IO{{Op: store.OpRead, Off: int64(rand.IntN(256)) * 4096, Buf: buf}}
				err := e.Do(ios)
				if errors.Is(err, store.ErrEngineClosed) {
					return
				}
				if err != nil || ios[0].Err != nil {
					t.Errorf("Do: %v %v", err, ios[0].Err)
					return
				}
			}
		}()
	}
	for e.Stats().IOs < 200 {
		runtimeGosched()
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := e.Sync(); !errors.Is(err, store.ErrEngineClosed) {
		t.Fatalf("Sync after Close: %v", err)
	}
}

func TestEngineDoAsync(t *testing.T) {
	p := newFile(t, t.TempDir(), 1<<20)
	e := openEngineT(t, p, EngineOptions{QueueDepth: 4, BufferPool: -1})
	want := pattern(1<<20, 21)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	// Each completion starts the next read of its slot (from the ring
	// goroutine), as a benchmark keeping a queue full does.
	const slots, perSlot = 4, 50
	ios := make([]store.IO, slots)
	count := make([]int, slots)
	done := make(chan struct{})
	var mu sync.Mutex
	left := slots
	var failed error
	cbs := make([]func(int), slots)
	for w := range cbs {
		ios[w] = store.IO{Op: store.OpRead, Buf: make([]byte, 4096)}
		cbs[w] = func(i int) {
			if i != 0 {
				t.Errorf("callback index %d", i)
			}
			mu.Lock()
			defer mu.Unlock()
			if ios[w].Err != nil || !bytes.Equal(ios[w].Buf, want[ios[w].Off:ios[w].Off+4096]) {
				failed = fmt.Errorf("slot %d: %v", w, ios[w].Err)
			}
			if count[w]++; count[w] == perSlot || failed != nil {
				if left--; left == 0 {
					close(done)
				}
				return
			}
			ios[w].Off = int64((count[w]*slots + w) % 256 * 4096)
			if err := e.DoAsync(ios[w:w+1], cbs[w]); err != nil {
				failed = err
			}
		}
	}
	for w := range cbs {
		mu.Lock()
		ios[w].Off = int64(w * 4096)
		mu.Unlock()
		if err := e.DoAsync(ios[w:w+1], cbs[w]); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	if failed != nil {
		t.Fatal(failed)
	}
	// Per-request errors reach the callback too.
	errs := make(chan error, 2)
	bad := []store.IO{
		{Op: store.OpRead, Off: 2 << 20, Buf: make([]byte, 4096)},
		{Op: store.OpRead, Off: -1, Buf: make([]byte, 4096)},
	}
	if err := e.DoAsync(bad, func(i int) { errs <- bad[i].Err }); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := <-errs; err == nil {
			t.Fatal("bad request succeeded")
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.DoAsync(bad, func(int) {}); !errors.Is(err, store.ErrEngineClosed) {
		t.Fatalf("DoAsync after Close: %v", err)
	}
}

func TestEnginePoolAfterClose(t *testing.T) {
	p := newFile(t, t.TempDir(), 4096)
	e := openEngineT(t, p, EngineOptions{BufferPool: 2 << 20})
	out, err := e.AllocBuffer(4096)
	if err != nil || !e.ring.PoolOwns(out) {
		t.Fatal("pool buffer", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	out[0] = 1 // a chunk out at Close stays mapped
	b, err := e.AllocBuffer(4096)
	if err != nil || e.ring.PoolOwns(b) {
		t.Fatalf("AllocBuffer after Close: %v (from the pool: %v)", err, e.ring.PoolOwns(b))
	}
	e.FreeBuffer(b)
	e.FreeBuffer(out) // the last chunk: the pool is unmapped now
	if e.ring.PoolMem() != nil {
		t.Fatal("pool still mapped after its last chunk came back")
	}
}

// TestEngineBlockDevice runs the engine on a loop device over a file:
// Size comes from BLKGETSIZE64 and Align from the logical block size.
func TestEngineBlockDevice(t *testing.T) {
	needURing(t)
	if os.Geteuid() != 0 {
		t.Skip("skipping: attaching a loop device needs root")
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("skipping: no loop devices: %v", err)
	}
	defer ctl.Close()
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	if err != nil {
		t.Skipf("skipping: LOOP_CTL_GET_FREE: %v", err)
	}
	const size = 8 << 20
	backing, err := os.OpenFile(newFile(t, diskDir(t), size), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer backing.Close()
	dev := fmt.Sprintf("/dev/loop%d", n)
	loop, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	defer loop.Close()
	if err := unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_SET_FD, int(backing.Fd())); err != nil {
		t.Skipf("skipping: LOOP_SET_FD: %v", err)
	}
	defer unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_CLR_FD, 0)
	e := openEngineT(t, dev, EngineOptions{Direct: true, QueueDepth: 8, BufferPool: 2 << 20})
	if e.Size() != size || !e.Direct() || e.Align() < 512 {
		t.Fatalf("%s: size %d direct %v align %d", dev, e.Size(), e.Direct(), e.Align())
	}
	b, err := e.AllocBuffer(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer e.FreeBuffer(b)
	fill(b, 99)
	w := []store.IO{{Op: store.OpWrite, Off: size - 64<<10, Buf: b}}
	if err := e.Do(w); err != nil || w[0].Err != nil {
		t.Fatal(err, w[0].Err)
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	r := []store.IO{
		{Op: store.OpRead, Off: size - 64<<10, Buf: alignedBuf(t, 64<<10)},
		{Op: store.OpRead, Off: size, Buf: alignedBuf(t, 4096)}, // past the end
	}
	if err := e.Do(r); err != nil || r[0].Err != nil || !bytes.Equal(r[0].Buf, pattern(64<<10, 99)) {
		t.Fatal(err, r[0].Err)
	}
	if !errors.Is(r[1].Err, io.ErrUnexpectedEOF) {
		t.Fatalf("read past the device end: %v", r[1].Err)
	}
}

// TestEngineRingFailure: an io_uring_enter failure (injected) surfaces as
// the engine's error, wrapped "uring: ring failed", on the batch in flight
// and every later call; Close still releases everything and is idempotent.
// (The memory-safety rule itself is tested in ringowner with requests that
// stay in flight.)
func TestEngineRingFailure(t *testing.T) {
	p := newFile(t, t.TempDir(), 1<<20)
	boom := errors.New("injected enter failure")
	var fail atomic.Bool
	e := openEngineT(t, p, EngineOptions{QueueDepth: 4, BufferPool: 2 << 20, enterHook: func(uint64) error {
		if fail.Load() {
			return boom
		}
		return nil
	}})
	buf, err := e.AllocBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	ios := []store.IO{{Op: store.OpRead, Off: 0, Buf: buf}}
	if err := e.Do(ios); err != nil || ios[0].Err != nil {
		t.Fatal(err, ios[0].Err)
	}
	fail.Store(true)
	err = e.Do(ios)
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "uring: ring failed") {
		t.Fatalf("Do on a failing ring: %v", err)
	}
	if err := e.Sync(); !errors.Is(err, boom) {
		t.Fatalf("Sync after the failure: %v", err)
	}
	if _, err := e.RegisterMemory(buf); !errors.Is(err, boom) {
		t.Fatalf("RegisterMemory after the failure: %v", err)
	}
	e.FreeBuffer(buf)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestEnginePoolGrowsRegisteredOnEveryRing: buffers beyond the first pool
// segment come from grown segments, registered on every ring, so reads into
// them through any ring are READ_FIXED and land the file's bytes.
func TestEnginePoolGrowsRegisteredOnEveryRing(t *testing.T) {
	const size = 8 << 20
	p := newFile(t, t.TempDir(), size)
	want := pattern(size, 7)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	e := openEngineT(t, p, EngineOptions{Rings: 3, QueueDepth: 8, BufferPool: 2 << 20, BufferPoolMax: 8 << 20})
	var bufs [][]byte
	for i := 0; i < 4; i++ {
		b, err := e.AllocBuffer(2 << 20)
		if err != nil || !e.ring.PoolOwns(b) {
			t.Fatalf("buffer %d: %v, from the pool %v", i, err, e.ring.PoolOwns(b))
		}
		bufs = append(bufs, b)
	}
	if e.Stats().PoolBytes != 8<<20 {
		t.Fatalf("pool of %d bytes, want 8 MiB", e.Stats().PoolBytes)
	}
	// Registration is asynchronous: three segments on three rings.
	for deadline := time.Now().Add(10 * time.Second); e.ring.Stats().PoolSegments < 9; {
		if time.Now().After(deadline) {
			t.Fatalf("grown segments registered %d times, want 9", e.ring.Stats().PoolSegments)
		}
		time.Sleep(time.Millisecond)
	}
	before := e.Stats()
	for round := 0; round < 3; round++ { // round robin: every buffer through every ring
		for i, b := range bufs {
			off := int64((i + round) % 4 * (2 << 20))
			ios := []store.IO{{Op: store.OpRead, Off: off, Buf: b}}
			if err := e.Do(ios); err != nil || ios[0].Err != nil {
				t.Fatal(err, ios[0].Err)
			}
			if !bytes.Equal(b, want[off:off+2<<20]) {
				t.Fatalf("buffer %d: wrong bytes", i)
			}
		}
	}
	after := e.Stats()
	if sqes, fixed := after.SQEs-before.SQEs, after.FixedSQEs-before.FixedSQEs; sqes != 12 || fixed != 12 {
		t.Fatalf("%d SQEs, %d of them fixed; want 12 and 12", sqes, fixed)
	}
	for i := 0; i < e.ring.N(); i++ {
		if e.ring.Ring(i).Stats().FixedSQEs == 0 {
			t.Errorf("ring %d read nothing fixed", i)
		}
	}
	for _, b := range bufs {
		e.FreeBuffer(b)
	}
}

// TestEngineAsyncReads: reads of page-cache I/O (tmpfs, buffered) carry
// IOSQE_ASYNC by default, so io-wq may copy them on many cores; real
// O_DIRECT reads do not (the block layer completes them without io-wq);
// "on"/"off" override; anything else is refused. (The conformance suite
// checks the bytes of async reads on /dev/shm.)
func TestEngineAsyncReads(t *testing.T) {
	needURing(t)
	shm, err := os.MkdirTemp("/dev/shm", "kvfs-uring-test-")
	if err != nil {
		t.Skipf("skipping: no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	disk := diskDir(t)
	for _, tc := range []struct {
		name, dir, opt string
		direct, want   bool
	}{
		{"tmpfs-auto", shm, "", true, true},
		{"tmpfs-off", shm, "off", true, false},
		{"buffered-auto", disk, "auto", false, true},
		{"direct-auto", disk, "", true, !directOK(disk)},
		{"direct-on", disk, "on", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := openEngineT(t, newFile(t, tc.dir, 1<<20), EngineOptions{Direct: tc.direct, AsyncReads: tc.opt, Rings: 2})
			for i, d := range e.drvs {
				if d.async != tc.want {
					t.Fatalf("ring %d: async reads %v, want %v", i, d.async, tc.want)
				}
				var sqe iouring.SQE
				buf := make([]byte, 4096)
				if err := d.PrepIO(&sqe, &store.IO{Op: store.OpRead, Buf: buf}, buf, 0, -1); err != nil {
					t.Fatal(err)
				}
				if got := sqe.Flags&iouring.SQEAsync != 0; got != tc.want {
					t.Fatalf("read SQE async %v, want %v", got, tc.want)
				}
				sqe = iouring.SQE{}
				if err := d.PrepIO(&sqe, &store.IO{Op: store.OpWrite, Buf: buf}, buf, 0, -1); err != nil {
					t.Fatal(err)
				}
				if sqe.Flags&iouring.SQEAsync != 0 {
					t.Fatal("write SQE carries IOSQE_ASYNC")
				}
			}
		})
	}
	if _, err := OpenEngine(newFile(t, shm, 4096), EngineOptions{AsyncReads: "always"}); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("AsyncReads \"always\": %v, want EINVAL", err)
	}
}

// TestEngineReadVec: a vector read (IORING_OP_READV) with more segments
// than one SQE takes lands every byte in its segment, in order, on a real
// O_DIRECT file and on a buffered /dev/shm file, and leaves the memory
// between segments untouched; completions reach DoNotify's callback once
// per request; an unaligned segment under O_DIRECT is refused.
func TestEngineReadVec(t *testing.T) {
	needURing(t)
	dirs := map[string]string{"direct": diskDir(t)}
	if shm, err := os.MkdirTemp("/dev/shm", "kvfs-uring-test-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(shm) })
		dirs["shm"] = shm
	}
	for name, dir := range dirs {
		t.Run(name, func(t *testing.T) {
			const seg, nseg = 4096, 1500
			data := pattern(seg*nseg, 9)
			p := filepath.Join(dir, "f")
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			e := openEngineT(t, p, EngineOptions{Direct: true, QueueDepth: 8, BufferPool: -1})
			if !e.drvs[0].readv {
				t.Skip("skipping: kernel lacks IORING_OP_READV")
			}
			// Offered to the store for page-cache I/O only (see
			// VectorReads); served either way.
			if e.VectorReads() != (name == "shm") {
				t.Fatalf("VectorReads %v on %s", e.VectorReads(), name)
			}
			mem := alignedBuf(t, 2*len(data))
			for i := range mem {
				mem[i] = 0xA5
			}
			vec := make([][]byte, nseg)
			for i := range vec {
				vec[i] = mem[2*i*seg : (2*i+1)*seg]
			}
			// Two requests: the segments in two halves, the second half
			// first in the batch.
			h := nseg / 2
			ios := []store.IO{
				{Op: store.OpRead, Off: int64(h * seg), Vec: vec[h:]},
				{Op: store.OpRead, Off: 0, Vec: vec[:h]},
			}
			var calls [2]int
			if err := e.DoNotify(ios, func(i int) { calls[i]++ }); err != nil || ios[0].Err != nil || ios[1].Err != nil {
				t.Fatalf("%v %v %v", err, ios[0].Err, ios[1].Err)
			}
			if calls != [2]int{1, 1} {
				t.Fatalf("done called %v times", calls)
			}
			for i := range nseg {
				if !bytes.Equal(vec[i], data[i*seg:(i+1)*seg]) {
					t.Fatalf("segment %d differs", i)
				}
				if gap := mem[(2*i+1)*seg : (2*i+2)*seg]; !bytes.Equal(gap, bytes.Repeat([]byte{0xA5}, seg)) {
					t.Fatalf("memory after segment %d written", i)
				}
			}
			// Past the end: an error, not a short success.
			ios = []store.IO{{Op: store.OpRead, Off: int64(len(data) - seg), Vec: vec[:2]}}
			if err := e.Do(ios); err != nil || !errors.Is(ios[0].Err, io.ErrUnexpectedEOF) {
				t.Fatalf("read past the end: %v %v", err, ios[0].Err)
			}
			if e.Direct() && e.Align() > 1 {
				ios = []store.IO{{Op: store.OpRead, Off: 0, Vec: [][]byte{mem[1 : 1+seg]}}}
				if err := e.Do(ios); err != nil || !errors.Is(ios[0].Err, unix.EINVAL) {
					t.Fatalf("unaligned segment under O_DIRECT: %v %v", err, ios[0].Err)
				}
			}
		})
	}
}

// TestEngineMappedWrites: on a file in memory, writes are copies into the
// file's mapping (counted in MappedIOs, none through a ring), visible to
// reads; a write past the end, or into memory the file no longer backs
// (truncated under the engine), fails alone with a clear error instead of
// crashing the daemon. A read-only engine, InlineReads off and a file on
// a disk write through the rings.
func TestEngineMappedWrites(t *testing.T) {
	const size = 1 << 20
	dir := shmDir(t)
	path := newFile(t, dir, size)
	e := openEngineT(t, path, EngineOptions{Direct: true, QueueDepth: 8})
	if !e.MappedWrites() {
		t.Fatal("a tmpfs file: no mapped writes")
	}
	a, b, c := pattern(8192, 1), pattern(4096, 2), pattern(4096, 3)
	ios := []store.IO{
		{Op: store.OpWrite, Off: 0, Buf: a},
		{Op: store.OpWrite, Off: 65536, Vec: [][]byte{b, c}},
		{Op: store.OpWrite, Off: size - 4096, Buf: make([]byte, 8192), Err: errStale}, // past the end
	}
	if err := e.Do(ios); err != nil {
		t.Fatal(err)
	}
	if ios[0].Err != nil || ios[1].Err != nil {
		t.Fatalf("writes failed: %v, %v", ios[0].Err, ios[1].Err)
	}
	if err := ios[2].Err; !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), "past the end") {
		t.Fatalf("write past the end: %v", err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:8192], a) || !bytes.Equal(got[65536:65536+4096], b) || !bytes.Equal(got[65536+4096:65536+8192], c) {
		t.Fatal("the file does not hold what was written")
	}
	if !bytes.Equal(got[size-4096:], make([]byte, 4096)) {
		t.Fatal("the refused write changed the file")
	}
	// Reads through the rings see the writes.
	rb := allocBuf(t, e, 8192)
	if err := e.ring.Do([]store.IO{{Op: store.OpRead, Off: 0, Buf: rb}}); err != nil || !bytes.Equal(rb, a) {
		t.Fatalf("ring read after a mapped write: %v", err)
	}
	st := e.Stats()
	if st.MappedIOs != 2 || st.MappedBytes != 16384 || st.IOs != 1 {
		t.Fatalf("stats %v: want 2 mapped writes of 16384 bytes and the one ring read", st)
	}
	// Truncated under the engine: the write into what the file no longer
	// backs fails (the fault is caught), the one before it lands.
	if err := os.Truncate(path, size/2); err != nil {
		t.Fatal(err)
	}
	ios = []store.IO{{Op: store.OpWrite, Off: 4096, Buf: c}, {Op: store.OpWrite, Off: size - 8192, Buf: b}}
	if err := e.Do(ios); err != nil {
		t.Fatal(err)
	}
	if ios[0].Err != nil || !errors.Is(ios[1].Err, unix.EIO) {
		t.Fatalf("writes after the truncation: %v, %v; want nil and EIO", ios[0].Err, ios[1].Err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Do([]store.IO{{Op: store.OpWrite, Buf: a}}); !errors.Is(err, store.ErrEngineClosed) {
		t.Fatalf("write after Close: %v", err)
	}
	// A second Close unmaps nothing: the range may belong to another
	// mapping by now.
	other, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(other)
	other[0], other[size-1] = 1, 2
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if other[0] != 1 || other[size-1] != 2 {
		t.Fatal("the second Close touched another mapping")
	}

	path2 := newFile(t, dir, size)
	for name, o := range map[string]EngineOptions{"read-only": {ReadOnly: true}, "inline reads off": {InlineReads: "off"}} {
		if openEngineT(t, path2, o).MappedWrites() {
			t.Errorf("%s: mapped writes", name)
		}
	}
	if openEngineT(t, newFile(t, t.TempDir(), size), EngineOptions{}).MappedWrites() && !inMemoryDir(t.TempDir()) {
		t.Error("a file on a disk: mapped writes")
	}
}

// shmDir is a directory in /dev/shm (tmpfs) removed after the test; the
// test skips where there is none.
func shmDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "kvfs-uring-test-")
	if err != nil {
		t.Skipf("skipping: no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// inMemoryDir reports whether dir is on tmpfs or ramfs.
func inMemoryDir(dir string) bool {
	var sf unix.Statfs_t
	return unix.Statfs(dir, &sf) == nil && (sf.Type == unix.TMPFS_MAGIC || sf.Type == unix.RAMFS_MAGIC)
}

// TestEngineHostView: a file in memory offers its bytes as a read-only
// shared mapping (the same one on every call) that sees writes at once and
// that no store through it can change (a write faults); a file on a disk
// offers none, and after Close nothing is offered.
func TestEngineHostView(t *testing.T) {
	const size = 1 << 20
	dir := shmDir(t)
	path := newFile(t, dir, size)
	for name, o := range map[string]EngineOptions{"read-write": {Direct: true}, "read-only": {ReadOnly: true}, "inline reads off": {InlineReads: "off"}} {
		t.Run(name, func(t *testing.T) {
			e := openEngineT(t, path, o)
			v := e.HostView()
			if len(v) != size {
				t.Fatalf("host view of %d bytes, file %d", len(v), size)
			}
			if w := e.HostView(); &w[0] != &v[0] {
				t.Fatal("a second HostView made another mapping")
			}
			if !o.ReadOnly {
				a := pattern(8192, 4)
				ios := []store.IO{{Op: store.OpWrite, Off: 65536, Buf: a}}
				if err := e.Do(ios); err != nil || ios[0].Err != nil {
					t.Fatalf("write: %v, %v", err, ios[0].Err)
				}
				if !bytes.Equal(v[65536:65536+8192], a) {
					t.Fatal("the view does not see the write")
				}
			}
			old := debug.SetPanicOnFault(true)
			defer debug.SetPanicOnFault(old)
			func() {
				defer func() {
					if recover() == nil {
						t.Error("a store into the view did not fault")
					}
				}()
				v[0] = 1
			}()
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if e.HostView() != nil {
				t.Fatal("a host view after Close")
			}
		})
	}
	if !inMemoryDir(t.TempDir()) && openEngineT(t, newFile(t, t.TempDir(), size), EngineOptions{}).HostView() != nil {
		t.Error("a file on a disk: a host view")
	}
}

// TestHostViewPopulated: the host view of a file in memory has the pages
// that hold data mapped in the background once it is made (a load's first
// pass over them takes no page faults), and only those: never-written
// space stays unallocated. Close stops the background pass and waits for
// it.
func TestHostViewPopulated(t *testing.T) {
	const size = 8 << 20
	page := os.Getpagesize()
	probe, err := unix.Mmap(-1, 0, page, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Madvise(probe, unix.MADV_POPULATE_READ)
	unix.Munmap(probe)
	if errors.Is(err, unix.EINVAL) {
		t.Skip("skipping: the kernel has no MADV_POPULATE_READ (5.14)")
	}
	path := newFile(t, shmDir(t), size)
	data := [][2]int{{1 << 20, 3 << 20}, {6 << 20, 6<<20 + page}}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range data {
		if _, err := f.WriteAt(pattern(d[1]-d[0], uint64(d[0])), int64(d[0])); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	blocks := func() int64 {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks
	}
	before := blocks()
	e := openEngineT(t, path, EngineOptions{})
	v := e.HostView()
	if len(v) != size {
		t.Fatalf("host view of %d bytes", len(v))
	}
	e.bg.Wait() // the background pass is done
	present := viewPresent(t, v, page)
	inData := func(p int) bool {
		for _, d := range data {
			if p*page >= d[0] && p*page < d[1] {
				return true
			}
		}
		return false
	}
	for p, ok := range present {
		if ok != inData(p) {
			t.Fatalf("page %d (byte %d) mapped %v, holds data %v", p, p*page, ok, inData(p))
		}
	}
	if after := blocks(); after != before {
		t.Fatalf("the file's blocks went from %d to %d: never-written space was allocated", before, after)
	}

	// Close right after the view of a larger file is made, its pass
	// likely still running: Close returns with the pass stopped or done.
	big := newFile(t, shmDir(t), 256<<20)
	if err := os.WriteFile(big, pattern(256<<20, 7), 0o600); err != nil {
		t.Fatal(err)
	}
	e2 := openEngineT(t, big, EngineOptions{})
	if e2.HostView() == nil {
		t.Fatal("no host view")
	}
	if err := e2.Close(); err != nil {
		t.Fatal(err)
	}
	e2.bg.Wait() // returns at once: Close waited for the pass
	if e2.HostView() != nil {
		t.Fatal("a host view after Close")
	}
}

// viewPresent reports, page by page, whether v's pages are mapped in this
// process (the present bit of /proc/self/pagemap).
func viewPresent(t *testing.T, v []byte, page int) []bool {
	t.Helper()
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	defer pm.Close()
	n := len(v) / page
	raw := make([]byte, 8*n)
	base := uintptr(unsafe.Pointer(unsafe.SliceData(v))) / uintptr(page)
	if _, err := pm.ReadAt(raw, int64(base)*8); err != nil {
		t.Fatal(err)
	}
	out := make([]bool, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(raw[8*i:])>>63 == 1
	}
	return out
}
