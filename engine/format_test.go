package engine

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

func TestFormat(t *testing.T) {
	g := layout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, BlockTokens: 16, DType: layout.BF16, Align: 4096}
	dir := t.TempDir()
	path := filepath.Join(dir, "s.kvfs")
	fo := FormatPathOptions{Geometry: g, Engine: Options{Kind: KindPosix}}

	if _, err := FormatPath(path, fo); !errors.Is(err, ErrNeedSize) {
		t.Fatalf("no size for a new file: %v", err)
	}
	fo.Size = store.MinSize(g) - 1
	if _, err := FormatPath(path, fo); !errors.Is(err, store.ErrTooSmall) {
		t.Fatalf("below one slot: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a refusal created %s: %v", path, err)
	}
	fo.Size = 1 << 20
	sb, err := FormatPath(path, fo)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Geometry != g || sb.Slots < 1 {
		t.Fatalf("superblock %+v", sb)
	}
	s, closeAll, err := OpenStore(path, Options{Kind: KindPosix}, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Superblock().UUID != sb.UUID {
		t.Fatal("opened another store")
	}
	// In use: refused without a change.
	before, _ := os.ReadFile(path)
	if _, err := FormatPath(path, FormatPathOptions{Geometry: g, Force: true, Engine: Options{Kind: KindPosix}}); !errors.As(err, new(*LockedError)) {
		t.Fatalf("format of an open store: %v", err)
	}
	if err := closeAll(); err != nil {
		t.Fatal(err)
	}
	// Exists: refused without Force, the same size kept with it.
	fo.Size = 0
	if _, err := FormatPath(path, fo); !errors.Is(err, store.ErrExists) {
		t.Fatalf("existing store without force: %v", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("a refusal changed the store")
	}
	fo.Force = true
	sb2, err := FormatPath(path, fo)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); sb2.UUID == sb.UUID || st.Size() != 1<<20 {
		t.Fatalf("forced format: same uuid %v, size %d", sb2.UUID == sb.UUID, st.Size())
	}
	// A geometry the engine cannot align to, on a new file: refused, and
	// the file it created is gone again.
	fresh := filepath.Join(dir, "fresh.kvfs")
	odd := g
	odd.Align = 512
	if _, err := FormatPath(fresh, FormatPathOptions{Geometry: odd, Size: 1 << 20, Engine: Options{Kind: KindPosix}}); err != nil {
		// posix on this file system may do 512-byte I/O; only a refusal
		// must leave nothing behind.
		if !errors.Is(err, layout.ErrGeometry) {
			t.Fatal(err)
		}
		if _, serr := os.Stat(fresh); !os.IsNotExist(serr) {
			t.Fatalf("refused format left %s: %v", fresh, serr)
		}
	}
	bad := g
	bad.Layers = 0
	if _, err := FormatPath(filepath.Join(dir, "bad"), FormatPathOptions{Geometry: bad, Size: 1 << 20}); !errors.Is(err, layout.ErrGeometry) {
		t.Fatalf("invalid geometry: %v", err)
	}
}
