package ringowner

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

// holdDriver is a pipeDriver that remembers its ring goroutine's thread
// and, while hold is set, blocks that goroutine in CompleteIO until
// released: the ring can then complete nothing else.
type holdDriver struct {
	pipeDriver
	tid     atomic.Int32
	hold    atomic.Bool
	held    chan struct{} // receives when a completion is held
	release chan struct{}
	ios     atomic.Int32
}

func (d *holdDriver) Setup(r *uring.Ring, p *uring.ProbeResult) (string, error) {
	d.tid.Store(int32(unix.Gettid()))
	return d.pipeDriver.Setup(r, p)
}

func (d *holdDriver) CompleteIO(rq *store.IO, at, n int, fixed bool, res int32) (int, bool, error) {
	d.ios.Add(1)
	if d.hold.Load() {
		d.held <- struct{}{}
		<-d.release
	}
	return d.pipeDriver.CompleteIO(rq, at, n, fixed, res)
}

func startHoldRings(t *testing.T, n int, r []int, cfg Config) (*Rings, []*holdDriver) {
	t.Helper()
	var drvs []*holdDriver
	if cfg.QueueDepth == 0 {
		cfg.QueueDepth = 8
	}
	cfg.Name, cfg.PoolBytes = "test", -1
	rs, err := StartRings(cfg, n, func(int) Driver {
		d := &holdDriver{pipeDriver: pipeDriver{r: r}, held: make(chan struct{}, 1), release: make(chan struct{})}
		drvs = append(drvs, d)
		return d
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return rs, drvs
}

// TestRingsProceedConcurrently: two Do batches go to different rings (on
// different OS threads), and one completes while the other ring's
// goroutine is stuck completing the first. With one ring the second batch
// could not complete until the first was let go.
func TestRingsProceedConcurrently(t *testing.T) {
	needRing(t)
	r, w := pipes(t, 2)
	rs, drvs := startHoldRings(t, 2, r, Config{})
	if drvs[0].tid.Load() == drvs[1].tid.Load() {
		t.Fatalf("both rings run on thread %d", drvs[0].tid.Load())
	}
	for _, d := range drvs {
		d.hold.Store(true)
	}
	a := []store.IO{{Op: store.OpRead, Buf: make([]byte, 4096), Stream: 0}}
	aDone := make(chan error, 1)
	go func() { aDone <- rs.Do(a) }()
	waitFor(t, "batch A to be submitted", func() bool { return rs.Stats().SQEs >= 1 })
	if _, err := unix.Write(w[0], make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	// A's ring goroutine is now stuck in its completion.
	var stuck *holdDriver
	select {
	case <-drvs[0].held:
		stuck = drvs[0]
	case <-drvs[1].held:
		stuck = drvs[1]
	case <-time.After(10 * time.Second):
		t.Fatal("batch A's completion never ran")
	}
	for _, d := range drvs {
		if d != stuck {
			d.hold.Store(false)
		}
	}
	b := []store.IO{{Op: store.OpRead, Buf: make([]byte, 4096), Stream: 1}}
	if _, err := unix.Write(w[1], make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	// B completes on the other ring while A's ring is held.
	if err := rs.Do(b); err != nil || b[0].Err != nil {
		t.Fatalf("batch B: %v %v", err, b[0].Err)
	}
	select {
	case err := <-aDone:
		t.Fatalf("batch A returned while its completion was held: %v", err)
	default:
	}
	stuck.hold.Store(false)
	close(stuck.release)
	if err := <-aDone; err != nil || a[0].Err != nil {
		t.Fatalf("batch A: %v %v", err, a[0].Err)
	}
	if drvs[0].ios.Load() != 1 || drvs[1].ios.Load() != 1 {
		t.Errorf("completions per ring %d and %d; want one each", drvs[0].ios.Load(), drvs[1].ios.Load())
	}
}

// TestRingsSplitBatch: a large Do batch is split over every ring, and
// every IO of it completes.
func TestRingsSplitBatch(t *testing.T) {
	needRing(t)
	const n = 3
	r, w := pipes(t, 1)
	rs, drvs := startHoldRings(t, n, r, Config{QueueDepth: 16})
	ios := make([]store.IO, 4*splitMin*n)
	for i := range ios {
		ios[i] = store.IO{Op: store.OpRead, Buf: make([]byte, 512), Stream: 0}
	}
	go func() {
		for range ios {
			_, _ = unix.Write(w[0], make([]byte, 512))
		}
	}()
	if err := rs.Do(ios); err != nil {
		t.Fatal(err)
	}
	for i := range ios {
		if ios[i].Err != nil {
			t.Fatalf("IO %d: %v", i, ios[i].Err)
		}
	}
	for i, d := range drvs {
		if d.ios.Load() == 0 {
			t.Errorf("ring %d got no part of the batch", i)
		}
	}
}

// TestRingsOneRingFails: one ring's enter fails while a read is really in
// flight on it. The batch on that ring is released only after its read was
// cancelled and reaped (nothing lands in its buffer afterwards), the rule
// of Owner; later calls go to the ring that still works; when every ring
// has failed, calls fail with the ring error.
func TestRingsOneRingFails(t *testing.T) {
	needRing(t)
	r, w := pipes(t, 3)
	boom := errors.New("injected enter failure")
	var failTid atomic.Int32
	var fail atomic.Bool
	core, logs := observer.New(zapcore.InfoLevel)
	cfg := Config{Logger: zap.New(core), EnterHook: func(uint64) error {
		// Once per ring: the drain's enters work, so it can reap.
		if fail.Load() && failTid.CompareAndSwap(int32(unix.Gettid()), 0) {
			return boom
		}
		return nil
	}}
	rs, drvs := startHoldRings(t, 2, r, cfg)
	// Which ring does the next call go to? Do a call and see.
	probe := []store.IO{{Op: store.OpRead, Buf: make([]byte, 8), Stream: 2}}
	_, _ = unix.Write(w[2], make([]byte, 8))
	if err := rs.Do(probe); err != nil || probe[0].Err != nil {
		t.Fatal(err, probe[0].Err)
	}
	// Round robin: the call after the probe goes to the other ring.
	victim := 1
	if drvs[1].ios.Load() == 1 {
		victim = 0
	}
	failTid.Store(drvs[victim].tid.Load())
	a := []store.IO{{Op: store.OpRead, Buf: guarded(t, false), Stream: 0}}
	aDone := make(chan error, 1)
	go func() { aDone <- rs.Do(a) }()
	waitFor(t, "the read to be submitted", func() bool { return rs.Ring(victim).Stats().SQEs >= 1 })
	time.Sleep(20 * time.Millisecond) // let the ring sleep in the kernel
	fail.Store(true)
	// Wake the victim ring: its next enter fails.
	if err := rs.Ring(victim).DoAsync([]store.IO{{Op: store.OpRead, Buf: guarded(t, false), Stream: 1}}, func(int) {}); err != nil {
		t.Fatal(err)
	}
	err := <-aDone
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "test: ring failed") {
		t.Fatalf("Do on the failing ring: %v", err)
	}
	for i := range w[:2] {
		_, _ = unix.Write(w[i], make([]byte, unix.Getpagesize()))
	}
	time.Sleep(50 * time.Millisecond)
	if !intact(a[0].Buf) {
		t.Error("the buffer was written after Do returned")
	}
	if rs.Leaked() {
		t.Error("leaked although the read could be reaped")
	}
	if l := logs.FilterMessageSnippet("every request in flight completed or was cancelled").All(); len(l) != 1 {
		t.Errorf("log lines: %v", logs.All())
	}
	// The other ring serves every later call.
	for i := 0; i < 4; i++ {
		b := []store.IO{{Op: store.OpRead, Buf: make([]byte, 8), Stream: 2}}
		_, _ = unix.Write(w[2], make([]byte, 8))
		if err := rs.Do(b); err != nil || b[0].Err != nil {
			t.Fatalf("call %d after one ring failed: %v %v", i, err, b[0].Err)
		}
	}
	if err := rs.Sync(); err != nil {
		t.Fatalf("Sync after one ring failed: %v", err)
	}
	// Now the other ring fails too: calls fail with the ring error.
	failTid.Store(drvs[1-victim].tid.Load())
	c := []store.IO{{Op: store.OpRead, Buf: make([]byte, 8), Stream: 2}}
	if err := rs.Do(c); !errors.Is(err, boom) {
		t.Fatalf("Do with every ring failed: %v", err)
	}
	if err := rs.Do(c); !errors.Is(err, boom) {
		t.Fatalf("Do after every ring failed: %v", err)
	}
	if err := rs.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := rs.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestRingsPoolGrowsUnderLoad: 128 callers each hold a pool buffer at the
// same time (none frees before all have one), so a pool that made callers
// wait for memory would deadlock here. The pool grows by segments up to
// its cap, each registered on every ring; past the cap callers get plain
// memory; every byte of it goes back, and Close unmaps it.
func TestRingsPoolGrowsUnderLoad(t *testing.T) {
	needRing(t)
	const callers, chunk = 128, 64 << 10 // 8 MiB in all
	r, _ := pipes(t, 1)
	rs, err := StartRings(Config{Name: "test", QueueDepth: 8, PoolBytes: 2 << 20, PoolMaxBytes: 8 << 20},
		3, func(int) Driver { return &pipeDriver{r: r} })
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	bufs := make([][]byte, callers)
	var got, wg sync.WaitGroup
	got.Add(callers)
	errs := make(chan error, callers)
	for i := range bufs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := rs.AllocBuffer(chunk)
			bufs[i] = b
			if err != nil {
				errs <- err
			}
			got.Done()
			got.Wait() // hold it until every caller has one
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, b := range bufs {
		if !rs.PoolOwns(b) || len(b) != chunk {
			t.Fatalf("caller %d: buffer of %d bytes not from the pool", i, len(b))
		}
	}
	if rs.PoolSize() != 8<<20 || rs.PoolInUse() != 8<<20 {
		t.Fatalf("pool %d bytes, %d in use; want 8 MiB grown from 2 MiB", rs.PoolSize(), rs.PoolInUse())
	}
	// Three grown segments, each registered on each of the three rings.
	waitFor(t, "the segments to be registered", func() bool { return rs.Stats().PoolSegments == 9 })
	// At the cap: plain memory, which works the same.
	over, err := rs.AllocBuffer(chunk)
	if err != nil || rs.PoolOwns(over) || len(over) != chunk {
		t.Fatalf("past the cap: %v, from the pool %v", err, rs.PoolOwns(over))
	}
	rs.FreeBuffer(over)
	for _, b := range bufs {
		rs.FreeBuffer(b)
	}
	if rs.PoolInUse() != 0 || rs.PoolFreeExtents() != 4 {
		t.Fatalf("after freeing: %d in use, %d free extents (want 0 and one per segment)", rs.PoolInUse(), rs.PoolFreeExtents())
	}
	// A request larger than a segment gets a segment of its own size when
	// the cap allows: not here.
	if b, _ := rs.AllocBuffer(16 << 20); rs.PoolOwns(b) {
		t.Fatal("a 16 MiB buffer came from an 8 MiB pool")
	} else {
		rs.FreeBuffer(b)
	}
	if err := rs.Close(); err != nil {
		t.Fatal(err)
	}
	if rs.PoolSize() != 0 {
		t.Fatalf("pool still mapped after Close: %d bytes", rs.PoolSize())
	}
}
