package tier

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// reserveHugePages reserves n more huge pages of the default size
// (/proc/sys/vm/nr_hugepages) for the test and gives them back when it
// ends; it skips the test where that cannot be done (not root, or a kernel
// that reserves fewer: no memory to spare, no hugetlb).
func reserveHugePages(t *testing.T, n int64) {
	t.Helper()
	const path = "/proc/sys/vm/nr_hugepages"
	read := func() int64 {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Skipf("skipping: %v", err)
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Skipf("skipping: %s: %v", path, err)
		}
		return v
	}
	if size, ok := meminfo("Hugepagesize"); !ok || size != hugePage {
		t.Skipf("skipping: huge pages of %d bytes, not %d", size, hugePage)
	}
	old := read()
	if err := os.WriteFile(path, []byte(strconv.FormatInt(old+n, 10)), 0o644); err != nil {
		t.Skipf("skipping: reserving huge pages: %v", err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(path, []byte(strconv.FormatInt(old, 10)), 0o644); err != nil {
			t.Errorf("giving the huge pages back: %v", err)
		}
	})
	if got := read(); got < old+n {
		t.Skipf("skipping: the kernel reserved %d huge pages of the %d asked", got-old, n)
	}
}

func hugeFree(t *testing.T) int64 {
	t.Helper()
	free, ok := meminfo("HugePages_Free")
	if !ok {
		t.Fatal("no HugePages_Free in /proc/meminfo")
	}
	return free
}

// hugetlbOf is the page size of the mapping of this process that holds p
// and the bytes of it on reserved huge pages (KernelPageSize and
// Private_Hugetlb in /proc/self/smaps); ok is false when no mapping holds
// p.
func hugetlbOf(t *testing.T, p uintptr) (pageSize, hugetlb int64, ok bool) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	kb := func(v string) int64 {
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("smaps: %q", v)
		}
		return n << 10
	}
	for sc.Scan() {
		line := sc.Text()
		first, _, _ := strings.Cut(line, " ")
		if lo, hi, isRange := strings.Cut(first, "-"); isRange {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil {
				if in {
					return pageSize, hugetlb, true
				}
				in = uint64(l) <= uint64(p) && uint64(p) < uint64(h)
				continue
			}
		}
		if !in {
			continue
		}
		if v, found := strings.CutPrefix(line, "KernelPageSize:"); found {
			pageSize = kb(v)
		}
		if v, found := strings.CutPrefix(line, "Private_Hugetlb:"); found {
			hugetlb = kb(v)
		}
	}
	return pageSize, hugetlb, in
}

// Where huge pages are reserved, the arena is on them (a size that is not
// a multiple of one rounded up): the system's free huge pages drop by the
// tier's while it is open, and come back when it closes; the tier serves
// as on base pages. A tier larger than the free huge pages falls back to
// transparent huge pages, and says why in the log.
func TestHugePages(t *testing.T) {
	const reserved = 64
	reserveHugePages(t, reserved)
	blocks := int64(5<<20) / testGeo.PayloadBytes() // 5 MiB: 3 huge pages
	free0 := hugeFree(t)
	tr, st, _ := newTier(t, 16, blocks)
	if !tr.Metrics().HugePages {
		t.Fatalf("the tier is not on the %d free huge pages", free0)
	}
	if got := hugeFree(t); free0-got < 3 {
		t.Fatalf("huge pages free: %d before the tier, %d with it", free0, got)
	}
	at := uintptr(unsafe.Pointer(&tr.ar.b[0]))
	if ps, huge, _ := hugetlbOf(t, at); ps != hugePage || huge != 3*hugePage {
		t.Fatalf("the arena's pages are of %d bytes, %d bytes of them reserved huge pages", ps, huge)
	}
	writeBlock(t, st, 1, 10, nil)
	mustRead(t, tr, 1, 10)
	mustRead(t, tr, 1, 10)
	writeBlock(t, tr, 2, 20, nil)
	mustRead(t, tr, 2, 20)
	if m := tr.Metrics(); m.Hits == 0 || m.WrittenBytes == 0 {
		t.Fatalf("a tier on huge pages: %+v", m)
	}
	tr.Close()
	if _, huge, _ := hugetlbOf(t, at); huge > 0 {
		t.Fatal("the arena's huge pages are still mapped after Close")
	}

	core, logs := observer.New(zap.InfoLevel)
	big := (free0 + 1) * hugePage / testGeo.PayloadBytes()
	tr2, err := New(st, Options{Bytes: big * testGeo.PayloadBytes(), Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	if tr2.Metrics().HugePages {
		t.Fatalf("a tier of %d huge pages on the %d free", free0+1, free0)
	}
	if l := logs.FilterMessageSnippet("transparent huge pages").All(); len(l) != 1 ||
		!strings.Contains(fmt.Sprint(l[0].ContextMap()["why"]), "the tier needs") {
		t.Fatalf("the fallback to transparent huge pages was not logged: %v", logs.All())
	}
	mustRead(t, tr2, 2, 20)
}
