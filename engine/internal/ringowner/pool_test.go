package ringowner

import (
	"bytes"
	"encoding/binary"
	"os"
	"testing"
)

// TestPoolContiguous reports whether the pool got physically contiguous
// memory (transparent huge pages); it fails only where THP is enabled and
// the pool still came out scattered.
func TestPoolContiguous(t *testing.T) {
	mem, err := mapPool(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer unmapPool(mem)
	thp, _ := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	defer f.Close()
	pages := len(mem) / 4096
	pm := make([]byte, 8*pages)
	if _, err := f.ReadAt(pm, int64(addrOf(mem)/4096*8)); err != nil {
		t.Skipf("skipping: pagemap: %v", err)
	}
	runs := 0
	var prev uint64
	for i := 0; i < pages; i++ {
		pfn := binary.LittleEndian.Uint64(pm[i*8:]) & (1<<55 - 1)
		if pfn == 0 {
			t.Skip("skipping: page frame numbers hidden (needs CAP_SYS_ADMIN)")
		}
		if i == 0 || pfn != prev+1 {
			runs++
		}
		prev = pfn
	}
	t.Logf("4 MiB pool: %d physically contiguous runs; THP %s", runs, bytes.TrimSpace(thp))
	if runs > 2 && !bytes.Contains(thp, []byte("[never]")) {
		t.Errorf("pool is scattered over %d runs although THP is enabled", runs)
	}
}
