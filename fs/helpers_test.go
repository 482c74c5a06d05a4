package fs

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// testGeo has 4 KiB groups (16 tokens × 128 × bf16), 4 layers, 2 heads.
var testGeo = layout.Geometry{Layers: 4, KVHeads: 2, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}

// requireFUSE skips the test unless a real FUSE mount is possible here.
func requireFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if _, err := os.Stat("/usr/bin/fusermount3"); err != nil {
			t.Skip("skipping: FUSE tests need root (or fusermount3); CI runs them as root")
		}
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("skipping: /dev/fuse is missing; CI provides it")
	}
}

type env struct {
	t    testing.TB
	mem  *storetest.Mem
	st   *store.Store
	srv  *Server
	dir  string
	geo  layout.Geometry
	opts Options
}

func newStore(t testing.TB, geo layout.Geometry, slots int64) (*storetest.Mem, *store.Store) {
	t.Helper()
	mem := storetest.Formatted(t, geo, slots, 4096)
	st := storetest.Open(t, mem, store.Options{})
	return mem, st
}

// mountEnv mounts a fresh in-memory store of slots slots in a temporary
// directory; everything is unmounted and closed at cleanup.
func mountEnv(t testing.TB, slots int64, opts Options) *env {
	t.Helper()
	requireFUSE(t)
	mem, st := newStore(t, testGeo, slots)
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	dir := t.TempDir()
	srv, err := Mount(dir, st, opts)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, mem: mem, st: st, srv: srv, dir: dir, geo: testGeo, opts: opts}
	t.Cleanup(func() {
		if err := unmountRetry(srv); err != nil {
			t.Errorf("unmount: %v", err)
		}
		srv.Wait()
		if err := st.CheckInvariants(); err != nil {
			t.Error(err)
		}
		if err := st.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return e
}

func unmountRetry(srv *Server) error {
	var err error
	for range 50 {
		if err = srv.Unmount(); err == nil || !errors.Is(err, syscall.EBUSY) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

func (e *env) path(k layout.Key) string { return filepath.Join(e.dir, e.geo.Name(k)) }

func (e *env) blockPath(layer int, block uint64) string {
	return filepath.Join(e.dir, e.geo.LayerName(layer), layout.BlockName(block))
}

func groupData(geo layout.Geometry, seed uint64) []byte {
	b := make([]byte, geo.GroupBytes())
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i < len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// put stores groups through the store, as the ioctl path would.
func (e *env) put(keys ...layout.Key) map[layout.Key][]byte {
	e.t.Helper()
	out := map[layout.Key][]byte{}
	reqs := make([]store.WriteReq, len(keys))
	for i, k := range keys {
		d := groupData(e.geo, k.Block*1000+uint64(e.geo.Index(k))+uint64(time.Now().UnixNano()))
		reqs[i] = store.WriteReq{Key: k, Data: d}
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

// get reads a group through the store.
func (e *env) get(k layout.Key) ([]byte, error) {
	buf := make([]byte, e.geo.GroupBytes())
	reqs := []store.ReadReq{{Key: k, Buf: buf}}
	if err := e.st.Read(reqs); err != nil {
		return nil, err
	}
	return buf, reqs[0].Err
}

func (e *env) mustEqualStore(k layout.Key, want []byte) {
	e.t.Helper()
	got, err := e.get(k)
	if err != nil {
		e.t.Fatalf("%v: %v", k, err)
	}
	if !bytes.Equal(got, want) {
		e.t.Fatalf("%v: store holds other bytes", k)
	}
}

func errnoOf(err error) syscall.Errno {
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	return 0
}

func wantErrno(t testing.TB, what string, err error, want ...syscall.Errno) {
	t.Helper()
	got := errnoOf(err)
	for _, w := range want {
		if got == w {
			return
		}
	}
	t.Fatalf("%s: got %v (%d), want one of %v", what, err, got, want)
}

// waitFor polls cond for up to 5 s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("condition not met after 5 s")
}
