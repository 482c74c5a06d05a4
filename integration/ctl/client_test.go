package ctl

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/layout"
)

func openClient(t testing.TB, e *env) *client.Client {
	t.Helper()
	c, err := client.Open(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestGoClientInfo(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 16})
	c := openClient(t, e)
	i := c.Info()
	if i.Geometry != testGeo || i.GroupBytes != 4096 || i.RowBytes != 256 || i.GroupsPerBlock != 16 ||
		i.MaxEntries != 511 || i.MaxEntriesSmall != 63 || i.Slots != 16 || i.Engine != "mem" ||
		!i.Has(abi.CapHost) || !i.Has(abi.CapStore) || !i.Has(abi.CapPitch) || i.Has(abi.CapCUDA) {
		t.Fatalf("info %+v", i)
	}
	if e.srv.Sessions() != 1 {
		t.Fatalf("%d sessions", e.srv.Sessions())
	}
}

// TestGoClientRoundTrip: groups written with cp through the file tree load
// through the ioctl path with the same bytes (one call, and more than
// MaxEntries split over several); groups stored through the ioctl path read
// back through the files.
func TestGoClientRoundTrip(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 64})
	c := openClient(t, e)
	// 3 blocks through the files, 37 more through the store: 640 groups.
	var keys []layout.Key
	for b := range uint64(40) {
		bk := blockKeys(e.geo, 0xb000+b)
		if b < 3 {
			for _, k := range bk {
				e.cp(k, groupData(e.gb, k, 1))
			}
		} else {
			e.put(bk, 1)
		}
		keys = append(keys, bk...)
	}
	s := newShm(t, len(keys)*e.gb, 8192)
	id, err := c.RegisterHost(s.path, int64(s.n))
	if err != nil {
		t.Fatal(err)
	}
	// Shuffled destinations: no coalescing into the caller's memory.
	perm := rand.Perm(len(keys))
	for _, n := range []int{16, 48, len(keys)} {
		clear(s.mem[:s.n])
		es := make([]client.Entry, n)
		for i := range es {
			es[i] = client.Entry{Key: keys[i], Buffer: id, Offset: uint64(perm[i] * e.gb)}
		}
		st, err := c.Load(es)
		if err != nil {
			t.Fatal(err)
		}
		for i, x := range st {
			if x != client.OK {
				t.Fatalf("n=%d entry %d: %v", n, i, x)
			}
			if got := s.mem[perm[i]*e.gb : (perm[i]+1)*e.gb]; !bytes.Equal(got, groupData(e.gb, keys[i], 1)) {
				t.Fatalf("n=%d %v: loaded bytes differ", n, keys[i])
			}
		}
		s.checkGuard(t)
	}
	// In slot order into contiguous memory: the store lands runs directly.
	clear(s.mem[:s.n])
	es := make([]client.Entry, len(keys))
	for i := range es {
		es[i] = client.Entry{Key: keys[i], Buffer: id, Offset: uint64(i * e.gb)}
	}
	if st, err := c.Load(es); err != nil || !allOK(st) {
		t.Fatalf("load: %v %v", err, st)
	}
	for i, k := range keys {
		if !bytes.Equal(s.mem[i*e.gb:(i+1)*e.gb], groupData(e.gb, k, 1)) {
			t.Fatalf("%v: loaded bytes differ", k)
		}
	}

	// STORE new blocks from the buffer; read them back with cat.
	var skeys []layout.Key
	for b := range uint64(2) {
		skeys = append(skeys, blockKeys(e.geo, 0x5700+b)...)
	}
	ses := make([]client.Entry, len(skeys))
	for i, k := range skeys {
		copy(s.mem[i*e.gb:], groupData(e.gb, k, 9))
		ses[i] = client.Entry{Key: k, Buffer: id, Offset: uint64(i * e.gb)}
	}
	if st, err := c.Store(ses); err != nil || !allOK(st) {
		t.Fatalf("store: %v %v", err, st)
	}
	for _, k := range skeys {
		if !bytes.Equal(e.cat(k), groupData(e.gb, k, 9)) {
			t.Fatalf("%v: file holds other bytes than stored", k)
		}
	}
	if err := c.Unregister(id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Load(es[:1]); err != nil {
		t.Fatal(err)
	} else if st, _ := c.Load(es[:1]); st[0] != client.BadRequest {
		t.Fatalf("load into an unregistered buffer: %v", st[0])
	}
}

func allOK(st []client.Status) bool {
	for _, s := range st {
		if s != client.OK {
			return false
		}
	}
	return true
}

// TestPitchPlacement loads tiles into a token-major paged layout
// [block][token][head][head_dim] (one layer's K), the way an engine's KV
// cache is laid out, and checks every row and that padding stays untouched.
func TestPitchPlacement(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 16})
	c := openClient(t, e)
	i := c.Info()
	const pages = 4
	heads, rows, rowBytes := i.Geometry.KVHeads, i.Geometry.BlockTokens, i.RowBytes
	pitch := heads*rowBytes + 64 // 64 bytes of padding per token
	size := pages * rows * pitch
	buf, err := c.NewHostBuffer("", int64(size))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	for j := range buf.Mem {
		buf.Mem[j] = 0xCC
	}
	var es []client.Entry
	want := bytes.Repeat([]byte{0xCC}, size)
	for p := range pages {
		block := 0x900 + uint64(p)
		for h := range heads {
			k := layout.Key{Block: block, Layer: 2, Head: h, Kind: layout.V}
			d := groupData(e.gb, k, 4)
			e.cp(k, d)
			off := p*rows*pitch + h*rowBytes
			es = append(es, client.Entry{Key: k, Buffer: buf.ID, Offset: uint64(off), Pitch: uint32(pitch)})
			for r := range rows {
				copy(want[off+r*pitch:], d[r*rowBytes:(r+1)*rowBytes])
			}
		}
	}
	if st, err := c.Load(es); err != nil || !allOK(st) {
		t.Fatalf("load: %v %v", err, st)
	}
	if !bytes.Equal(buf.Mem, want) {
		t.Fatal("pitched tiles not where the layout puts them")
	}
	// And back: store the paged layout under other blocks, read with cat.
	for j := range es {
		es[j].Key.Block += 0x100
	}
	if st, err := c.Store(es); err != nil || !allOK(st) {
		t.Fatalf("store: %v %v", err, st)
	}
	for _, en := range es {
		k := en.Key
		k.Block -= 0x100
		if !bytes.Equal(e.cat(en.Key), groupData(e.gb, k, 4)) {
			t.Fatalf("%v: pitched store wrote other bytes", en.Key)
		}
	}
}

// TestAbsentAndCorrupt: missing and damaged groups are reported per entry
// while the rest of the batch loads.
func TestAbsentAndCorrupt(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 16})
	c := openClient(t, e)
	keys := blockKeys(e.geo, 0xabc)
	e.put(keys[:12], 2)
	e.corrupt(keys[5])
	e.corrupt(keys[9])
	s := newShm(t, len(keys)*e.gb, 4096)
	for j := range s.mem[:s.n] {
		s.mem[j] = 0x77
	}
	id, err := c.RegisterHost(s.path, int64(s.n))
	if err != nil {
		t.Fatal(err)
	}
	es := make([]client.Entry, len(keys))
	for j, k := range keys {
		es[j] = client.Entry{Key: k, Buffer: id, Offset: uint64(j * e.gb)}
	}
	st := make([]client.Status, len(es))
	det := make([]client.Detail, len(es))
	nok, err := c.Batch(true, es, st, det)
	if err != nil {
		t.Fatal(err)
	}
	if nok != 10 {
		t.Fatalf("%d ok, want 10: %v", nok, st)
	}
	for j, k := range keys {
		tile := s.mem[j*e.gb : (j+1)*e.gb]
		switch {
		case j == 5 || j == 9:
			if st[j] != client.Corrupt || !bytes.Equal(tile, make([]byte, e.gb)) {
				t.Fatalf("entry %d: %v, tile zeroed %v", j, st[j], bytes.Equal(tile, make([]byte, e.gb)))
			}
		case j >= 12:
			if st[j] != client.Absent || !bytes.Equal(tile, bytes.Repeat([]byte{0x77}, e.gb)) {
				t.Fatalf("entry %d: %v (or tile touched)", j, st[j])
			}
		default:
			if st[j] != client.OK || !bytes.Equal(tile, groupData(e.gb, k, 2)) {
				t.Fatalf("entry %d: %v", j, st[j])
			}
		}
	}
	s.checkGuard(t)
	// Reading the corrupt group through the file fails too (EIO), the
	// others read fine.
	if _, err := os.ReadFile(e.path(keys[5])); err == nil {
		t.Fatal("corrupt group readable through the file")
	}
}

// TestHostile: malformed and malicious requests through the kernel are
// rejected, and no byte outside the valid tiles changes.
func TestHostile(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 16})
	a := openClient(t, e)
	b := openClient(t, e)
	keys := blockKeys(e.geo, 0x1)
	e.put(keys, 3)
	sa := newShm(t, 8*e.gb, 3*4096)
	sb := newShm(t, 8*e.gb, 4096)
	ida, err := a.RegisterHost(sa.path, int64(sa.n))
	if err != nil {
		t.Fatal(err)
	}
	idb, err := b.RegisterHost(sb.path, int64(sb.n))
	if err != nil {
		t.Fatal(err)
	}
	for j := range sa.mem[:sa.n] {
		sa.mem[j] = 0x33
	}
	before := append([]byte(nil), sa.mem...)
	n := uint64(sa.n)
	k := keys[0]
	bad := []client.Entry{
		{Key: k, Buffer: idb, Offset: 0},                     // another handle's buffer
		{Key: k, Buffer: 0x7fffffff, Offset: 0},              // unknown
		{Key: k, Buffer: ida, Offset: n},                     // at the end
		{Key: k, Buffer: ida, Offset: n - 4095},              // runs past the end
		{Key: k, Buffer: ida, Offset: math.MaxUint64 - 4000}, // wraps
		{Key: k, Buffer: ida, Offset: 0, Pitch: math.MaxUint32},
		{Key: k, Buffer: ida, Offset: 0, Pitch: uint32(n / 15)}, // last row past the end
		{Key: k, Buffer: ida, Offset: 0, Pitch: 255},            // rows overlap
		{Key: layout.Key{Block: 1, Layer: 4}, Buffer: ida},
		{Key: layout.Key{Block: 1, Head: 2}, Buffer: ida},
		{Key: layout.Key{Block: 1, Layer: -1}, Buffer: ida},
	}
	wantDet := []client.Detail{abi.BadBuffer, abi.BadBuffer, abi.BadRange, abi.BadRange, abi.BadRange, abi.BadRange,
		abi.BadRange, abi.BadPitch, abi.BadKey, abi.BadKey, abi.BadKey}
	for _, load := range []bool{true, false} {
		st := make([]client.Status, len(bad))
		det := make([]client.Detail, len(bad))
		if _, err := a.Batch(load, bad, st, det); err != nil {
			t.Fatal(err)
		}
		for j := range bad {
			if st[j] != client.BadRequest || det[j] != wantDet[j] {
				t.Errorf("load=%v entry %d: %v/%v, want bad-request/%v", load, j, st[j], det[j], wantDet[j])
			}
		}
	}
	if !bytes.Equal(sa.mem, before) {
		t.Fatal("rejected entries touched the buffer")
	}
	sb.checkGuard(t)

	// Raw ioctls: commands of other sizes, versions, counts, flags.
	raw := func(cmd uint32, arg []byte) syscall.Errno {
		_, err := a.Ioctl(cmd, arg)
		if err == nil {
			return 0
		}
		return err.(syscall.Errno)
	}
	ioc := func(dir, nr, size uint32) uint32 { return dir<<30 | size<<16 | abi.Magic<<8 | nr }
	arg := make([]byte, abi.BatchSize)
	(&abi.BatchHeader{ABI: abi.Version, Count: 1}).Marshal(arg)
	(&abi.Entry{Block: 1, Buffer: uint32(ida)}).Marshal(arg[abi.BatchHeaderSize:])
	for _, c := range []struct {
		name string
		cmd  uint32
		arg  []byte
		want syscall.Errno
	}{
		{"load of another size", ioc(3, 0x10, 100), arg[:100], syscall.ENOTTY},
		{"load without read", ioc(1, 0x10, abi.BatchSize), arg, syscall.ENOTTY},
		{"_IO on our magic", ioc(0, 0x10, 0), nil, syscall.ENOTTY},
		{"unknown nr", ioc(3, 0x7f, 64), arg[:64], syscall.ENOTTY},
	} {
		if got := raw(c.cmd, c.arg); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	mutate := func(off int, v byte) syscall.Errno {
		a2 := append([]byte(nil), arg...)
		a2[off] = v
		return raw(abi.CmdLoad, a2)
	}
	if got := mutate(0, 2); got != syscall.EPROTO {
		t.Errorf("ABI version 2: %v", got)
	}
	if got := mutate(0, 0); got != syscall.EPROTO {
		t.Errorf("ABI version 0: %v", got)
	}
	if got := mutate(5, 2); got != syscall.EINVAL {
		t.Errorf("count 513: %v", got)
	}
	if got := mutate(8, 1); got != syscall.EINVAL {
		t.Errorf("flags: %v", got)
	}
	// Garbage: random argument bytes (with the version right, so they get
	// past the header), random buffer ids including ours; the blocks are
	// absent, so nothing may be written.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		g := make([]byte, abi.BatchSize)
		for j := range g {
			g[j] = byte(rng.Uint32())
		}
		if rng.IntN(4) > 0 {
			(&abi.BatchHeader{ABI: abi.Version, Count: uint32(rng.IntN(abi.BatchMax + 1))}).Marshal(g)
			for j := abi.BatchHeaderSize; j < len(g); j += abi.EntrySize {
				if rng.IntN(2) == 0 {
					g[j+16], g[j+17], g[j+18], g[j+19] = byte(ida), byte(ida>>8), byte(ida>>16), byte(ida>>24)
				}
				if g[j]|g[j+1] == 0 {
					g[j] = 0xff // never block 1 (present)
				}
			}
		}
		// A garbage STORE that passes the checks reads only our
		// registered bytes, which stay unchanged either way.
		raw([]uint32{abi.CmdLoad, abi.CmdStore}[rng.IntN(2)], g)
	}
	if !bytes.Equal(sa.mem, before) {
		t.Fatal("garbage requests changed the buffer or its guard")
	}
	// The daemon still serves.
	if st, err := a.Load([]client.Entry{{Key: keys[2], Buffer: ida, Offset: 4096}}); err != nil || st[0] != client.OK {
		t.Fatalf("after garbage: %v %v", err, st)
	}
	if !bytes.Equal(sa.mem[4096:8192], groupData(e.gb, keys[2], 3)) {
		t.Fatal("load after garbage")
	}
}

// TestRegisterRejected: symlinks, files outside /dev/shm, non-regular
// files and files of other users are refused through the mount; the
// ownership check sees the real caller's uid.
func TestRegisterRejected(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 4, public: true})
	c := openClient(t, e)
	s := newShm(t, 4096, 0)
	link := s.path + ".link"
	if err := os.Symlink(s.path, link); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(link)
	tmp := t.TempDir() + "/buf"
	os.WriteFile(tmp, make([]byte, 4096), 0o600)
	for _, x := range []struct {
		path string
		want syscall.Errno
	}{
		{link, syscall.ELOOP},
		{tmp, syscall.EPERM},
		{"/etc/passwd", syscall.EPERM},
		{"/dev/shm/../../etc/passwd", syscall.EPERM},
		{"/dev/shm", syscall.EPERM},
		{s.path + ".missing", syscall.ENOENT},
	} {
		_, err := c.RegisterHost(x.path, 0)
		if !errors.Is(err, x.want) {
			t.Errorf("register %s: %v, want %v", x.path, err, x.want)
		}
	}
	if _, err := c.RegisterHost(s.path, 8192); !errors.Is(err, syscall.ERANGE) {
		t.Errorf("register beyond the end: %v", err)
	}

	// s belongs to nobody, mode 0600.
	if err := os.Chown(s.path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if id, err := c.RegisterHost(s.path, 0); err != nil {
		t.Fatalf("root: %v", err)
	} else {
		c.Unregister(id)
	}
	if got := registerAs(t, e, &syscall.Credential{Uid: 65534, Gid: 65534}, s.path); got != 0 {
		t.Fatalf("uid 65534 registering its own file: %v", got)
	}
	if got := registerAs(t, e, &syscall.Credential{Uid: 1000, Gid: 1000}, s.path); got != syscall.EACCES {
		t.Fatalf("uid 1000 registering nobody's file: %v", got)
	}
	// Group access.
	os.Chmod(s.path, 0o660)
	if got := registerAs(t, e, &syscall.Credential{Uid: 1000, Gid: 65534}, s.path); got != 0 {
		t.Fatalf("uid 1000 in nobody's group: %v", got)
	}
	e.waitSessions(1)
}

// TestKilledClient: a client killed with SIGKILL in the middle of loading
// leaves nothing behind, and the daemon serves the next client.
func TestKilledClient(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 16})
	var blocks []string
	for b := range uint64(8) {
		e.put(blockKeys(e.geo, 0x4000+b), 5)
		blocks = append(blocks, fmt.Sprintf("%x", 0x4000+b))
	}
	for round := range 3 {
		path := fmt.Sprintf("/dev/shm/kvfs-it-killed-%d-%d", os.Getpid(), round)
		t.Cleanup(func() { os.Remove(path) })
		cmd := helperCmd(t, e, "loadloop", nil, "KVFS_CTL_PATH="+path, "KVFS_CTL_BLOCKS="+joinComma(blocks))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		if line != "ready\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("helper: %q", line)
		}
		time.Sleep(time.Duration(20+rand.IntN(80)) * time.Millisecond)
		before := e.srv.Metrics().Loads
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		if e.srv.Metrics().Loads == before && round == 0 {
			t.Log("no load completed between ready and kill")
		}
		e.waitSessions(0)
		if m := e.srv.Metrics(); m.Buffers != 0 || m.RegisteredBytes != 0 {
			t.Fatalf("round %d: registrations left after the kill: %+v", round, m)
		}
	}
	// Another client is served.
	c := openClient(t, e)
	buf, err := c.NewHostBuffer("", int64(e.gb))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	k := layout.Key{Block: 0x4003, Layer: 3, Head: 1, Kind: layout.V}
	if st, err := c.Load([]client.Entry{{Key: k, Buffer: buf.ID}}); err != nil || st[0] != client.OK {
		t.Fatalf("after kills: %v %v", err, st)
	}
	if !bytes.Equal(buf.Mem, groupData(e.gb, k, 5)) {
		t.Fatal("after kills: wrong bytes")
	}
	if m := e.srv.Metrics(); m.Loads < 3 {
		t.Fatalf("loads %d", m.Loads)
	}
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}

// TestConcurrentClients: 8 clients store and load at once for a while, each
// verifying every byte of its own blocks and of a shared read-only set.
func TestConcurrentClients(t *testing.T) {
	concurrentClients(t, envOptions{slots: 128})
}

// TestConcurrentClientsTier is TestConcurrentClients through a DRAM tier of
// 4 blocks: every client's stores go through it and replace blocks it
// holds, and the shared set is served from it.
func TestConcurrentClientsTier(t *testing.T) {
	e := concurrentClients(t, envOptions{slots: 128, tierBlocks: 4})
	if m := e.tier.Metrics(); m.Hits == 0 || m.Misses == 0 || m.Evictions == 0 {
		t.Fatalf("the tier was not exercised: %+v", m)
	}
}

func concurrentClients(t *testing.T, o envOptions) *env {
	e := mountEnv(t, o)
	shared := blockKeys(e.geo, 0x5a5a)
	e.put(shared, 7)
	const clients = 8
	d := 2 * time.Second
	if testing.Short() {
		d = 300 * time.Millisecond
	}
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	var rounds [clients]int
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				c, err := client.Open(e.dir)
				if err != nil {
					return err
				}
				defer c.Close()
				per := e.geo.GroupsPerBlock()
				buf, err := c.NewHostBuffer("", int64(3*per*e.gb))
				if err != nil {
					return err
				}
				defer buf.Close()
				for r := 0; time.Now().Before(stop); r++ {
					rounds[w]++
					block := uint64(w+1)<<40 | uint64(r%6)
					keys := blockKeys(e.geo, block)
					es := make([]client.Entry, per)
					for i, k := range keys {
						copy(buf.Mem[i*e.gb:], groupData(e.gb, k, uint64(r)))
						es[i] = client.Entry{Key: k, Buffer: buf.ID, Offset: uint64(i * e.gb)}
					}
					if st, err := c.Store(es); err != nil || !allOK(st) {
						return fmt.Errorf("client %d store: %v %v", w, err, st)
					}
					for i := range es {
						es[i].Offset += uint64(per * e.gb)
					}
					for i, k := range shared {
						es = append(es, client.Entry{Key: k, Buffer: buf.ID, Offset: uint64((2*per + i) * e.gb)})
					}
					clear(buf.Mem[per*e.gb:])
					if st, err := c.Load(es); err != nil || !allOK(st) {
						return fmt.Errorf("client %d load: %v %v", w, err, st)
					}
					for i, k := range keys {
						if !bytes.Equal(buf.Mem[(per+i)*e.gb:(per+i+1)*e.gb], groupData(e.gb, k, uint64(r))) {
							return fmt.Errorf("client %d round %d: %v differs", w, r, k)
						}
					}
					for i, k := range shared {
						if !bytes.Equal(buf.Mem[(2*per+i)*e.gb:(2*per+i+1)*e.gb], groupData(e.gb, k, 7)) {
							return fmt.Errorf("client %d round %d: shared %v differs", w, r, k)
						}
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("rounds per client: %v", rounds)
	return e
}
