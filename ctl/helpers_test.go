package ctl

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/ctl/ctltest"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/tier"
)

// testGeo: 2 layers × 4 heads × 2 = 16 groups of 16 rows × 32 bytes = 512 bytes.
var testGeo = layout.Geometry{Layers: 2, KVHeads: 4, HeadDim: 16, BlockTokens: 16, DType: layout.BF16, Align: 512}

type fixture struct {
	t   testing.TB
	srv *Server
	st  *store.Store
	mem *storetest.Mem
	gb  int
}

func newFixture(t testing.TB, slots int, o Options) *fixture {
	t.Helper()
	return newFixtureTier(t, slots, o, 0)
}

// newFixtureTier is newFixture with a DRAM tier of tierBlocks blocks in
// front of the store (none for 0), in o.Tier.
func newFixtureTier(t testing.TB, slots int, o Options, tierBlocks int) *fixture {
	t.Helper()
	m := storetest.Formatted(t, testGeo, int64(slots), 512)
	st := storetest.Open(t, m, store.Options{})
	if tierBlocks > 0 {
		tr, err := tier.New(st, tier.Options{Bytes: int64(tierBlocks) * testGeo.PayloadBytes()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() }) // after the server's cleanup below
		o.Tier = tr
	}
	srv := NewServer(st, o)
	t.Cleanup(func() {
		if n := srv.Sessions(); n != 0 {
			t.Errorf("%d sessions left open", n)
		}
		if m := srv.Metrics(); m.Buffers != 0 || m.RegisteredBytes != 0 {
			t.Errorf("registrations left: %+v", m)
		}
		srv.Close()
		if err := st.CheckInvariants(); err != nil {
			t.Error(err)
		}
		st.Close()
	})
	return &fixture{t: t, srv: srv, st: st, mem: m, gb: testGeo.GroupBytes()}
}

func (f *fixture) open(uid, gid uint32) *Session {
	f.t.Helper()
	ss, errno := f.srv.Open(uid, gid)
	if errno != 0 {
		f.t.Fatalf("open: %v", errno)
	}
	f.t.Cleanup(ss.Release)
	return ss
}

// groupData is deterministic content for a key and a version.
func groupData(k layout.Key, version int) []byte {
	b := make([]byte, testGeo.GroupBytes())
	r := rand.New(rand.NewPCG(k.Block, uint64(testGeo.Index(k))<<32|uint64(version)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func (f *fixture) put(keys []layout.Key, version int) {
	f.t.Helper()
	reqs := make([]store.WriteReq, len(keys))
	for i, k := range keys {
		reqs[i] = store.WriteReq{Key: k, Data: groupData(k, version)}
	}
	if err := f.st.Write(reqs); err != nil {
		f.t.Fatal(err)
	}
	for _, r := range reqs {
		if r.Err != nil {
			f.t.Fatal(r.Err)
		}
	}
}

// corrupt flips a byte of a stored group's payload on the device.
func (f *fixture) corrupt(k layout.Key) {
	f.t.Helper()
	gi, err := f.st.Stat(k)
	if err != nil {
		f.t.Fatal(err)
	}
	sb := f.st.Superblock()
	off := sb.DataOffset + gi.Slot*sb.SlotBytes + 2*sb.HeaderBytes + testGeo.Offset(testGeo.Index(k))
	img := f.mem.Image()
	f.mem.Poke(off+7, []byte{img[off+7] ^ 0xff})
}

// get reads group k from the store, failing the test unless it reads.
func (f *fixture) get(k layout.Key) []byte {
	f.t.Helper()
	buf := make([]byte, f.gb)
	rr := []store.ReadReq{{Key: k, Buf: buf}}
	if err := f.st.Read(rr); err != nil || rr[0].Err != nil {
		f.t.Fatal(err, rr[0].Err)
	}
	return buf
}

func blockKeys(block uint64) []layout.Key {
	keys := make([]layout.Key, testGeo.GroupsPerBlock())
	for i := range keys {
		keys[i] = testGeo.KeyAt(block, i)
	}
	return keys
}

const guardByte = ctltest.GuardByte

// shm is a file in /dev/shm mapped by the test (the client's view). The
// registered part is its first n bytes; the guard bytes after it must never
// change.
type shm struct {
	path  string
	mem   []byte // whole file
	n     int    // registered length
	guard int
}

func needShm(t testing.TB) {
	var fs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Skip("needs /dev/shm on tmpfs")
	}
}

func newShm(t testing.TB, n, guard int) *shm {
	t.Helper()
	needShm(t)
	path, mem := ctltest.NewShm(t, "kvfs-ctl-test", n, guard)
	return &shm{path: path, mem: mem, n: n, guard: guard}
}

func (s *shm) checkGuard(t testing.TB) {
	t.Helper()
	ctltest.CheckGuard(t, s.mem, s.n)
}

// register registers path as the calling thread (the test process). The
// goroutine stays on its thread meanwhile, as a FUSE client's thread waits
// in the kernel: otherwise the thread could be taken over by the server's
// credential-carrying goroutine, which ends it.
func register(t testing.TB, ss *Session, path string, length uint64) (uint32, syscall.Errno) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return registerFrom(t, ss, uint32(unix.Gettid()), path, length)
}

// registerFrom registers path as if thread tid had issued the ioctl.
func registerFrom(t testing.TB, ss *Session, tid uint32, path string, length uint64) (uint32, syscall.Errno) {
	t.Helper()
	var r abi.RegisterHost
	r.ABI, r.Length = abi.Version, length
	if !r.SetPath(path) {
		t.Fatalf("path too long")
	}
	in := make([]byte, abi.RegisterHostSize)
	r.Marshal(in)
	out := make([]byte, abi.RegisterHostSize)
	if _, errno := ss.IoctlFrom(tid, abi.CmdRegisterHost, in, out); errno != 0 {
		return 0, errno
	}
	var got abi.RegisterHost
	got.Unmarshal(out)
	if got.Buffer == 0 {
		t.Fatalf("buffer id 0")
	}
	if !bytes.Equal(got.Path[:], r.Path[:]) {
		t.Fatalf("path not echoed")
	}
	return got.Buffer, 0
}

func mustRegister(t testing.TB, ss *Session, s *shm) uint32 {
	t.Helper()
	id, errno := register(t, ss, s.path, uint64(s.n))
	if errno != 0 {
		t.Fatalf("register %s: %v", s.path, errno)
	}
	return id
}

func unregister(ss *Session, id uint32) syscall.Errno {
	in := make([]byte, abi.UnregisterSize)
	u := abi.Unregister{ABI: abi.Version, Buffer: id}
	u.Marshal(in)
	_, errno := ss.Ioctl(abi.CmdUnregister, in, nil)
	return errno
}

func entry(k layout.Key, buf uint32, off uint64, pitch uint32) abi.Entry {
	return abi.Entry{Block: k.Block, Layer: uint16(k.Layer), Head: uint16(k.Head), Kind: uint8(k.Kind), Buffer: buf, Offset: off, Pitch: pitch}
}

// encodeBatch builds the argument of a LOAD or STORE; small picks the
// 63-entry command.
func encodeBatch(load, small bool, es []abi.Entry) (uint32, []byte) {
	cmd, size := abi.CmdLoad, abi.BatchSize
	switch {
	case load && small:
		cmd, size = abi.CmdLoadSmall, abi.BatchSmallSz
	case !load && small:
		cmd, size = abi.CmdStoreSmall, abi.BatchSmallSz
	case !load:
		cmd = abi.CmdStore
	}
	in := make([]byte, size)
	h := abi.BatchHeader{ABI: abi.Version, Count: uint32(len(es))}
	h.Marshal(in)
	for i := range es {
		es[i].Marshal(in[abi.BatchHeaderSize+i*abi.EntrySize:])
	}
	return cmd, in
}

// batch runs one LOAD (load) or STORE and returns the statuses.
func batch(t testing.TB, ss *Session, load bool, es []abi.Entry) ([]abi.Entry, syscall.Errno) {
	t.Helper()
	cmd, in := encodeBatch(load, len(es) <= abi.BatchSmallMax && len(es)%2 == 1, es)
	out := make([]byte, len(in))
	for i := range out {
		out[i] = 0xEE // the server must fill all of out
	}
	res, errno := ss.Ioctl(cmd, in, out)
	if errno != 0 {
		return nil, errno
	}
	var h abi.BatchHeader
	h.Unmarshal(out)
	got := make([]abi.Entry, len(es))
	nok := 0
	for i := range got {
		got[i].Unmarshal(out[abi.BatchHeaderSize+i*abi.EntrySize:])
		if got[i].Status == abi.OK {
			nok++
		}
		w := es[i]
		w.Status, w.Detail = got[i].Status, got[i].Detail
		if w != got[i] {
			t.Fatalf("entry %d: input fields changed: %+v → %+v", i, es[i], got[i])
		}
	}
	if int(h.NOK) != nok || int(res) != nok {
		t.Fatalf("n_ok %d, result %d, counted %d", h.NOK, res, nok)
	}
	if !bytes.Equal(out[abi.BatchHeaderSize+len(es)*abi.EntrySize:], in[abi.BatchHeaderSize+len(es)*abi.EntrySize:]) {
		t.Fatalf("bytes after the used entries are not echoed")
	}
	return got, 0
}

func mustBatch(t testing.TB, ss *Session, load bool, es []abi.Entry) []abi.Entry {
	t.Helper()
	got, errno := batch(t, ss, load, es)
	if errno != 0 {
		t.Fatalf("batch: %v", errno)
	}
	return got
}

// callerProc starts a process (sleep) running as uid:gid with the given
// supplementary groups and returns its pid, for tests that need the
// credentials of another user on an ioctl's caller. Needs root.
func callerProc(t testing.TB, uid, gid uint32, groups ...uint32) uint32 {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run processes as other users")
	}
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// Wait until the child runs as the user (exec done).
	for range 500 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
		if err == nil && bytes.Contains(b, []byte(fmt.Sprintf("\nUid:\t%d\t", uid))) && bytes.Contains(b, []byte("Name:\tsleep")) {
			return uint32(cmd.Process.Pid)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("caller process did not start as %d", uid)
	return 0
}
