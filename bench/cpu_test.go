package bench

import (
	"testing"
	"time"
)

// TestMachineJiffies: the machine's CPU time in /proc/stat advances while
// this test spins, and never counts more idle than it counts in all.
func TestMachineJiffies(t *testing.T) {
	i0, t0, ok := MachineJiffies()
	if !ok {
		t.Fatal("MachineJiffies: /proc/stat unreadable")
	}
	if i0 > t0 {
		t.Fatalf("idle %d > total %d", i0, t0)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for range 1 << 20 {
		}
		i1, t1, ok := MachineJiffies()
		if !ok || i1 < i0 || i1-i0 > t1-t0 {
			t.Fatalf("MachineJiffies went from %d/%d to %d/%d (ok %v)", i0, t0, i1, t1, ok)
		}
		if t1 > t0 {
			return
		}
	}
	t.Fatal("the machine's CPU time did not advance in 5 s of spinning")
}
