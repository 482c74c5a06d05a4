package fs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// TestHeadDirsExistOnlyWithGroupsOrMkdir: a block directory lists the heads
// holding a group, and those made with mkdir; so cp -r of a backed-up
// block into a fresh block directory can make every head.
func TestHeadDirsExistOnlyWithGroupsOrMkdir(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 0x51, Layer: 2, Head: 1, Kind: layout.V}
	e.put(k)
	blk := e.blockPath(2, 0x51)
	if got := names(t, blk); !slices.Equal(got, []string{"head-1"}) {
		t.Fatalf("block lists %v", got)
	}
	h0 := filepath.Join(blk, "head-0")
	if _, err := os.Stat(h0); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("head without a group: %v", err)
	}
	wantErrno(t, "mkdir head with a group", os.Mkdir(filepath.Join(blk, "head-1"), 0o755), syscall.EEXIST)
	if err := os.Mkdir(h0, 0o755); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, "mkdir again", os.Mkdir(h0, 0o755), syscall.EEXIST)
	if got := names(t, blk); !slices.Equal(got, []string{"head-0", "head-1"}) {
		t.Fatalf("block lists %v after mkdir", got)
	}
	// A fresh block directory holds no head until one is made.
	fresh := e.blockPath(3, 0x52)
	if err := os.MkdirAll(filepath.Join(fresh, "head-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := names(t, fresh); !slices.Equal(got, []string{"head-1"}) {
		t.Fatalf("fresh block lists %v", got)
	}
	wantErrno(t, "rmdir block with a head", os.Remove(fresh), syscall.ENOTEMPTY)
	if err := os.RemoveAll(fresh); err != nil {
		t.Fatal(err)
	}
	// rm of the last group leaves the head directory until rmdir.
	if err := os.Remove(e.path(k)); err != nil {
		t.Fatal(err)
	}
	if got := names(t, blk); !slices.Equal(got, []string{"head-0", "head-1"}) {
		t.Fatalf("block lists %v after rm of its group", got)
	}
	if err := os.Remove(filepath.Join(blk, "head-1")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(h0); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(blk); err != nil {
		t.Fatal(err)
	}
	if m := e.srv.FS.Metrics(); m.PendingDirs != 0 {
		t.Fatalf("%d pending directories left", m.PendingDirs)
	}
}

// TestStagedFileLifecycle: a staged file is stored only by a rename onto K
// or V, with the size checks of a close; the store never sees it otherwise.
// (The linger is long here, so that nothing expires under a slow run:
// TestStagedFileExpires tests expiry.)
func TestStagedFileLifecycle(t *testing.T) {
	e := mountEnv(t, 4, Options{StageLinger: time.Minute, MaxStaged: 3})
	k := layout.Key{Block: 0x61, Layer: 0, Head: 0, Kind: layout.K}
	e.put(k)
	head := filepath.Dir(e.path(k))
	data := groupData(testGeo, 7)
	tmp := filepath.Join(head, ".V.x1")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(tmp); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read staged: %v", err)
	}
	if got := names(t, head); !slices.Equal(got, []string{".V.x1", "K"}) {
		t.Fatalf("head lists %v", got)
	}
	if bi, _ := e.st.Block(0x61); bi.Groups != 1 {
		t.Fatalf("a staged file reached the store: %+v", bi)
	}
	// Closed and renamed within the linger (rsync): stored.
	if err := os.Rename(tmp, filepath.Join(head, "V")); err != nil {
		t.Fatal(err)
	}
	e.mustEqualStore(other(k), data)
	if got, err := os.ReadFile(filepath.Join(head, "V")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read V after the rename: %v", err)
	}
	// Wrong size: ERANGE, the group keeps its bytes; past the group: EFBIG.
	small := filepath.Join(head, "small")
	if err := os.WriteFile(small, data[:100], 0o644); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, "rename a short staged file", os.Rename(small, filepath.Join(head, "V")), syscall.ERANGE)
	e.mustEqualStore(other(k), data)
	wantErrno(t, "write past a group", os.WriteFile(filepath.Join(head, "big"), append(data, 1), 0o644), syscall.EFBIG)
	wantErrno(t, "rename a long staged file", os.Rename(filepath.Join(head, "big"), filepath.Join(head, "V")), syscall.EFBIG)
	// Staged onto staged, and a bound on how many are held.
	if err := os.Rename(small, filepath.Join(head, "small2")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(head, "third"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fourth, err := os.Create(filepath.Join(head, "fourth"))
	if err == nil {
		fourth.Close() // before failing: an open file would hold the unmount
	}
	wantErrno(t, "create past MaxStaged", err, syscall.ENOSPC)
	// RENAME_NOREPLACE onto a group; RENAME_EXCHANGE is not offered.
	wantErrno(t, "noreplace", unix.Renameat2(unix.AT_FDCWD, filepath.Join(head, "small2"), unix.AT_FDCWD, filepath.Join(head, "K"), unix.RENAME_NOREPLACE), syscall.EEXIST)
	wantErrno(t, "exchange", unix.Renameat2(unix.AT_FDCWD, e.path(k), unix.AT_FDCWD, filepath.Join(head, "V"), unix.RENAME_EXCHANGE), syscall.EINVAL)
	for _, n := range []string{"small2", "big", "third"} {
		if err := os.Remove(filepath.Join(head, n)); err != nil {
			t.Fatal(err)
		}
	}
	if m := e.srv.FS.Metrics(); m.StagedStored != 1 || m.Stored != 1 || m.Staged != 0 {
		t.Fatalf("metrics %+v", m)
	}
	if bi, _ := e.st.Block(0x61); bi.Groups != 2 {
		t.Fatalf("store holds %+v", bi)
	}
}

// TestStagedFileExpires: a staged file never renamed disappears after the
// linger, and nothing is stored.
func TestStagedFileExpires(t *testing.T) {
	e := mountEnv(t, 4, Options{StageLinger: 100 * time.Millisecond})
	k := layout.Key{Block: 0x63, Layer: 0, Head: 0, Kind: layout.K}
	e.put(k)
	junk := filepath.Join(filepath.Dir(e.path(k)), ".V.junk")
	if err := os.WriteFile(junk, groupData(testGeo, 3), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		_, err := os.Stat(junk)
		return errors.Is(err, os.ErrNotExist)
	})
	if bi, _ := e.st.Block(0x63); bi.Groups != 1 {
		t.Fatalf("store holds %+v", bi)
	}
	if m := e.srv.FS.Metrics(); m.Staged != 0 || m.Stored != 0 {
		t.Fatalf("metrics %+v", m)
	}
}

// TestStagedGoneAtClose: with a negative linger, a staged file disappears at
// its last close.
func TestStagedGoneAtClose(t *testing.T) {
	e := mountEnv(t, 4, Options{StageLinger: -1})
	if err := os.MkdirAll(filepath.Join(e.blockPath(1, 0x62), "head-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(e.blockPath(1, 0x62), "head-1", "t")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(groupData(testGeo, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("staged file while open: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// The kernel sends RELEASE just after close(2) returns, not before.
	waitFor(t, func() bool {
		_, err := os.Stat(p)
		return errors.Is(err, os.ErrNotExist)
	})
	if n := len(e.st.Blocks()); n != 0 {
		t.Fatalf("%d blocks stored", n)
	}
}

// TestRenameGroupsAndBlocks: K onto V re-keys a group; a block directory
// renamed in one layer moves the block in every layer, in place.
func TestRenameGroupsAndBlocks(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 0x71, Layer: 1, Head: 1, Kind: layout.K}
	k2 := layout.Key{Block: 0x71, Layer: 3, Head: 0, Kind: layout.V}
	d := e.put(k, k2)
	// Read K first, so the kernel and go-fuse know its node.
	if got, err := os.ReadFile(e.path(k)); err != nil || !bytes.Equal(got, d[k]) {
		t.Fatalf("read K: %v", err)
	}
	// A group is never renamed in place: mv copies and deletes.
	wantErrno(t, "rename K onto V", os.Rename(e.path(k), e.path(other(k))), syscall.EXDEV)
	e.mustEqualStore(k, d[k])
	// Across heads: EXDEV.
	if err := os.MkdirAll(filepath.Dir(e.path(layout.Key{Block: 0x71, Layer: 1, Head: 0})), 0o755); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, "rename across heads", os.Rename(e.path(k), e.path(layout.Key{Block: 0x71, Layer: 1, Head: 0})), syscall.EXDEV)
	// (unix.Rename: os.Rename refuses an existing directory by itself.)
	wantErrno(t, "rename a head", unix.Rename(filepath.Dir(e.path(k)), filepath.Join(e.blockPath(1, 0x71), "head-0")), syscall.EXDEV)

	// The block, renamed through layer 1, moves in layer 3 too.
	slot, _ := e.st.Stat(k2)
	if err := os.Rename(e.blockPath(1, 0x71), e.blockPath(1, 0x72)); err != nil {
		t.Fatal(err)
	}
	// At once, through the layer the rename went through (the kernel kept
	// the old directory's node under the new name until fs told it not
	// to) and through another layer.
	if got, err := os.ReadFile(filepath.Join(e.blockPath(1, 0x72), "head-1", "K")); err != nil || !bytes.Equal(got, d[k]) {
		t.Fatalf("read the renamed block in its layer: %v", err)
	}
	moved := k2
	moved.Block = 0x72
	if got, err := os.ReadFile(e.path(moved)); err != nil || !bytes.Equal(got, d[k2]) {
		t.Fatalf("read the renamed block in another layer: %v", err)
	}
	if gi, err := e.st.Stat(moved); err != nil || gi.Slot != slot.Slot {
		t.Fatalf("renamed block: %+v %v, was in slot %d", gi, err, slot.Slot)
	}
	for _, l := range []int{1, 3} {
		if _, err := os.Stat(e.blockPath(l, 0x71)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("old block in layer %d: %v", l, err)
		}
	}
	if _, err := e.st.Stat(k2); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("old key: %v", err)
	}
	// Onto an existing block: ENOTEMPTY; to another layer: EXDEV.
	e.put(layout.Key{Block: 0x73, Layer: 0})
	wantErrno(t, "rename onto a block", os.Rename(e.blockPath(1, 0x72), e.blockPath(1, 0x73)), syscall.ENOTEMPTY)
	wantErrno(t, "rename across layers", os.Rename(e.blockPath(1, 0x72), e.blockPath(2, 0x72)), syscall.EXDEV)
	// A pending (empty) block directory moves in its layer only.
	if err := os.Mkdir(e.blockPath(2, 0x90), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(e.blockPath(2, 0x90), e.blockPath(2, 0x91)); err != nil {
		t.Fatal(err)
	}
	if got := names(t, filepath.Join(e.dir, "layer-2")); !slices.Equal(got, []string{layout.BlockName(0x91)}) {
		t.Fatalf("layer-2 lists %v", got)
	}
	if err := os.Remove(e.blockPath(2, 0x91)); err != nil {
		t.Fatal(err)
	}
}

// TestAttributesAcceptedAndIgnored: chmod, chown and times succeed on
// groups and directories and change nothing.
func TestAttributesAcceptedAndIgnored(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 0x81, Layer: 0, Head: 1, Kind: layout.V}
	d := e.put(k)
	before, err := os.Stat(e.path(k))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{e.path(k), filepath.Dir(e.path(k)), e.blockPath(0, 0x81)} {
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatalf("chmod %s: %v", p, err)
		}
		if err := os.Chown(p, 12345, 12345); err != nil {
			t.Fatalf("chown %s: %v", p, err)
		}
		if err := os.Chtimes(p, time.Unix(1e9, 0), time.Unix(1e9, 0)); err != nil {
			t.Fatalf("chtimes %s: %v", p, err)
		}
	}
	after, err := os.Stat(e.path(k))
	if err != nil {
		t.Fatal(err)
	}
	if after.Mode() != before.Mode() || !after.ModTime().Equal(before.ModTime()) || after.Mode().Perm() != 0o644 {
		t.Fatalf("attributes changed: %v %v → %v %v", before.Mode(), before.ModTime(), after.Mode(), after.ModTime())
	}
	e.mustEqualStore(k, d[k])
	wantErrno(t, "set a trusted attribute", unix.Setxattr(e.path(k), "trusted.kvfs", []byte{1}, 0), syscall.EOPNOTSUPP, syscall.EPERM)
	wantErrno(t, "set a user attribute", unix.Setxattr(e.path(k), "user.x", []byte("0"), 0), syscall.EPERM)
	// user.kvfs.* (a restore with rsync -X carries them): accepted, ignored.
	if err := unix.Setxattr(e.path(k), "user.kvfs.crc32c", []byte("00000000"), 0); err != nil {
		t.Fatalf("set user.kvfs.crc32c: %v", err)
	}
	crc := make([]byte, 8)
	if n, err := unix.Getxattr(e.path(k), "user.kvfs.crc32c", crc); err != nil || string(crc[:n]) == "00000000" {
		t.Fatalf("user.kvfs.crc32c after setting it: %q %v", crc, err)
	}
	wantErrno(t, "remove an absent attribute", unix.Removexattr(e.blockPath(0, 0x81), "system.posix_acl_default"), syscall.ENODATA)
}
