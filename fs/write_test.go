package fs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

func TestMkdirAndCopyStoreAGroup(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 0xc0ffee, Layer: 2, Head: 1, Kind: layout.K}
	head := filepath.Dir(e.path(k))
	if err := os.MkdirAll(head, 0o755); err != nil {
		t.Fatal(err)
	}
	// mkdir -p again: everything exists.
	if err := os.MkdirAll(head, 0o755); err != nil {
		t.Fatal(err)
	}
	// The pending block directory is listed, empty, and the store has
	// nothing yet.
	if got := names(t, filepath.Join(e.dir, "layer-2")); !slices.Equal(got, []string{layout.BlockName(0xc0ffee)}) {
		t.Fatalf("layer-2 lists %v", got)
	}
	if got := names(t, head); len(got) != 0 {
		t.Fatalf("new head dir lists %v", got)
	}
	if _, ok := e.st.Block(0xc0ffee); ok {
		t.Fatal("mkdir created a block in the store")
	}
	data := groupData(e.geo, 42)
	if err := os.WriteFile(e.path(k), data, 0o644); err != nil {
		t.Fatal(err)
	}
	e.mustEqualStore(k, data)
	got, err := os.ReadFile(e.path(k))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v", err)
	}
	if e.srv.FS.Metrics().PendingDirs != 0 {
		t.Fatal("pending directory kept after a group was stored")
	}
	// Overwrite with O_TRUNC.
	data2 := groupData(e.geo, 43)
	if err := os.WriteFile(e.path(k), data2, 0o644); err != nil {
		t.Fatal(err)
	}
	e.mustEqualStore(k, data2)
	// Written in pieces, including out of order.
	f, err := os.OpenFile(e.path(other(k)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	half := len(data) / 2
	if _, err := f.WriteAt(data[half:], int64(half)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data[:half], 0); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Size != int64(len(data)) {
		t.Fatalf("fstat while writing: %v size %d", err, st.Size)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	e.mustEqualStore(other(k), data)
}

func TestPartialOverwriteAndReadWrite(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 5, Layer: 0, Head: 0, Kind: layout.V}
	old := e.put(k)[k]
	// dd conv=notrunc: patch 16 bytes in place.
	f, err := os.OpenFile(e.path(k), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	patch := bytes.Repeat([]byte{0xee}, 16)
	if _, err := f.WriteAt(patch, 100); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(old)
	copy(want[100:], patch)
	e.mustEqualStore(k, want)

	// O_RDWR reads its own unstored bytes.
	f, err = os.OpenFile(e.path(k), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "hello" {
		t.Fatalf("read own write: %q %v", b, err)
	}
	e.mustEqualStore(k, want) // not stored before close
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	copy(want, "hello")
	e.mustEqualStore(k, want)

	// truncate(2) by path only to the group's size.
	if err := os.Truncate(e.path(k), int64(e.geo.GroupBytes())); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, "truncate to 0", os.Truncate(e.path(k), 0), syscall.EPERM)
	e.mustEqualStore(k, want)
	// ftruncate + write the whole group on an O_RDWR handle.
	f, err = os.OpenFile(e.path(k), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(old); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	e.mustEqualStore(k, old)
}

func TestWrongSizeStoresNothing(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 9, Layer: 1, Head: 0, Kind: layout.K}
	if err := os.MkdirAll(filepath.Dir(e.path(k)), 0o755); err != nil {
		t.Fatal(err)
	}
	gb := e.geo.GroupBytes()
	for _, n := range []int{0, 1, gb - 1} {
		f, err := os.Create(e.path(k))
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			if _, err := f.Write(make([]byte, n)); err != nil {
				t.Fatal(err)
			}
		}
		wantErrno(t, "close after a short write", f.Close(), syscall.EINVAL)
		if _, err := e.st.Stat(k); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%d bytes: group stored (%v)", n, err)
		}
	}
	// Past the group: the write fails with EFBIG, and so does close,
	// even though the first group's worth of bytes arrived.
	f, err := os.Create(e.path(k))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, gb)); err != nil {
		t.Fatal(err)
	}
	_, err = f.Write([]byte{1})
	wantErrno(t, "write past the group", err, syscall.EFBIG)
	wantErrno(t, "close after EFBIG", f.Close(), syscall.EFBIG)
	if _, err := e.st.Stat(k); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("oversized file stored (%v)", err)
	}
	// One write of two groups.
	err = os.WriteFile(e.path(k), make([]byte, 2*gb), 0o644)
	wantErrno(t, "write two groups", err, syscall.EFBIG)
	// Over an existing group: a failed write leaves it as it was.
	old := e.put(k)[k]
	err = os.WriteFile(e.path(k), make([]byte, gb/2), 0o644)
	wantErrno(t, "short overwrite", err, syscall.EINVAL)
	e.mustEqualStore(k, old)
	if m := e.srv.FS.Metrics(); m.Rejected < 5 {
		t.Fatalf("rejected = %d", m.Rejected)
	}
}

func TestTwoWritersNeverMix(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 3, Layer: 0, Head: 1, Kind: layout.K}
	if err := os.MkdirAll(filepath.Dir(e.path(k)), 0o755); err != nil {
		t.Fatal(err)
	}
	a, b := groupData(e.geo, 1), groupData(e.geo, 2)
	half := len(a) / 2
	for _, closeAFirst := range []bool{true, false} {
		fa, err := os.OpenFile(e.path(k), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fb, err := os.OpenFile(e.path(k), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		// Interleaved writes.
		mustWriteAt(t, fa, a[:half], 0)
		mustWriteAt(t, fb, b[:half], 0)
		mustWriteAt(t, fb, b[half:], int64(half))
		mustWriteAt(t, fa, a[half:], int64(half))
		first, second, last := fa, fb, b
		if !closeAFirst {
			first, second, last = fb, fa, a
		}
		if err := first.Close(); err != nil {
			t.Fatal(err)
		}
		if err := second.Close(); err != nil {
			t.Fatal(err)
		}
		e.mustEqualStore(k, last)
	}
}

func mustWriteAt(t *testing.T, f *os.File, b []byte, off int64) {
	t.Helper()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestOnlyGroupsAndBlockDirsCanBeCreated(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 0x77, Layer: 1, Head: 0, Kind: layout.K}
	e.put(k)
	blk := e.blockPath(1, 0x77)
	head := filepath.Dir(e.path(k))
	for _, p := range []string{
		filepath.Join(e.dir, "file"), filepath.Join(e.dir, "layer-1", "file"), filepath.Join(blk, "file"),
		filepath.Join(e.dir, ".kvfs", "new"),
	} {
		_, err := os.Create(p)
		wantErrno(t, "create "+p, err, syscall.EPERM, syscall.EINVAL)
	}
	for _, p := range []string{
		filepath.Join(e.dir, "dir"), filepath.Join(e.dir, "layer-1", "block-1"), filepath.Join(e.dir, "layer-1", "dir"),
		filepath.Join(blk, "head-9"), filepath.Join(blk, "dir"), filepath.Join(head, "dir"), filepath.Join(head, "K2"),
	} {
		wantErrno(t, "mkdir "+p, os.Mkdir(p, 0o755), syscall.EPERM, syscall.EINVAL)
	}
	wantErrno(t, "mkdir layer", os.Mkdir(filepath.Join(e.dir, "layer-1"), 0o755), syscall.EEXIST)
	wantErrno(t, "mkdir head", os.Mkdir(filepath.Join(blk, "head-0"), 0o755), syscall.EEXIST)
	wantErrno(t, "symlink", os.Symlink("K", filepath.Join(head, "V")), syscall.EPERM, syscall.EINVAL)
	wantErrno(t, "symlink root", os.Symlink("x", filepath.Join(e.dir, "s")), syscall.EPERM, syscall.EINVAL)
	wantErrno(t, "link", os.Link(e.path(k), filepath.Join(head, "V")), syscall.EPERM, syscall.EINVAL)
	wantErrno(t, "mknod", unix.Mknod(filepath.Join(head, "V"), unix.S_IFIFO|0o644, 0), syscall.EPERM, syscall.EINVAL)
	wantErrno(t, "rename onto a temporary name", os.Rename(e.path(k), filepath.Join(head, "X")), syscall.EPERM)
	wantErrno(t, "rename to another layer", os.Rename(blk, e.blockPath(2, 0x77)), syscall.EXDEV)
	wantErrno(t, "rename a layer", os.Rename(filepath.Join(e.dir, "layer-1"), filepath.Join(e.dir, "layer-5")), syscall.EPERM)
	wantErrno(t, "rmdir layer", os.Remove(filepath.Join(e.dir, "layer-1")), syscall.EPERM, syscall.ENOTEMPTY)
	wantErrno(t, "rm ctl", os.Remove(filepath.Join(e.dir, ".kvfs", "ctl")), syscall.EPERM)
	// The store holds only the one group.
	if bs := e.st.Blocks(); len(bs) != 1 || bs[0].Groups != 1 {
		t.Fatalf("store holds %+v", bs)
	}
}

func TestRemoveGroupsAndBlocks(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	var keys []layout.Key
	for l := range 2 {
		for h := range 2 {
			for _, kind := range []layout.Kind{layout.K, layout.V} {
				keys = append(keys, layout.Key{Block: 0xb1, Layer: l, Head: h, Kind: kind})
			}
		}
	}
	e.put(keys...)
	// rm of one group.
	if err := os.Remove(e.path(keys[0])); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Stat(keys[0]); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("group still stored: %v", err)
	}
	wantErrno(t, "rm again", os.Remove(e.path(keys[0])), syscall.ENOENT)
	wantErrno(t, "rmdir non-empty block", os.Remove(e.blockPath(0, 0xb1)), syscall.ENOTEMPTY)
	wantErrno(t, "rmdir non-empty head", os.Remove(filepath.Join(e.blockPath(0, 0xb1), "head-1")), syscall.ENOTEMPTY)
	// rm -r of the block in layer 0 removes that layer's groups only.
	if err := os.RemoveAll(e.blockPath(0, 0xb1)); err != nil {
		t.Fatal(err)
	}
	if got := names(t, filepath.Join(e.dir, "layer-0")); len(got) != 0 {
		t.Fatalf("layer-0 still lists %v", got)
	}
	bi, ok := e.st.Block(0xb1)
	if !ok || bi.Groups != 4 {
		t.Fatalf("block after rm -r of layer 0: %+v %v", bi, ok)
	}
	// rm -r of the last layer: the block disappears from the store.
	if err := os.RemoveAll(e.blockPath(1, 0xb1)); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.st.Block(0xb1); ok {
		t.Fatal("block still in the store")
	}
	if got := names(t, filepath.Join(e.dir, "layer-1")); len(got) != 0 {
		t.Fatalf("layer-1 still lists %v", got)
	}
	// A pending block directory is removed by rmdir.
	if err := os.Mkdir(e.blockPath(3, 0xdd), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(e.blockPath(3, 0xdd)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.blockPath(3, 0xdd)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pending dir after rmdir: %v", err)
	}
	if m := e.srv.FS.Metrics(); m.PendingDirs != 0 || m.Deletes != 8 {
		t.Fatalf("metrics %+v", m)
	}
}

// other is the key of the group's K/V sibling.
func other(k layout.Key) layout.Key {
	k.Kind = 1 - k.Kind
	return k
}

// TestRefusalsAreLogged: a refusal whose errno alone does not explain it
// (the close that refuses a short write, which a shell's redirection
// ignores; a create or mkdir of a name the tree has no place for) is logged
// with its path and the reason.
func TestRefusalsAreLogged(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	e := mountEnv(t, 4, Options{Logger: zap.New(core)})
	k := layout.Key{Block: 0xbeef, Layer: 1, Head: 0, Kind: layout.K}
	e.put(k)
	blk := e.blockPath(1, 0xbeef)
	head := filepath.Dir(e.path(k))
	rel := func(p string) string { r, _ := filepath.Rel(e.dir, p); return r }

	f, err := os.Create(filepath.Join(head, "V"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, "close after a short write", f.Close(), syscall.EINVAL)
	wantErrno(t, "mkdir in a layer", os.Mkdir(filepath.Join(e.dir, "layer-1", "foo"), 0o755), syscall.EPERM)
	wantErrno(t, "mkdir in a block", os.Mkdir(filepath.Join(blk, "foo"), 0o755), syscall.EPERM)
	wantErrno(t, "mkdir in the root", os.Mkdir(filepath.Join(e.dir, "foo"), 0o755), syscall.EPERM)
	_, err = os.Create(filepath.Join(blk, "notes"))
	wantErrno(t, "create in a block", err, syscall.EPERM)

	for _, want := range []struct{ op, path, why string }{
		{"close", rel(filepath.Join(head, "V")), "closed holding 3 bytes"},
		{"mkdir", "layer-1/foo", "block-<16 lowercase hex digits>"},
		{"mkdir", rel(filepath.Join(blk, "foo")), "head-<H>"},
		{"mkdir", "foo", "layer-<L>"},
		{"create", rel(filepath.Join(blk, "notes")), "nothing else can be made here"},
	} {
		// The close is logged at FUSE's RELEASE, which close(2) does
		// not wait for.
		found := false
		for deadline := time.Now().Add(5 * time.Second); !found && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			for _, l := range logs.FilterMessage("fs: refused").All() {
				c := l.ContextMap()
				if c["op"] == want.op && c["path"] == want.path && strings.Contains(c["why"].(string), want.why) {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("no refusal logged for %s %s (%q); logged: %v", want.op, want.path, want.why, logs.All())
		}
	}
	if bs := e.st.Blocks(); len(bs) != 1 || bs[0].Groups != 1 {
		t.Fatalf("store holds %+v", bs)
	}
}
