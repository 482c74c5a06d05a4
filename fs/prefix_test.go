package fs

import (
	"bytes"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// putMeta stores the given groups of one block with meta m through the
// store (as a tagged STORE_BLOCKS would) and returns their bytes.
func (e *env) putMeta(m *store.BlockMeta, seed uint64, keys ...layout.Key) map[layout.Key][]byte {
	e.t.Helper()
	out := map[layout.Key][]byte{}
	reqs := make([]store.WriteReq, len(keys))
	for i, k := range keys {
		d := groupData(e.geo, seed+uint64(e.geo.Index(k)))
		reqs[i] = store.WriteReq{Key: k, Data: d, Meta: m}
		out[k] = d
	}
	if err := e.st.Write(reqs); err != nil {
		e.t.Fatal(err)
	}
	for _, r := range reqs {
		if r.Err != nil {
			e.t.Fatal(r.Err)
		}
	}
	return out
}

// A block directory shows the block's tag and parent (user.kvfs.tag,
// user.kvfs.parent); an untagged block's tag is
// all zeros and it has no parent attribute; they cannot be removed.
func TestBlockXattrs(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	tag := store.Tag{0xde, 0xad, 0xbe, 0xef, 15: 0x01}
	e.putMeta(&store.BlockMeta{Tag: tag, Parent: 0x77, HasParent: true}, 1, layout.Key{Block: 0x42, Layer: 1})
	e.put(layout.Key{Block: 0x43})
	get := func(p, name string) (string, error) {
		b := make([]byte, 64)
		n, err := unix.Getxattr(p, name, b)
		if err != nil {
			return "", err
		}
		return string(b[:n]), nil
	}
	{
		p := e.blockPath(1, 0x42)
		if v, err := get(p, "user.kvfs.tag"); err != nil || v != "deadbeef000000000000000000000001" {
			t.Fatalf("tag %q %v", v, err)
		}
		if v, err := get(p, "user.kvfs.parent"); err != nil || v != "0000000000000077" {
			t.Fatalf("parent %q %v", v, err)
		}
		buf := make([]byte, 64)
		n, err := unix.Listxattr(p, buf)
		if err != nil || strings.TrimRight(string(buf[:n]), "\x00") != "user.kvfs.tag\x00user.kvfs.parent" {
			t.Fatalf("listxattr %q %v", buf[:n], err)
		}
		_, err = unix.Getxattr(p, "user.kvfs.tag", make([]byte, 4))
		wantErrno(t, "getxattr small buffer", err, syscall.ERANGE)
		wantErrno(t, "removexattr", unix.Removexattr(p, "user.kvfs.tag"), syscall.EPERM)
	}
	p := e.blockPath(0, 0x43)
	if v, err := get(p, "user.kvfs.tag"); err != nil || v != strings.Repeat("0", 32) {
		t.Fatalf("untagged block's tag %q %v", v, err)
	}
	_, err := get(p, "user.kvfs.parent")
	wantErrno(t, "parent of a block without one", err, syscall.ENODATA)
}

// Two prefixes forced onto one block id, read through the tree: once the
// second prefix stores its groups under the id, the first prefix's groups
// are gone (ENOENT), cached or not, and the second's read as written.
func TestTreeTagCollision(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k0, k1 := layout.Key{Block: 9}, layout.Key{Block: 9, Head: 1}
	a := e.putMeta(&store.BlockMeta{Tag: store.Tag{0xa}}, 100, k0, k1)
	for _, k := range []layout.Key{k0, k1} {
		if got, err := os.ReadFile(e.path(k)); err != nil || !bytes.Equal(got, a[k]) {
			t.Fatalf("read %v: %v", k, err)
		}
	}
	b := e.putMeta(&store.BlockMeta{Tag: store.Tag{0xb}}, 200, k0)
	if got, err := os.ReadFile(e.path(k0)); err != nil || !bytes.Equal(got, b[k0]) {
		t.Fatalf("read of the second prefix's group: %v (first prefix's bytes: %v)", err, bytes.Equal(got, a[k0]))
	}
	_, err := os.ReadFile(e.path(k1))
	wantErrno(t, "read of the first prefix's other group", err, syscall.ENOENT)
}
