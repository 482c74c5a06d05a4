package ringowner

import (
	"errors"
	"fmt"
	"io"
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

// pipeDriver reads from pipes: a read stays in flight, for real, until the
// test writes to its pipe. IO.Stream picks the pipe.
type pipeDriver struct {
	r      []int
	reaped atomic.Int32 // CQEs of reads seen
}

func (d *pipeDriver) Setup(*uring.Ring, *uring.ProbeResult) (string, error) { return "", nil }
func (d *pipeDriver) Check(*store.IO) error                                 { return nil }
func (d *pipeDriver) PrepIO(sqe *uring.SQE, rq *store.IO, b []byte, _ int64, _ int) error {
	sqe.PrepRead(int32(d.r[rq.Stream]), b, ^uint64(0)) // -1: the pipe's "current position"
	return nil
}

func (d *pipeDriver) CompleteIO(rq *store.IO, at, n int, _ bool, res int32) (int, bool, error) {
	d.reaped.Add(1)
	switch {
	case res < 0:
		return 0, false, fmt.Errorf("pipe read: %w", unix.Errno(-res))
	case res == 0:
		return 0, false, io.ErrUnexpectedEOF
	}
	return n, false, nil // a pipe read may be short; the test writes whole buffers
}
func (d *pipeDriver) PrepSync(sqe *uring.SQE)      { sqe.PrepNop() }
func (d *pipeDriver) CompleteSync(res int32) error { return nil }

func needRing(t *testing.T) {
	t.Helper()
	if err := uring.Available(); err != nil {
		t.Skipf("skipping: io_uring is not usable here: %v", err)
	}
}

// pipes makes n pipes whose read ends the driver uses.
func pipes(t *testing.T, n int) (r, w []int) {
	t.Helper()
	for i := 0; i < n; i++ {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		r, w = append(r, p[0]), append(w, p[1])
	}
	t.Cleanup(func() {
		for i := range r {
			unix.Close(r[i])
			unix.Close(w[i])
		}
	})
	return r, w
}

const sentinel = 0xA5

// guarded maps one page between two PROT_NONE pages and fills it with the
// sentinel: a kernel write past it faults instead of landing silently, and
// any write into it shows.
func guarded(t *testing.T, keep bool) []byte {
	t.Helper()
	pg := unix.Getpagesize()
	m, err := unix.Mmap(-1, 0, 3*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mprotect(m[:pg], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mprotect(m[2*pg:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if !keep {
		t.Cleanup(func() { unix.Munmap(m) })
	}
	b := m[pg : 2*pg : 2*pg]
	for i := range b {
		b[i] = sentinel
	}
	return b
}

func intact(b []byte) bool {
	for _, c := range b {
		if c != sentinel {
			return false
		}
	}
	return true
}

// injector fails io_uring_enter once the reads are in flight: the enter
// that sees sqes prepared submits them (and sleeps in the kernel); the
// next one fails — once, or for good.
type injector struct {
	owner     atomic.Pointer[Owner]
	sqes      uint64
	forever   bool
	boom      error
	submitted atomic.Bool
	at        uint64 // the enter that submitted the reads (ring goroutine)
	failed    bool
}

func (in *injector) hook(n uint64) error {
	o := in.owner.Load()
	switch {
	case o == nil:
	case !in.submitted.Load():
		if o.Stats().SQEs >= in.sqes {
			in.at = n
			in.submitted.Store(true)
		}
	case n > in.at && (in.forever || !in.failed):
		in.failed = true
		return in.boom
	}
	return nil
}

// waitFor polls cond (the ring goroutine's state is only visible through
// counters) for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRingFailureCancelsBeforeRelease: the ring fails (an injected enter
// error) while pipe reads are really in flight. Do must not return before
// those reads are cancelled and reaped, so feeding the pipes afterwards
// writes nothing into the callers' buffers; the DoAsync callback of the
// request that woke the ring runs once, with the error.
func TestRingFailureCancelsBeforeRelease(t *testing.T) {
	needRing(t)
	const n = 4
	r, w := pipes(t, n+1)
	boom := errors.New("injected enter failure")
	core, logs := observer.New(zapcore.InfoLevel)
	in := &injector{sqes: n, boom: boom}
	drv := &pipeDriver{r: r}
	o, err := Start(Config{Name: "test", QueueDepth: 8, PoolBytes: -1, Logger: zap.New(core),
		EnterHook: in.hook}, drv)
	if err != nil {
		t.Fatal(err)
	}
	in.owner.Store(o)
	ios := make([]store.IO, n)
	for i := range ios {
		ios[i] = store.IO{Op: store.OpRead, Buf: guarded(t, false), Stream: uint16(i)}
	}
	done := make(chan error, 1)
	go func() { done <- o.Do(ios) }()
	// The enter that submits the reads sleeps in the kernel: give it a
	// moment to get there.
	waitFor(t, "the reads to be submitted", in.submitted.Load)
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Do returned before the failure: %v (%v %v)", err, ios[0].Err, o.Stats())
	default:
	}
	// Waking the ring with one more read makes it enter again, and that
	// enter fails.
	extra := []store.IO{{Op: store.OpRead, Buf: guarded(t, false), Stream: n}}
	var calls atomic.Int32
	var cbErr error
	var cbMu sync.Mutex
	if err := o.DoAsync(extra, func(i int) {
		calls.Add(1)
		cbMu.Lock()
		cbErr = extra[i].Err
		cbMu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	err = <-done
	// Every read of the batch was reaped (cancelled) before Do returned.
	if got := drv.reaped.Load(); got < n {
		t.Errorf("Do returned when %d of its %d reads had been reaped", got, n)
	}
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "test: ring failed") {
		t.Fatalf("Do: %v, want the ring failure", err)
	}
	// Feed every pipe: nothing may land in the buffers any more.
	for i := range w {
		if _, err := unix.Write(w[i], make([]byte, unix.Getpagesize())); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	for i := range ios {
		if !intact(ios[i].Buf) {
			t.Errorf("buffer %d written after Do returned", i)
		}
		if ios[i].Err == nil {
			t.Errorf("IO %d: no error", i)
		}
	}
	if !intact(extra[0].Buf) {
		t.Error("the DoAsync buffer was written after its callback")
	}
	cbMu.Lock()
	if calls.Load() != 1 || cbErr == nil {
		t.Errorf("DoAsync callback ran %d times, err %v; want once with an error", calls.Load(), cbErr)
	}
	cbMu.Unlock()
	if o.Leaked() {
		t.Error("leaked although every request could be reaped")
	}
	if l := logs.FilterMessageSnippet("every request in flight completed or was cancelled").All(); len(l) != 1 {
		t.Errorf("log lines: %v", logs.All())
	}
	if err := o.Do(ios); !errors.Is(err, boom) {
		t.Errorf("Do after the failure: %v", err)
	}
	if err := o.Close(); err != nil {
		t.Errorf("Close after the failure: %v", err)
	}
	if err := o.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestRingFailureLeaksWhatCannotBeReaped: every enter after the first
// fails, so the reads in flight can be neither cancelled nor reaped. The
// callers are released with the error, and the memory the reads name is
// leaked on purpose: the pool stays mapped after Close, a freed buffer
// outside the pool is not unmapped, and one Error line says so.
func TestRingFailureLeaksWhatCannotBeReaped(t *testing.T) {
	needRing(t)
	r, w := pipes(t, 2)
	boom := errors.New("injected enter failure, for good")
	core, logs := observer.New(zapcore.InfoLevel)
	in := &injector{sqes: 2, boom: boom, forever: true}
	o, err := Start(Config{Name: "test", QueueDepth: 8, PoolBytes: 2 << 20, Logger: zap.New(core),
		EnterHook: in.hook, DrainTimeout: time.Second}, &pipeDriver{r: r})
	if err != nil {
		t.Fatal(err)
	}
	in.owner.Store(o)
	inPool, err := o.AllocBuffer(4096)
	if err != nil || !o.PoolOwns(inPool) {
		t.Fatalf("pool buffer: %v", err)
	}
	outside, err := o.AllocBuffer(4 << 20) // larger than the pool
	if err != nil || o.PoolOwns(outside) {
		t.Fatalf("buffer outside the pool: %v", err)
	}
	ios := []store.IO{{Op: store.OpRead, Buf: inPool, Stream: 0}, {Op: store.OpRead, Buf: outside[:4096], Stream: 1}}
	done := make(chan error, 1)
	go func() { done <- o.Do(ios) }()
	waitFor(t, "the reads to be submitted", in.submitted.Load)
	time.Sleep(50 * time.Millisecond)
	if err := o.Sync(); !errors.Is(err, boom) { // wakes the ring: this enter fails, and every later one
		t.Fatalf("Sync: %v, want the ring failure", err)
	}
	if err := <-done; !errors.Is(err, boom) {
		t.Fatalf("Do: %v, want the ring failure", err)
	}
	if !o.Leaked() {
		t.Fatal("not leaked although no request could be reaped")
	}
	l := logs.FilterMessageSnippet("leaking their memory on purpose").All()
	if len(l) != 1 || l[0].Level != zapcore.ErrorLevel {
		t.Fatalf("want one Error line about the leak; got %v", logs.All())
	}
	// The two reads and the flush that woke the ring.
	if m := l[0].ContextMap(); fmt.Sprint(m["requests_in_flight"]) != "3" || fmt.Sprint(m["request_bytes"]) != "8192" {
		t.Errorf("leak line says %v requests, %v bytes in flight; want 3 and 8192", m["requests_in_flight"], m["request_bytes"])
	}
	o.FreeBuffer(outside)
	o.FreeBuffer(inPool)
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	// Still mapped: touching them must not fault, and the kernel may
	// still complete the reads into them.
	pool := o.PoolMem()
	if len(pool) != 2<<20 {
		t.Fatalf("pool unmapped after the leak (%d bytes left)", len(pool))
	}
	pool[0], pool[len(pool)-1] = 1, 1
	outside[0], outside[len(outside)-1] = 1, 1
	for i := range w {
		_, _ = unix.Write(w[i], make([]byte, 4096))
	}
}
