package par

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestPiecesCoverOnce: every index of the range is done exactly once,
// whatever the piece size and worker count.
func TestPiecesCoverOnce(t *testing.T) {
	for _, c := range []struct{ n, per, workers int }{{0, 4, 4}, {1, 4, 4}, {10, 3, 4}, {1000, 7, 16}, {64, 64, 1}, {5, 0, 3}} {
		seen := make([]int32, c.n)
		Pieces(c.n, c.per, c.workers, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				atomic.AddInt32(&seen[i], 1)
			}
		})
		for i, v := range seen {
			if v != 1 {
				t.Fatalf("%+v: index %d done %d times", c, i, v)
			}
		}
	}
}

// TestRunPanicAfterAllStopped: a panic in a helper goroutine is raised in
// the caller, and only once every goroutine has returned.
func TestRunPanicAfterAllStopped(t *testing.T) {
	var running atomic.Int32
	var once sync.Once
	release := make(chan struct{})
	defer func() {
		r := recover()
		if r != "boom" {
			t.Fatalf("recovered %v, want boom", r)
		}
		if n := running.Load(); n != 0 {
			t.Fatalf("%d goroutines still running when the panic reached the caller", n)
		}
	}()
	var k atomic.Int32
	Run(4, func() {
		running.Add(1)
		defer running.Add(-1)
		if k.Add(1) == 2 {
			once.Do(func() { close(release) })
			panic("boom")
		}
		<-release
	})
	t.Fatal("Run returned without the panic")
}
