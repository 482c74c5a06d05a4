package store_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/store"
)

// TestZeroFile: a file PrepareFile allocated reads as zeros without being
// written (holes or unwritten extents, which a benchmark would read without
// device I/O); ZeroFile writes every such byte, keeps what was written, and
// WrittenBytes then counts the whole file.
func TestZeroFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.kvfs")
	const size = 48<<20 + 4096
	if err := store.PrepareFile(path, size); err != nil {
		t.Fatal(err)
	}
	// Some data written in the middle, unaligned, through the page cache.
	data := bytes.Repeat([]byte("kvfs"), 3000)
	const at = 20<<20 + 100
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, at); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	written, got, err := store.WrittenBytes(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != size {
		t.Fatalf("size %d, want %d", got, size)
	}
	if written < int64(len(data)) || written > size {
		t.Fatalf("written %d of %d: want at least the %d bytes written", written, size, len(data))
	}
	if written == size {
		t.Logf("this file system reports no holes or unwritten extents (lseek SEEK_HOLE); only the refusals are checked")
	}
	var last, lastTotal int64
	calls := 0
	if err := store.ZeroFile(path, func(done, total int64) {
		if done < last || done > total {
			t.Errorf("progress %d of %d after %d", done, total, last)
		}
		last, lastTotal = done, total
		calls++
	}); err != nil {
		t.Fatal(err)
	}
	if calls == 0 || last != lastTotal || last != size-written {
		t.Errorf("progress ended at %d of %d after %d calls; %d bytes were to zero", last, lastTotal, calls, size-written)
	}
	if written, _, err = store.WrittenBytes(path); err != nil || written != size {
		t.Fatalf("after ZeroFile: written %d of %d, %v", written, size, err)
	}
	all, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != size {
		t.Fatalf("ZeroFile changed the size to %d", len(all))
	}
	if !bytes.Equal(all[at:at+len(data)], data) {
		t.Fatal("ZeroFile overwrote written data")
	}
	clear(all[at : at+len(data)])
	if !bytes.Equal(all, make([]byte, size)) {
		t.Fatal("ZeroFile left a non-zero byte outside the written data")
	}
	// Again: nothing left to write, nothing changes.
	if err := store.ZeroFile(path, nil); err != nil {
		t.Fatal(err)
	}
	if again, err := os.ReadFile(path); err != nil || !bytes.Equal(again[at:at+len(data)], data) {
		t.Fatalf("a second ZeroFile: %v", err)
	}

	for _, bad := range []string{t.TempDir(), filepath.Join(t.TempDir(), "missing")} {
		if err := store.ZeroFile(bad, nil); err == nil {
			t.Errorf("ZeroFile(%s): no error", bad)
		}
		if _, _, err := store.WrittenBytes(bad); err == nil {
			t.Errorf("WrittenBytes(%s): no error", bad)
		}
	}
}
