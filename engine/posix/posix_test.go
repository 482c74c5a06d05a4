package posix_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/engine/posix"
	"github.com/kvfs/kvfs/store"
)

// TestReadVec: a vector read with more segments than one preadv takes
// (IOV_MAX) lands every byte in its segment, in order, with O_DIRECT where
// the file system allows it and buffered otherwise, and leaves the memory
// between segments untouched.
func TestReadVec(t *testing.T) {
	for _, buffered := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "f")
		const seg, nseg = 4096, 1500
		data := make([]byte, seg*nseg)
		for i := range data {
			data[i] = byte(i*7 + i/4096)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		e, err := posix.Open(path, posix.Options{Buffered: buffered})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if _, ok := any(e).(store.VectorReader); !ok || !e.VectorReads() {
			t.Fatal("posix does not take vector reads")
		}
		// Segments every other page of a buffer twice the size.
		mem, err := store.AllocAligned(2 * len(data))
		if err != nil {
			t.Fatal(err)
		}
		defer store.FreeAligned(mem)
		for i := range mem {
			mem[i] = 0xA5
		}
		vec := make([][]byte, nseg)
		for i := range vec {
			vec[i] = mem[2*i*seg : (2*i+1)*seg]
		}
		ios := []store.IO{{Op: store.OpRead, Off: 0, Vec: vec}}
		if err := e.Do(ios); err != nil || ios[0].Err != nil {
			t.Fatalf("direct %v: %v %v", e.Direct(), err, ios[0].Err)
		}
		for i := range nseg {
			if !bytes.Equal(vec[i], data[i*seg:(i+1)*seg]) {
				t.Fatalf("direct %v: segment %d differs", e.Direct(), i)
			}
			gap := mem[(2*i+1)*seg : (2*i+2)*seg]
			if !bytes.Equal(gap, bytes.Repeat([]byte{0xA5}, seg)) {
				t.Fatalf("direct %v: memory after segment %d written", e.Direct(), i)
			}
		}
		// Past the end: an error, not a short success.
		ios = []store.IO{{Op: store.OpRead, Off: int64(len(data) - seg), Vec: vec[:2]}}
		if err := e.Do(ios); err != nil || ios[0].Err == nil {
			t.Fatalf("read past the end: %v %v", err, ios[0].Err)
		}
		if e.Direct() {
			// Unaligned segments are refused under O_DIRECT.
			ios = []store.IO{{Op: store.OpRead, Off: 0, Vec: [][]byte{mem[1 : 1+seg]}}}
			if err := e.Do(ios); err != nil || ios[0].Err == nil {
				t.Fatalf("unaligned segment accepted: %v %v", err, ios[0].Err)
			}
		}
	}
}
