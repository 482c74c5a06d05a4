package fs

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/layout"
)

// FuzzNames throws arbitrary names at every level of a mounted tree with
// every name-taking operation: each answer must be one of the errnos the
// package documents, nothing may panic or become an unexplained EIO, and
// the store must end up holding only the groups it started with.
//
//	go test -run '^$' -fuzz FuzzNames -fuzztime 30s ./fs/
func FuzzNames(f *testing.F) {
	for _, s := range []string{"layer-0", "layer-3", "layer-4", "layer-00", "block-0000000000000001", "block-00000000000000AB",
		"head-0", "head-1", "head-2", "K", "V", "k", ".kvfs", "ctl", "stats", "..", ".", "x", "layer-", "block-", "head-",
		"layer-1\x00", strings.Repeat("a", 255), strings.Repeat("b", 300), "block-000000000000000g", "K ", "\xff\xfe"} {
		f.Add(s)
	}
	e := mountShared(f) // one mount for every input
	f.Fuzz(func(t *testing.T, name string) {
		if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			return
		}
		k := layout.Key{Block: 1, Layer: 1, Head: 1, Kind: layout.K}
		dirs := []string{e.dir, filepath.Join(e.dir, "layer-1"), e.blockPath(1, 1), filepath.Dir(e.path(k)), filepath.Join(e.dir, ".kvfs")}
		ok := func(op string, err error, allowed ...syscall.Errno) {
			if err == nil {
				return
			}
			got := errnoOf(err)
			for _, a := range append(allowed, syscall.ENOENT, syscall.ENAMETOOLONG) {
				if got == a {
					return
				}
			}
			t.Fatalf("%s %q: %v", op, name, err)
		}
		for _, d := range dirs {
			p := filepath.Join(d, name)
			_, err := os.Lstat(p)
			ok("stat", err)
			existed := err == nil
			if _, err := os.ReadDir(p); err != nil {
				ok("readdir", err, syscall.ENOTDIR)
			}
			if _, err := os.ReadFile(p); err != nil {
				ok("read", err, syscall.EISDIR, syscall.EACCES, syscall.EINVAL)
			}
			_, err = unix.Getxattr(p, "user.kvfs.crc32c", make([]byte, 16))
			ok("getxattr", err, syscall.ENODATA)
			ok("setxattr", unix.Setxattr(p, "user.x", []byte("1"), 0), syscall.EPERM)
			ok("symlink", os.Symlink("K", p), syscall.EPERM, syscall.EEXIST)
			ok("mknod", unix.Mknod(p, unix.S_IFIFO|0o644, 0), syscall.EPERM, syscall.EEXIST)
			if existed {
				continue // leave what exists alone
			}
			if err := os.Mkdir(p, 0o755); err == nil {
				ok("rmdir", os.Remove(p))
			} else {
				ok("mkdir", err, syscall.EPERM, syscall.EEXIST)
			}
			// Creating a file: only K and V in a head directory, and
			// an empty one is refused at close.
			if fh, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err == nil {
				ok("close", fh.Close(), syscall.EINVAL)
			} else {
				ok("create", err, syscall.EPERM, syscall.EEXIST, syscall.EISDIR, syscall.EACCES)
			}
			ok("remove", os.Remove(p), syscall.EPERM, syscall.ENOTEMPTY, syscall.EISDIR)
		}
		m := e.srv.FS.Metrics()
		if m.Errors != 0 || m.Panics != 0 {
			t.Fatalf("after %q: %d unexpected errors, %d panics", name, m.Errors, m.Panics)
		}
		if bs := e.st.Blocks(); len(bs) != 1 || bs[0].Groups != 2 {
			t.Fatalf("after %q the store holds %+v", name, bs)
		}
	})
}

// mountShared mounts a store holding block 1's K and V of layer 1, head 1.
func mountShared(f *testing.F) *env {
	requireFUSE(f)
	// The daemon logs each refusal; a log through f from inside the fuzz
	// target would panic (testing.F), so this mount logs nowhere.
	e := mountEnv(f, 4, Options{Logger: zap.NewNop()})
	k := layout.Key{Block: 1, Layer: 1, Head: 1, Kind: layout.K}
	e.put(k, other(k))
	return e
}
