package ctl

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

func TestInfo(t *testing.T) {
	f := newFixture(t, 4, Options{MaxBuffers: 7})
	ss := f.open(0, 0)
	out := make([]byte, abi.InfoSize)
	if _, errno := ss.Ioctl(abi.CmdInfo, nil, out); errno != 0 {
		t.Fatal(errno)
	}
	var i abi.Info
	i.Unmarshal(out)
	want := abi.Info{
		ABI: 1, Size: abi.InfoSize, Caps: abi.CapHost | abi.CapPitch | abi.CapStore | abi.CapRegisterFD | abi.CapLimits | abi.CapBlocks | abi.CapPrefix,
		ABIMinor: abi.Minor, MaxBlockEntries: abi.BlocksMax,
		Layers: 2, KVHeads: 4, HeadDim: 16, BlockTokens: 16, DType: uint32(layout.BF16), DTypeBytes: 2,
		Align: 512, GroupBytes: 512, GroupStride: 512, GroupsPerBlock: 16, RowBytes: 32,
		MaxEntries: 511, MaxEntriesSmall: 63, MaxBuffers: 7, MaxRegisteredBytes: 1 << 40,
		Slots: uint64(f.st.Info().Slots), UUID: f.st.Superblock().UUID,
	}
	copy(want.Engine[:], "mem")
	if i != want {
		t.Fatalf("info\n got %+v\nwant %+v", i, want)
	}
	if i.EngineName() != "mem" {
		t.Fatalf("engine %q", i.EngineName())
	}
}

func TestRoundTrip(t *testing.T) {
	f := newFixture(t, 8, Options{})
	ss := f.open(0, 0)
	blocks := []uint64{0x10, 0x20, 0x30}
	n := len(blocks) * testGeo.GroupsPerBlock()
	s := newShm(t, n*f.gb, 4096)
	id := mustRegister(t, ss, s)

	// STORE every group from the buffer, then LOAD them back elsewhere.
	var es []abi.Entry
	for bi, b := range blocks {
		for _, k := range blockKeys(b) {
			off := (bi*testGeo.GroupsPerBlock() + testGeo.Index(k)) * f.gb
			copy(s.mem[off:], groupData(k, 1))
			es = append(es, entry(k, id, uint64(off), 0))
		}
	}
	for _, e := range mustBatch(t, ss, false, es) {
		if e.Status != abi.OK {
			t.Fatalf("store: %+v", e)
		}
	}
	for _, k := range blockKeys(0x20) {
		got := make([]byte, f.gb)
		if err := readGroup(f, k, got); err != nil || !bytes.Equal(got, groupData(k, 1)) {
			t.Fatalf("%v: store holds other bytes (%v)", k, err)
		}
	}
	clear(s.mem[:s.n])
	for _, e := range mustBatch(t, ss, true, es) {
		if e.Status != abi.OK {
			t.Fatalf("load: %+v", e)
		}
	}
	for _, e := range es {
		k := layout.Key{Block: e.Block, Layer: int(e.Layer), Head: int(e.Head), Kind: layout.Kind(e.Kind)}
		if !bytes.Equal(s.mem[e.Offset:e.Offset+uint64(f.gb)], groupData(k, 1)) {
			t.Fatalf("%v: loaded bytes differ", k)
		}
	}
	s.checkGuard(t)
	if m := f.srv.Metrics(); m.GroupsLoaded != uint64(n) || m.GroupsStored != uint64(n) {
		t.Fatalf("metrics %+v", m)
	}
}

func readGroup(f *fixture, k layout.Key, buf []byte) error {
	reqs := []store.ReadReq{{Key: k, Buf: buf}}
	if err := f.st.Read(reqs); err != nil {
		return err
	}
	return reqs[0].Err
}

func TestPitch(t *testing.T) {
	f := newFixture(t, 4, Options{})
	ss := f.open(0, 0)
	keys := blockKeys(0x77)[:6]
	f.put(keys, 3)
	// A token-major paged layout: row r of head h of tile i at
	// (i*rows + r)*pitch + h*rowBytes, pitch = 4 heads × 32 bytes + 16 bytes
	// of padding; the gaps must stay untouched.
	const rowBytes, rows = 32, 16
	pitch := 4*rowBytes + 16
	size := len(keys) * rows * pitch
	s := newShm(t, size, 4096)
	for i := range s.mem[:size] {
		s.mem[i] = 0x5A
	}
	id := mustRegister(t, ss, s)
	var es []abi.Entry
	for i, k := range keys {
		es = append(es, entry(k, id, uint64(i*rows*pitch+(i%4)*rowBytes), uint32(pitch)))
	}
	for _, e := range mustBatch(t, ss, true, es) {
		if e.Status != abi.OK {
			t.Fatalf("load: %+v", e)
		}
	}
	want := bytes.Repeat([]byte{0x5A}, size)
	for i, k := range keys {
		d := groupData(k, 3)
		for r := range rows {
			copy(want[int(es[i].Offset)+r*pitch:], d[r*rowBytes:(r+1)*rowBytes])
		}
	}
	if !bytes.Equal(s.mem[:size], want) {
		t.Fatal("pitched load placed bytes wrongly")
	}
	s.checkGuard(t)

	// STORE gathers with the same pitch: store the tiles under another
	// block and read them back packed.
	for i := range es {
		es[i].Block = 0x78
	}
	for _, e := range mustBatch(t, ss, false, es) {
		if e.Status != abi.OK {
			t.Fatalf("store: %+v", e)
		}
	}
	for _, k := range keys {
		got := make([]byte, f.gb)
		k2 := k
		k2.Block = 0x78
		if err := readGroup(f, k2, got); err != nil || !bytes.Equal(got, groupData(k, 3)) {
			t.Fatalf("%v: pitched store wrote other bytes (%v)", k2, err)
		}
	}
}

func TestAbsentAndCorrupt(t *testing.T) {
	f := newFixture(t, 4, Options{})
	ss := f.open(0, 0)
	keys := blockKeys(0x5)
	f.put(keys[:10], 1)
	f.corrupt(keys[3])
	s := newShm(t, len(keys)*f.gb*2, 4096)
	for i := range s.mem[:s.n] {
		s.mem[i] = 0x11
	}
	id := mustRegister(t, ss, s)
	var es []abi.Entry
	for i, k := range keys {
		es = append(es, entry(k, id, uint64(i*f.gb), 0))
	}
	// One pitched corrupt tile too.
	es = append(es, entry(keys[3], id, uint64(len(keys)*f.gb), 64))
	got := mustBatch(t, ss, true, es)
	for i, e := range got {
		want := abi.OK
		switch {
		case i == 3 || i == len(keys):
			want = abi.Corrupt
		case i >= 10 && i < len(keys):
			want = abi.Absent
		}
		if e.Status != want {
			t.Fatalf("entry %d: status %v, want %v", i, e.Status, want)
		}
		if i >= len(keys) {
			continue
		}
		tile := s.mem[i*f.gb : (i+1)*f.gb]
		switch want {
		case abi.OK:
			if !bytes.Equal(tile, groupData(keys[i], 1)) {
				t.Fatalf("entry %d: wrong bytes", i)
			}
		case abi.Corrupt:
			if !bytes.Equal(tile, make([]byte, f.gb)) {
				t.Fatalf("corrupt tile not zeroed")
			}
		case abi.Absent:
			if !bytes.Equal(tile, bytes.Repeat([]byte{0x11}, f.gb)) {
				t.Fatalf("absent tile touched")
			}
		}
	}
	base := len(keys) * f.gb
	for r := range 16 {
		row := s.mem[base+r*64 : base+r*64+64]
		if !bytes.Equal(row[:32], make([]byte, 32)) || !bytes.Equal(row[32:], bytes.Repeat([]byte{0x11}, 32)) {
			t.Fatalf("pitched corrupt tile: row %d is %x", r, row)
		}
	}
	s.checkGuard(t)
}

// TestHostile sends entries and requests that must be refused, and checks
// that nothing outside the tiles of valid entries changed.
func TestHostile(t *testing.T) {
	f := newFixture(t, 4, Options{})
	a := f.open(0, 0)
	b := f.open(0, 0)
	keys := blockKeys(0x9)
	f.put(keys, 1)
	sa := newShm(t, 8*f.gb, 8192)
	sb := newShm(t, 8*f.gb, 8192)
	ida := mustRegister(t, a, sa)
	idb := mustRegister(t, b, sb)
	k := keys[0]
	n := uint64(sa.n)
	cases := []struct {
		name string
		e    abi.Entry
		det  abi.Detail
	}{
		{"unknown buffer", entry(k, 0xdead, 0, 0), abi.BadBuffer},
		{"buffer zero", entry(k, 0, 0, 0), abi.BadBuffer},
		{"another handle's buffer", entry(k, idb, 0, 0), abi.BadBuffer},
		{"offset at end", entry(k, ida, n, 0), abi.BadRange},
		{"tile past end", entry(k, ida, n-uint64(f.gb)+1, 0), abi.BadRange},
		{"offset overflow", entry(k, ida, math.MaxUint64, 0), abi.BadRange},
		{"offset wraps", entry(k, ida, math.MaxUint64-uint64(f.gb)+2, 0), abi.BadRange},
		{"pitch overflow", entry(k, ida, 0, math.MaxUint32), abi.BadRange},
		{"pitch past end", entry(k, ida, 0, uint32(n/15)), abi.BadRange},
		{"pitch below row", entry(k, ida, 0, 31), abi.BadPitch},
		{"pitch one", entry(k, ida, 0, 1), abi.BadPitch},
		{"layer", entry(layout.Key{Block: 9, Layer: 2}, ida, 0, 0), abi.BadKey},
		{"head", entry(layout.Key{Block: 9, Head: 4}, ida, 0, 0), abi.BadKey},
		{"kind", entry(layout.Key{Block: 9, Kind: 2}, ida, 0, 0), abi.BadKey},
		{"reserved", func() abi.Entry { e := entry(k, ida, 0, 0); e.Reserved = 1; return e }(), abi.BadReserved},
	}
	for _, load := range []bool{true, false} {
		for i := range sa.mem[:sa.n] {
			sa.mem[i] = 0x33
		}
		var es []abi.Entry
		for _, c := range cases {
			es = append(es, c.e)
		}
		// One valid entry in the middle proceeds.
		es = append(es[:3], append([]abi.Entry{entry(keys[1], ida, uint64(2*f.gb), 0)}, es[3:]...)...)
		got := mustBatch(t, a, load, es)
		ci := 0
		for i, e := range got {
			if i == 3 {
				if e.Status != abi.OK {
					t.Fatalf("valid entry: %+v", e)
				}
				continue
			}
			c := cases[ci]
			ci++
			if e.Status != abi.BadRequest || e.Detail != c.det {
				t.Errorf("load=%v %s: status %v detail %v, want bad-request %v", load, c.name, e.Status, e.Detail, c.det)
			}
		}
		want := bytes.Repeat([]byte{0x33}, sa.n)
		if load {
			copy(want[2*f.gb:], groupData(keys[1], 1))
		}
		if !bytes.Equal(sa.mem[:sa.n], want) {
			t.Fatalf("load=%v: bytes outside the valid tile changed", load)
		}
		sa.checkGuard(t)
		sb.checkGuard(t)
	}
	if m := f.srv.Metrics(); m.BadEntries != 2*uint64(len(cases)) {
		t.Fatalf("bad entries %d", m.BadEntries)
	}
}

func TestRejectedRequests(t *testing.T) {
	f := newFixture(t, 4, Options{})
	ss := f.open(0, 0)
	s := newShm(t, 4096, 4096)
	id := mustRegister(t, ss, s)
	es := []abi.Entry{entry(layout.Key{Block: 1}, id, 0, 0)}
	good := func() (uint32, []byte) { return encodeBatch(true, false, es) }
	mod := func(fn func(in []byte)) (uint32, []byte) {
		cmd, in := good()
		fn(in)
		return cmd, in
	}
	cases := []struct {
		name  string
		cmd   uint32
		in    []byte
		out   int
		errno syscall.Errno
	}{
		{"unknown command", abi.CmdLoad + 0x20, make([]byte, abi.BatchSize), abi.BatchSize, syscall.ENOTTY},
		{"other magic", abi.CmdLoad&^0xff00 | 'f'<<8, make([]byte, abi.BatchSize), abi.BatchSize, syscall.ENOTTY},
		{"short in", abi.CmdLoad, make([]byte, 100), abi.BatchSize, syscall.EINVAL},
		{"short out", abi.CmdLoad, make([]byte, abi.BatchSize), 100, syscall.EINVAL},
		{"info with input", abi.CmdInfo, make([]byte, 8), abi.InfoSize, syscall.EINVAL},
		{"zero version", abi.CmdLoad, make([]byte, abi.BatchSize), abi.BatchSize, syscall.EPROTO},
		{"future version", 0, nil, abi.BatchSize, syscall.EPROTO},
		{"count", 0, nil, abi.BatchSize, syscall.EINVAL},
		{"flags", 0, nil, abi.BatchSize, syscall.EINVAL},
	}
	cases[6].cmd, cases[6].in = mod(func(in []byte) { in[0] = 2 })
	cases[7].cmd, cases[7].in = mod(func(in []byte) { in[4] = 0; in[5] = 2 }) // 512
	cases[8].cmd, cases[8].in = mod(func(in []byte) { in[8] = 1 })
	for _, c := range cases {
		s.mem[0] = 0x44
		_, errno := ss.Ioctl(c.cmd, c.in, make([]byte, c.out))
		if errno != c.errno {
			t.Errorf("%s: errno %v, want %v", c.name, errno, c.errno)
		}
		if s.mem[0] != 0x44 {
			t.Errorf("%s: buffer touched", c.name)
		}
	}
	// Small command with 64 entries.
	cmd, in := encodeBatch(true, true, nil)
	in[4] = 64
	if _, errno := ss.Ioctl(cmd, in, make([]byte, len(in))); errno != syscall.EINVAL {
		t.Fatalf("64 entries in a small batch: %v", errno)
	}
	// Register and unregister requests.
	reg := func(fn func(r *abi.RegisterHost)) syscall.Errno {
		r := abi.RegisterHost{ABI: abi.Version}
		r.SetPath(s.path)
		fn(&r)
		in := make([]byte, abi.RegisterHostSize)
		r.Marshal(in)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		_, errno := ss.IoctlFrom(uint32(unix.Gettid()), abi.CmdRegisterHost, in, make([]byte, abi.RegisterHostSize))
		return errno
	}
	for name, c := range map[string]struct {
		fn    func(r *abi.RegisterHost)
		errno syscall.Errno
	}{
		"version":    {func(r *abi.RegisterHost) { r.ABI = 9 }, syscall.EPROTO},
		"flags":      {func(r *abi.RegisterHost) { r.Flags = 1 }, syscall.EINVAL},
		"buffer set": {func(r *abi.RegisterHost) { r.Buffer = 1 }, syscall.EINVAL},
		"reserved":   {func(r *abi.RegisterHost) { r.Reserved1 = 1 }, syscall.EINVAL},
		"no NUL":     {func(r *abi.RegisterHost) { copy(r.Path[:], bytes.Repeat([]byte{'a'}, abi.PathMax)) }, syscall.EINVAL},
		"empty":      {func(r *abi.RegisterHost) { r.SetPath("") }, syscall.EINVAL},
		"relative":   {func(r *abi.RegisterHost) { r.SetPath("dev/shm/x") }, syscall.EINVAL},
		"length":     {func(r *abi.RegisterHost) { r.Length = 4096*2 + 1 }, syscall.ERANGE},
		// The documented order: policy, path, size, quota.
		"length max":          {func(r *abi.RegisterHost) { r.Length = math.MaxUint64 }, syscall.ERANGE},
		"length max, outside": {func(r *abi.RegisterHost) { r.Length = math.MaxUint64; r.SetPath("/etc/passwd") }, syscall.EPERM},
		"missing file":        {func(r *abi.RegisterHost) { r.SetPath(s.path + "-nope") }, syscall.ENOENT},
	} {
		if errno := reg(c.fn); errno != c.errno {
			t.Errorf("register %s: errno %v, want %v", name, errno, c.errno)
		}
	}
	if errno := unregister(ss, id+100); errno != syscall.ENOENT {
		t.Fatalf("unregister unknown: %v", errno)
	}
	in = make([]byte, abi.UnregisterSize)
	(&abi.Unregister{ABI: 3, Buffer: id}).Marshal(in)
	if _, errno := ss.Ioctl(abi.CmdUnregister, in, nil); errno != syscall.EPROTO {
		t.Fatalf("unregister version: %v", errno)
	}
	if errno := unregister(ss, id); errno != 0 {
		t.Fatal(errno)
	}
	if errno := unregister(ss, id); errno != syscall.ENOENT {
		t.Fatalf("second unregister: %v", errno)
	}
	if _, errno := batch(t, ss, true, es); errno != 0 {
		t.Fatal(errno)
	}
	if m := f.srv.Metrics(); m.Rejected == 0 {
		t.Fatal("no rejections counted")
	}
}

func TestRegisterPolicy(t *testing.T) {
	needShm(t)
	f := newFixture(t, 4, Options{})
	root := f.open(0, 0)
	dir := t.TempDir() // not in /dev/shm
	outside := filepath.Join(dir, "buf")
	if err := os.WriteFile(outside, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newShm(t, 4096, 0)
	link := s.path + "-link"
	if err := os.Symlink(s.path, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(link) })
	sub := s.path + "-dir"
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sub) })
	inSub := filepath.Join(sub, "buf")
	if err := os.WriteFile(inSub, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	dirLink := s.path + "-dirlink"
	if err := os.Symlink(sub, dirLink); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dirLink) })
	fifo := s.path + "-fifo"
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(fifo) })

	for _, c := range []struct {
		path  string
		errno syscall.Errno
	}{
		{s.path, 0},
		{inSub, 0},
		{outside, syscall.EPERM},
		{"/dev/shmx/buf", syscall.EPERM},
		{"/dev/shm", syscall.EPERM},
		{"/dev/shm/", syscall.EPERM},
		{"/dev/shm/../shm/" + filepath.Base(s.path), syscall.EPERM},
		{"/dev/shm//" + filepath.Base(s.path), syscall.EPERM},
		{"/dev/shm/./" + filepath.Base(s.path), syscall.EPERM},
		{link, syscall.ELOOP},
		{filepath.Join(dirLink, "buf"), syscall.ELOOP},
		{sub, syscall.EINVAL},
		{fifo, syscall.EINVAL},
		{filepath.Join(s.path, "x"), syscall.EINVAL}, // a file used as a directory
	} {
		id, errno := register(t, root, c.path, 0)
		if errno != c.errno {
			t.Errorf("register %s: errno %v, want %v", c.path, errno, c.errno)
		}
		if errno == 0 {
			if e := unregister(root, id); e != 0 {
				t.Fatal(e)
			}
		}
	}

	// Ownership, decided by the kernel with the calling thread's
	// credentials: the callers are processes running as other users.
	if err := os.Chown(s.path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	nobody := callerProc(t, 65534, 65534)
	other := callerProc(t, 1000, 1000)
	member := callerProc(t, 1000, 1000, 65534) // supplementary group 65534
	if _, errno := registerFrom(t, root, other, s.path, 0); errno != syscall.EACCES {
		t.Fatalf("uid 1000 registering nobody's file: %v", errno)
	}
	if _, errno := registerFrom(t, root, nobody, s.path, 0); errno != 0 {
		t.Fatalf("uid 65534 registering its file: %v", errno)
	}
	// Group and world bits; supplementary groups count.
	os.Chmod(s.path, 0o660)
	if _, errno := registerFrom(t, root, member, s.path, 0); errno != 0 {
		t.Fatalf("supplementary group member: %v", errno)
	}
	if _, errno := registerFrom(t, root, other, s.path, 0); errno != syscall.EACCES {
		t.Fatalf("non-member: %v", errno)
	}
	os.Chmod(s.path, 0o606) // group bits narrower than other bits: members are refused
	if _, errno := registerFrom(t, root, member, s.path, 0); errno != syscall.EACCES {
		t.Fatalf("member of a group with no access: %v", errno)
	}
	if _, errno := registerFrom(t, root, other, s.path, 0); errno != 0 {
		t.Fatalf("world-writable: %v", errno)
	}
	// An unsearchable directory on the way.
	os.Chown(inSub, 1000, 1000)
	os.Chmod(sub, 0o700)
	if _, errno := registerFrom(t, root, other, inSub, 0); errno != syscall.EACCES {
		t.Fatalf("unsearchable dir: %v", errno)
	}
	os.Chmod(sub, 0o711)
	if _, errno := registerFrom(t, root, other, inSub, 0); errno != 0 {
		t.Fatalf("searchable dir: %v", errno)
	}
	// No caller: refused.
	if _, errno := registerFrom(t, root, 0, s.path, 0); errno != syscall.ESRCH {
		t.Fatalf("no caller: %v", errno)
	}

	// A shm dir that is not tmpfs.
	f2 := newFixture(t, 2, Options{ShmDir: dir})
	if _, errno := register(t, f2.open(0, 0), outside, 0); errno != syscall.EXDEV {
		t.Fatalf("non-tmpfs shm dir: %v", errno)
	}
}

func TestLimits(t *testing.T) {
	f := newFixture(t, 4, Options{MaxBuffers: 2, MaxRegisteredBytes: 2*4096 + 1024, MaxSessions: 3})
	ss := f.open(0, 0)
	s := newShm(t, 2*4096, 0)
	id1, errno := register(t, ss, s.path, 4096)
	if errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := register(t, ss, s.path, 0); errno != syscall.EDQUOT {
		t.Fatalf("over the byte limit: %v", errno)
	}
	if _, errno := register(t, ss, s.path, 4096); errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := register(t, ss, s.path, 1); errno != syscall.EMFILE {
		t.Fatalf("over the buffer limit: %v", errno)
	}
	unregister(ss, id1)
	if _, errno := register(t, ss, s.path, 4096+1024); errno != 0 {
		t.Fatalf("after unregister: %v", errno)
	}
	f.open(0, 0)
	f.open(0, 0)
	if _, errno := f.srv.Open(0, 0); errno != syscall.ENFILE {
		t.Fatalf("fourth session: %v", errno)
	}
}

func TestRelease(t *testing.T) {
	f := newFixture(t, 4, Options{})
	ss, _ := f.srv.Open(0, 0)
	s := newShm(t, 4096, 0)
	id := mustRegister(t, ss, s)
	mustRegister(t, ss, s)
	if m := f.srv.Metrics(); m.Buffers != 2 || m.RegisteredBytes != 8192 || m.Sessions != 1 {
		t.Fatalf("metrics %+v", m)
	}
	ss.Release()
	ss.Release()
	if m := f.srv.Metrics(); m.Buffers != 0 || m.RegisteredBytes != 0 || m.Sessions != 0 {
		t.Fatalf("after release %+v", m)
	}
	if _, errno := batch(t, ss, true, []abi.Entry{entry(layout.Key{}, id, 0, 0)}); errno != syscall.EBADF {
		t.Fatalf("load after release: %v", errno)
	}
	if _, errno := register(t, ss, s.path, 0); errno != syscall.EBADF {
		t.Fatalf("register after release: %v", errno)
	}
}

// TestShrunkBuffer: a client that truncates its registered file makes the
// daemon's access fault; the ioctl fails with EFAULT and the daemon lives.
func TestShrunkBuffer(t *testing.T) {
	f := newFixture(t, 4, Options{})
	ss := f.open(0, 0)
	keys := blockKeys(0x3)
	f.put(keys, 1)
	s := newShm(t, 4*4096, 0)
	id := mustRegister(t, ss, s)
	if err := os.Truncate(s.path, 0); err != nil {
		t.Fatal(err)
	}
	es := []abi.Entry{entry(keys[0], id, 8192, 0), entry(keys[1], id, 8192+512, 64)}
	for _, load := range []bool{true, false} {
		if _, errno := batch(t, ss, load, es); errno != syscall.EFAULT {
			t.Fatalf("load=%v into a shrunk buffer: %v", load, errno)
		}
	}
	if m := f.srv.Metrics(); m.Faults != 2 {
		t.Fatalf("faults %d", m.Faults)
	}
	// The store is fine and the session still works with a good buffer.
	s2 := newShm(t, 4096, 0)
	id2 := mustRegister(t, ss, s2)
	got := mustBatch(t, ss, true, []abi.Entry{entry(keys[0], id2, 0, 0)})
	if got[0].Status != abi.OK || !bytes.Equal(s2.mem[:512], groupData(keys[0], 1)) {
		t.Fatalf("after fault: %+v", got[0])
	}
}

func TestReadOnly(t *testing.T) {
	f := newFixture(t, 4, Options{ReadOnly: true})
	ss := f.open(0, 0)
	s := newShm(t, 4096, 0)
	id := mustRegister(t, ss, s)
	if _, errno := batch(t, ss, false, []abi.Entry{entry(layout.Key{}, id, 0, 0)}); errno != syscall.EROFS {
		t.Fatalf("store on read-only: %v", errno)
	}
}

func TestStoreFull(t *testing.T) {
	f := newFixture(t, 1, Options{})
	ss := f.open(0, 0)
	s := newShm(t, 4096, 0)
	id := mustRegister(t, ss, s)
	// Two blocks in one batch, one slot: one of them cannot be placed.
	got := mustBatch(t, ss, false, []abi.Entry{entry(layout.Key{Block: 1}, id, 0, 0), entry(layout.Key{Block: 2}, id, 0, 0)})
	n := 0
	for _, e := range got {
		if e.Status == abi.NoSpace {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("statuses %v %v, want one no-space", got[0].Status, got[1].Status)
	}
}

// TestStaging: a batch whose staging exceeds the budget runs in windows.
func TestStaging(t *testing.T) {
	f := newFixture(t, 8, Options{MaxStagingBytes: 3 * 512})
	ss := f.open(0, 0)
	keys := append(blockKeys(1), blockKeys(2)...)
	s := newShm(t, len(keys)*64*16, 4096)
	id := mustRegister(t, ss, s)
	var es []abi.Entry
	for i, k := range keys {
		copy(s.mem[i*f.gb:], groupData(k, 2))
		es = append(es, entry(k, id, uint64(i*f.gb), 0))
	}
	for _, e := range mustBatch(t, ss, false, es) {
		if e.Status != abi.OK {
			t.Fatalf("store %+v", e)
		}
	}
	clear(s.mem[:s.n])
	for i := range es {
		es[i].Offset, es[i].Pitch = uint64(i*64*16), 64
	}
	for _, e := range mustBatch(t, ss, true, es) {
		if e.Status != abi.OK {
			t.Fatalf("load %+v", e)
		}
	}
	for i, k := range keys {
		d := groupData(k, 2)
		for r := range 16 {
			if !bytes.Equal(s.mem[i*1024+r*64:i*1024+r*64+32], d[r*32:(r+1)*32]) {
				t.Fatalf("group %d row %d", i, r)
			}
		}
	}
}

// TestConcurrent: sessions storing and loading their own blocks at once,
// with unregister/register churn on a third.
func TestConcurrent(t *testing.T) {
	f := newFixture(t, 64, Options{})
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	stop := time.Now().Add(500 * time.Millisecond)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss := f.open(uint32(w), 0)
			s := newShm(t, 2*16*f.gb, 0)
			if err := os.Chown(s.path, w, 0); err != nil {
				errs <- err
				return
			}
			id := mustRegister(t, ss, s)
			for round := 0; time.Now().Before(stop); round++ {
				block := uint64(w)<<32 | uint64(round%4)
				keys := blockKeys(block)
				var es []abi.Entry
				for i, k := range keys {
					copy(s.mem[i*f.gb:], groupData(k, round))
					es = append(es, entry(k, id, uint64(i*f.gb), 0))
				}
				for _, e := range mustBatch(t, ss, false, es) {
					if e.Status != abi.OK {
						errs <- errors.New("store failed: " + e.Status.String())
						return
					}
				}
				for i := range es {
					es[i].Offset += uint64(len(keys) * f.gb)
				}
				for _, e := range mustBatch(t, ss, true, es) {
					if e.Status != abi.OK {
						errs <- errors.New("load failed: " + e.Status.String())
						return
					}
				}
				for i, k := range keys {
					off := (len(keys) + i) * f.gb
					if !bytes.Equal(s.mem[off:off+f.gb], groupData(k, round)) {
						errs <- errors.New("loaded bytes differ")
						return
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		ss := f.open(0, 0)
		s := newShm(t, 4096, 0)
		for time.Now().Before(stop) {
			id := mustRegister(t, ss, s)
			if errno := unregister(ss, id); errno != 0 {
				errs <- errno
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// recEngine records where reads land.
type recEngine struct {
	*storetest.Mem
	mu   sync.Mutex
	bufs []uintptr
}

func (r *recEngine) Do(ios []store.IO) error {
	r.mu.Lock()
	for _, io := range ios {
		if io.Op == store.OpRead {
			r.bufs = append(r.bufs, uintptrOf(io.Buf))
		}
	}
	r.mu.Unlock()
	return r.Mem.Do(ios)
}

// TestDirectLanding: packed tiles in slot order are read by the engine
// straight into the registered mapping, in one I/O, with no bounce buffer.
func TestDirectLanding(t *testing.T) {
	needShm(t)
	m := &recEngine{Mem: storetest.Formatted(t, testGeo, 4, 512)}
	st := storetest.Open(t, m, store.Options{})
	srv := NewServer(st, Options{})
	defer srv.Close()
	ss, _ := srv.Open(0, 0)
	defer ss.Release()
	keys := blockKeys(7)
	reqs := make([]store.WriteReq, len(keys))
	for i, k := range keys {
		reqs[i] = store.WriteReq{Key: k, Data: groupData(k, 1)}
	}
	if err := st.Write(reqs); err != nil {
		t.Fatal(err)
	}
	s := newShm(t, (len(keys)+1)*512, 0)
	id := mustRegister(t, ss, s)
	var es []abi.Entry
	for i, k := range keys {
		es = append(es, entry(k, id, uint64(512+i*512), 0))
	}
	m.bufs = nil
	for _, e := range mustBatch(t, ss, true, es) {
		if e.Status != abi.OK {
			t.Fatalf("%+v", e)
		}
	}
	ss.mu.Lock()
	base := uintptrOf(ss.mu.bufs[id].mem)
	ss.mu.Unlock()
	if len(m.bufs) != 1 || m.bufs[0] != base+512 {
		t.Fatalf("reads landed at %#x, want one read at %#x (the mapping + 512)", m.bufs, base+512)
	}
	for i, k := range keys {
		if !bytes.Equal(s.mem[512+i*512:1024+i*512], groupData(k, 1)) {
			t.Fatalf("%v differs", k)
		}
	}
}

// TestBufferLimit: a session registers at most MaxBuffers buffers (the
// next is EMFILE and changes nothing), an unregistration makes room again,
// and the default leaves room for a target's every region.
func TestBufferLimit(t *testing.T) {
	f := newFixture(t, 4, Options{MaxBuffers: 3})
	ss := f.open(0, 0)
	s := newShm(t, 4096, 0)
	var ids []uint32
	for range 3 {
		ids = append(ids, mustRegister(t, ss, s))
	}
	if _, errno := register(t, ss, s.path, 4096); errno != syscall.EMFILE {
		t.Fatalf("fourth registration: %v, want EMFILE", errno)
	}
	if errno := unregister(ss, ids[0]); errno != 0 {
		t.Fatal(errno)
	}
	mustRegister(t, ss, s)
	if d := newFixture(t, 4, Options{}).srv.opts.MaxBuffers; d < abi.TargetMaxRegions {
		t.Fatalf("default MaxBuffers %d is below the regions a target may name (%d)", d, abi.TargetMaxRegions)
	}
}
