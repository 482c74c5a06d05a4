package ringowner

import (
	"bytes"
	"encoding/binary"
	"os"
	"testing"

	"github.com/kvfs/kvfs/store"
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

func TestPoolFirstFit(t *testing.T) {
	mem, err := store.AllocAligned(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer store.FreeAligned(mem)
	p := newPool(mem, 4096)
	a, ok1 := p.alloc(5000) // 2 pages
	b, ok2 := p.alloc(4096)
	c, ok3 := p.alloc(40 << 10)
	if !ok1 || !ok2 || !ok3 || len(a) != 5000 || cap(a) != 8192 {
		t.Fatalf("allocs %v %v %v len %d cap %d", ok1, ok2, ok3, len(a), cap(a))
	}
	if _, ok := p.alloc(16 << 10); ok {
		t.Fatal("allocated past the pool")
	}
	if !p.release(b) || p.release(make([]byte, 10)) {
		t.Fatal("release")
	}
	p.release(a)
	p.release(c)
	if len(p.segs[0].free) != 1 || p.segs[0].free[0] != (extent{0, 64 << 10}) {
		t.Fatalf("free list not coalesced: %v", p.segs[0].free)
	}
	if _, ok := p.alloc(64 << 10); !ok {
		t.Fatal("whole pool after release")
	}
}
