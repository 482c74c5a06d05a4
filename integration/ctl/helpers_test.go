package ctl

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/ctl"
	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/ctl/ctltest"
	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/tier"
)

// testGeo: 4 KiB groups (16 tokens × 128 × bf16), 4 layers × 2 heads × 2 =
// 16 groups (64 KiB) per block.
var testGeo = layout.Geometry{Layers: 4, KVHeads: 2, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}

func requireMount(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: control-ioctl mount tests need root; CI runs them as root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("skipping: /dev/fuse is missing; CI provides it")
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &sfs); err != nil || sfs.Type != unix.TMPFS_MAGIC {
		t.Skip("skipping: needs /dev/shm on tmpfs")
	}
}

// minor0Handler serves the control file as a daemon of ABI 1.0 would.
type minor0Handler struct{ *ctl.Server }

func (h minor0Handler) Open(uid, gid uint32) (fs.CtlSession, syscall.Errno) {
	s, errno := h.Server.Open(uid, gid)
	if errno != 0 {
		return nil, errno
	}
	return minor0Session{s}, 0
}

type minor0Session struct{ *ctl.Session }

func (s minor0Session) IoctlFrom(pid, cmd uint32, in, out []byte) (int32, syscall.Errno) {
	if c, err := abi.Lookup(cmd); cmd == abi.CmdRegisterFD || (err == nil && c.Op >= abi.OpRegisterTarget) {
		return 0, syscall.ENOTTY
	}
	r, errno := s.Session.IoctlFrom(pid, cmd, in, out)
	if cmd == abi.CmdInfo && errno == 0 {
		var i abi.Info
		i.Unmarshal(out)
		i.Caps &^= abi.CapRegisterFD | abi.CapLimits | abi.CapBlocks | abi.CapPrefix
		i.MaxPinnedBytes, i.MaxPinnedPerUID, i.PinnedBytes, i.ABIMinor, i.MaxBlockEntries = 0, 0, 0, 0, 0
		i.Marshal(out)
	}
	return r, errno
}

type env struct {
	t   testing.TB
	dir string // mount point
	st  *store.Store
	mem *storetest.Mem // nil for a file store
	srv *ctl.Server
	fs  *fs.Server
	geo layout.Geometry
	gb  int
	// tier is the DRAM tier in front of the store, nil without one.
	tier *tier.Tier
}

type envOptions struct {
	slots int64
	ctl   ctl.Options
	// public makes the mount usable by every user (allow_other,
	// .kvfs/ctl mode 0666, directories on the way searchable).
	public bool
	// st, when set, is mounted instead of a fresh in-memory store.
	st *store.Store
	// minor0 makes the daemon look like one of ABI 1.0: INFO without the
	// minor-1 capabilities and fields, REGISTER_FD unknown (ENOTTY).
	minor0 bool
	// tierBlocks, when not 0, puts a DRAM tier of that many blocks in
	// front of the store, as kvfs mount --dram does.
	tierBlocks int64
}

func mountEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	requireMount(t)
	e := &env{t: t, geo: testGeo, gb: testGeo.GroupBytes(), st: o.st}
	if e.st == nil {
		if o.slots == 0 {
			o.slots = 64
		}
		e.mem = storetest.Formatted(t, testGeo, o.slots, 4096)
		st := storetest.Open(t, e.mem, store.Options{})
		e.st = st
		t.Cleanup(func() {
			if err := st.CheckInvariants(); err != nil {
				t.Error(err)
			}
			if err := st.Close(); err != nil {
				t.Errorf("close store: %v", err)
			}
		})
	}
	e.geo = e.st.Geometry()
	e.gb = e.geo.GroupBytes()
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	if o.ctl.Logger == nil {
		o.ctl.Logger = log
	}
	if o.tierBlocks > 0 {
		tr, err := tier.New(e.st, tier.Options{Bytes: o.tierBlocks * e.geo.PayloadBytes(), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		e.tier, o.ctl.Tier = tr, tr
		t.Cleanup(func() { tr.Close() }) // after the unmount's cleanup below
	}
	e.srv = ctl.NewServer(e.st, o.ctl)
	fo := fs.Options{Logger: log, Ctl: fs.Handler(e.srv.Open), Tier: e.tier}
	if o.minor0 {
		fo.Ctl = minor0Handler{e.srv}
	}
	if o.public {
		base, err := os.MkdirTemp("", "kvfs-ctl-")
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(base, 0o755)
		t.Cleanup(func() { os.RemoveAll(base) })
		e.dir = filepath.Join(base, "mnt")
		os.Mkdir(e.dir, 0o755)
		fo.AllowOther, fo.CtlMode = true, 0o666
	} else {
		e.dir = t.TempDir()
	}
	srv, err := fs.Mount(e.dir, e.st, fo)
	if err != nil {
		t.Fatal(err)
	}
	e.fs = srv
	t.Cleanup(func() {
		// Every session must be gone once the clients closed.
		e.waitSessions(0)
		var err error
		for range 100 {
			if err = srv.Unmount(); err == nil || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("unmount: %v", err)
		}
		srv.Wait()
		if m := e.srv.Metrics(); m.Buffers != 0 || m.RegisteredBytes != 0 {
			t.Errorf("registrations left: %+v", m)
		}
		e.srv.Close()
	})
	return e
}

// waitSessions waits (up to 5 s) until the server has n sessions.
func (e *env) waitSessions(n int) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.srv.Sessions() != n {
		if time.Now().After(deadline) {
			e.t.Fatalf("%d ctl sessions open, want %d", e.srv.Sessions(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) path(k layout.Key) string { return filepath.Join(e.dir, e.geo.Name(k)) }

// groupData is deterministic content of a group for a seed.
func groupData(gb int, k layout.Key, seed uint64) []byte {
	b := make([]byte, gb)
	r := rand.New(rand.NewPCG(k.Block^seed, uint64(k.Layer)<<40|uint64(k.Head)<<8|uint64(k.Kind)))
	for i := 0; i < len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// cp writes a group through the mounted file tree, as cp would.
func (e *env) cp(k layout.Key, data []byte) {
	e.t.Helper()
	p := e.path(k)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		e.t.Fatalf("write %s: %v", p, err)
	}
}

// cat reads a group through the mounted file tree.
func (e *env) cat(k layout.Key) []byte {
	e.t.Helper()
	b, err := os.ReadFile(e.path(k))
	if err != nil {
		e.t.Fatalf("read %s: %v", e.path(k), err)
	}
	return b
}

// put stores groups through the store directly (fast, for big fills).
func (e *env) put(keys []layout.Key, seed uint64) {
	e.t.Helper()
	reqs := make([]store.WriteReq, len(keys))
	for i, k := range keys {
		reqs[i] = store.WriteReq{Key: k, Data: groupData(e.gb, k, seed)}
	}
	if err := e.st.Write(reqs); err != nil {
		e.t.Fatal(err)
	}
	for _, r := range reqs {
		if r.Err != nil {
			e.t.Fatal(r.Err)
		}
	}
}

// corrupt flips a byte of a stored group on the in-memory device.
func (e *env) corrupt(k layout.Key) {
	e.t.Helper()
	gi, err := e.st.Stat(k)
	if err != nil {
		e.t.Fatal(err)
	}
	sb := e.st.Superblock()
	off := sb.DataOffset + gi.Slot*sb.SlotBytes + 2*sb.HeaderBytes + e.geo.Offset(e.geo.Index(k))
	img := e.mem.Image()
	e.mem.Poke(off+100, []byte{img[off+100] ^ 0x5a})
}

func blockKeys(geo layout.Geometry, block uint64) []layout.Key {
	keys := make([]layout.Key, geo.GroupsPerBlock())
	for i := range keys {
		keys[i] = geo.KeyAt(block, i)
	}
	return keys
}

const guardByte = ctltest.GuardByte

// shmFile is a /dev/shm file of n usable bytes followed by guard bytes,
// mapped by the test.
type shmFile struct {
	path  string
	mem   []byte
	n     int
	guard int
}

func newShm(t testing.TB, n, guard int) *shmFile {
	t.Helper()
	path, mem := ctltest.NewShm(t, "kvfs-it", n, guard)
	return &shmFile{path: path, mem: mem, n: n, guard: guard}
}

func (s *shmFile) checkGuard(t testing.TB) {
	t.Helper()
	ctltest.CheckGuard(t, s.mem, s.n)
}

// fileStore formats a store of testGeo with 8 slots in a file of the
// test's temporary directory and opens it with the engine kind, closed when
// the test ends; the test is skipped where that engine cannot open here.
func fileStore(t testing.TB, kind string) *store.Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.kvfs")
	if err := store.PrepareFile(path, store.SizeFor(testGeo, 8)); err != nil {
		t.Fatal(err)
	}
	eng, err := engine.Open(path, engine.Options{Kind: kind})
	if err != nil {
		t.Skipf("skipping: no %s engine here: %v", kind, err)
	}
	if _, err := store.Format(eng, testGeo, store.FormatOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	eng.Close()
	st, closeAll, err := engine.OpenStore(path, engine.Options{Kind: kind}, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll() })
	return st
}
