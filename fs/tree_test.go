package fs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

func names(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("readdir %s: %v", dir, err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func TestTreeListsWhatTheStoreHolds(t *testing.T) {
	e := mountEnv(t, 8, Options{})
	a := layout.Key{Block: 0xa, Layer: 1, Head: 0, Kind: layout.K}
	b := layout.Key{Block: 0xa, Layer: 1, Head: 1, Kind: layout.V}
	c := layout.Key{Block: 0xb, Layer: 3, Head: 1, Kind: layout.K}
	e.put(a, b, c)

	if got, want := names(t, e.dir), []string{".kvfs", "layer-0", "layer-1", "layer-2", "layer-3"}; !slices.Equal(got, want) {
		t.Fatalf("root lists %v, want %v", got, want)
	}
	// A layer lists the blocks having a group in it.
	if got := names(t, filepath.Join(e.dir, "layer-0")); len(got) != 0 {
		t.Fatalf("layer-0 lists %v, want nothing", got)
	}
	if got, want := names(t, filepath.Join(e.dir, "layer-1")), []string{layout.BlockName(0xa)}; !slices.Equal(got, want) {
		t.Fatalf("layer-1 lists %v, want %v", got, want)
	}
	if got, want := names(t, filepath.Join(e.dir, "layer-3")), []string{layout.BlockName(0xb)}; !slices.Equal(got, want) {
		t.Fatalf("layer-3 lists %v, want %v", got, want)
	}
	// A block lists every head; a head lists the groups present.
	if got, want := names(t, e.blockPath(1, 0xa)), []string{"head-0", "head-1"}; !slices.Equal(got, want) {
		t.Fatalf("block lists %v, want %v", got, want)
	}
	if got, want := names(t, filepath.Join(e.blockPath(1, 0xa), "head-0")), []string{"K"}; !slices.Equal(got, want) {
		t.Fatalf("head-0 lists %v, want %v", got, want)
	}
	if got, want := names(t, filepath.Join(e.blockPath(1, 0xa), "head-1")), []string{"V"}; !slices.Equal(got, want) {
		t.Fatalf("head-1 lists %v, want %v", got, want)
	}
	if got, want := names(t, filepath.Join(e.dir, ".kvfs")), []string{"ctl", "geometry", "stats"}; !slices.Equal(got, want) {
		t.Fatalf(".kvfs lists %v, want %v", got, want)
	}

	// stat: size is the group size, mtime the write time, inode numbers
	// are stable and distinct.
	gi, err := e.st.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	var s1, s2, s3 unix.Stat_t
	if err := unix.Stat(e.path(a), &s1); err != nil {
		t.Fatal(err)
	}
	if s1.Size != int64(e.geo.GroupBytes()) || s1.Blocks != s1.Size/512 || s1.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Fatalf("stat: size %d mode %o", s1.Size, s1.Mode)
	}
	if got := s1.Mtim.Nano(); got != gi.MTime.UnixNano() {
		t.Fatalf("mtime %d, want %d", got, gi.MTime.UnixNano())
	}
	_ = unix.Stat(e.path(a), &s2)
	_ = unix.Stat(e.path(b), &s3)
	if s1.Ino != s2.Ino || s1.Ino == s3.Ino {
		t.Fatalf("inode numbers: %d %d %d", s1.Ino, s2.Ino, s3.Ino)
	}
	// Writing a group again changes its mtime at once (no attribute cache).
	e.put(a)
	gi2, _ := e.st.Stat(a)
	_ = unix.Stat(e.path(a), &s2)
	if s2.Mtim.Nano() != gi2.MTime.UnixNano() || gi2.MTime.Equal(gi.MTime) {
		t.Fatalf("mtime after rewrite %d, store says %d (was %d)", s2.Mtim.Nano(), gi2.MTime.UnixNano(), gi.MTime.UnixNano())
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(e.path(a), &sfs); err != nil || sfs.Blocks == 0 || sfs.Bfree >= sfs.Blocks {
		t.Fatalf("statfs: %v %+v", err, sfs)
	}
}

func TestBadNamesAreENOENT(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 0x1234, Layer: 2, Head: 1, Kind: layout.K}
	e.put(k)
	blk := layout.BlockName(0x1234)
	for _, p := range []string{
		"layer-4", "layer-02", "layer-x", "layer-", "layer--1", "nope", ".kvfs/nope",
		"layer-2/block-1234", "layer-2/block-00000000000012AB", "layer-2/" + blk + "0", "layer-2/" + layout.BlockName(0x99),
		"layer-1/" + blk, // the block has no group in layer 1
		"layer-2/" + blk + "/head-2", "layer-2/" + blk + "/head-01", "layer-2/" + blk + "/x",
		"layer-2/" + blk + "/head-1/V", "layer-2/" + blk + "/head-1/k", "layer-2/" + blk + "/head-1/KV",
	} {
		_, err := os.Stat(filepath.Join(e.dir, p))
		wantErrno(t, "stat "+p, err, syscall.ENOENT)
	}
	if _, err := os.Stat(e.path(k)); err != nil {
		t.Fatal(err)
	}
}

func TestReadsAtAnyOffset(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 7, Layer: 0, Head: 1, Kind: layout.V}
	want := e.put(k)[k]
	got, err := os.ReadFile(e.path(k))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("ReadFile: %v, equal %v", err, bytes.Equal(got, want))
	}
	f, err := os.Open(e.path(k))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gb := e.geo.GroupBytes()
	for _, c := range []struct{ off, n int }{{0, 1}, {1, 511}, {100, 1000}, {4095, 1}, {4000, 500}, {0, 8192}, {2048, 2048}} {
		buf := make([]byte, c.n)
		n, err := f.ReadAt(buf, int64(c.off))
		wantN := min(c.n, gb-c.off)
		if n != wantN || (err != nil && n == c.n) {
			t.Fatalf("ReadAt(%d, %d) = %d, %v; want %d", c.off, c.n, n, err, wantN)
		}
		if !bytes.Equal(buf[:n], want[c.off:c.off+n]) {
			t.Fatalf("ReadAt(%d, %d): wrong bytes", c.off, c.n)
		}
	}
	n, err := f.ReadAt(make([]byte, 10), int64(gb))
	if n != 0 || err == nil {
		t.Fatalf("read at EOF: %d %v", n, err)
	}
}

func TestXattrs(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 0xfeedbeef, Layer: 3, Head: 0, Kind: layout.V}
	data := e.put(k)[k]
	p := e.path(k)
	sz, err := unix.Listxattr(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, sz)
	if _, err := unix.Listxattr(p, buf); err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimRight(string(buf), "\x00"), "\x00")
	if !slices.Equal(got, xattrNames) {
		t.Fatalf("listxattr %v", got)
	}
	gi, _ := e.st.Stat(k)
	want := map[string]string{
		"user.kvfs.block": "00000000feedbeef", "user.kvfs.layer": "3", "user.kvfs.head": "0",
		"user.kvfs.kind": "V", "user.kvfs.dtype": "bf16", "user.kvfs.shape": "16x128",
		"user.kvfs.crc32c": fmt.Sprintf("%08x", store.CRC32C(data)),
		"user.kvfs.slot":   strconv.FormatInt(gi.Slot, 10),
	}
	for name, w := range want {
		b := make([]byte, 64)
		n, err := unix.Getxattr(p, name, b)
		if err != nil || string(b[:n]) != w {
			t.Fatalf("%s = %q, %v; want %q", name, b[:n], err, w)
		}
	}
	_, err = unix.Getxattr(p, "user.other", make([]byte, 8))
	wantErrno(t, "getxattr user.other", err, syscall.ENODATA)
	_, err = unix.Getxattr(p, "user.kvfs.block", make([]byte, 4))
	wantErrno(t, "getxattr small buffer", err, syscall.ERANGE)
	wantErrno(t, "setxattr", unix.Setxattr(p, "user.x", []byte("1"), 0), syscall.EPERM)
	wantErrno(t, "removexattr", unix.Removexattr(p, "user.kvfs.crc32c"), syscall.EPERM)
}

func TestKvfsFiles(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	e.put(layout.Key{Block: 1}, layout.Key{Block: 2, Layer: 1})
	b, err := os.ReadFile(filepath.Join(e.dir, ".kvfs", "geometry"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Layers, KVHeads, HeadDim, BlockTokens, GroupBytes int
		DType, Shape                                      string
		Slots                                             int64
	}
	if err := json.Unmarshal(bytes.ReplaceAll(b, []byte("_"), nil), &g); err != nil {
		t.Fatal(err)
	}
	if g.Layers != 4 || g.KVHeads != 2 || g.HeadDim != 128 || g.BlockTokens != 16 || g.DType != "bf16" ||
		g.GroupBytes != 4096 || g.Shape != "16x128" || g.Slots != 4 {
		t.Fatalf("geometry %+v from %s", g, b)
	}
	b, err = os.ReadFile(filepath.Join(e.dir, ".kvfs", "stats"))
	if err != nil {
		t.Fatal(err)
	}
	stats := map[string]any{}
	if err := json.Unmarshal(b, &stats); err != nil {
		t.Fatalf("stats are not one JSON object: %v\n%s", err, b)
	}
	for k, v := range map[string]float64{"slots": 4, "slots_used": 2, "slots_free": 2, "blocks": 2, "groups": 2, "store_writes": 2} {
		if stats[k] != v {
			t.Fatalf("stats %s = %v, want %v\n%s", k, stats[k], v, b)
		}
	}
	if cpu, ok := stats["daemon_cpu_seconds"].(float64); !ok || cpu <= 0 {
		t.Fatalf("stats daemon_cpu_seconds = %v\n%s", stats["daemon_cpu_seconds"], b)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(e.dir, ".kvfs", "stats"), &st); err != nil || st.Mode&0o777 != 0o444 {
		t.Fatalf("stats mode %o %v", st.Mode, err)
	}
	_, err = os.OpenFile(filepath.Join(e.dir, ".kvfs", "stats"), os.O_WRONLY, 0)
	wantErrno(t, "open stats for writing", err, syscall.EACCES, syscall.EPERM)
}
