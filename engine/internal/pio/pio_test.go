package pio

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/store"
)

// TestReadvNoAllocs: a vector read of many segments lands every byte in
// order and allocates nothing (the iovec array is pooled).
func TestReadvNoAllocs(t *testing.T) {
	const seg, nseg = 512, 1500 // more than one preadv
	data := make([]byte, seg*nseg)
	for i := range data {
		data[i] = byte(i*31 + i/seg)
	}
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem := make([]byte, 2*len(data))
	vec := make([][]byte, nseg)
	for i := range vec {
		vec[i] = mem[2*i*seg : (2*i+1)*seg]
	}
	io := store.IO{Op: store.OpRead, Vec: vec}
	if err := Do(int(f.Fd()), &io, 1, "test"); err != nil {
		t.Fatal(err)
	}
	for i := range vec {
		if !bytes.Equal(vec[i], data[i*seg:(i+1)*seg]) {
			t.Fatalf("segment %d differs", i)
		}
	}
	if raceOn {
		return // the pool drops items at random: allocations are expected
	}
	if n := testing.AllocsPerRun(20, func() {
		io := store.IO{Op: store.OpRead, Vec: vec}
		if err := Do(int(f.Fd()), &io, 1, "test"); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%.1f allocations per vector read", n)
	}
}
