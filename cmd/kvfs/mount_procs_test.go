package main

import (
	"runtime"
	"testing"
)

// TestRaiseProcs: the daemon runs syscallProcs Ps above the runtime's
// default, the same on a second mount in one process, and leaves a
// GOMAXPROCS from the environment as it is.
func TestRaiseProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	t.Setenv("GOMAXPROCS", "")
	want := defaultProcs() + syscallProcs
	for range 2 {
		if got := raiseProcs(); got != want || runtime.GOMAXPROCS(0) != want {
			t.Fatalf("raiseProcs() = %d, GOMAXPROCS %d; want %d", got, runtime.GOMAXPROCS(0), want)
		}
	}
	runtime.GOMAXPROCS(3)
	t.Setenv("GOMAXPROCS", "3")
	if got := raiseProcs(); got != 3 || runtime.GOMAXPROCS(0) != 3 {
		t.Fatalf("with GOMAXPROCS=3 in the environment: raiseProcs() = %d, GOMAXPROCS %d; want 3", got, runtime.GOMAXPROCS(0))
	}
}
