package uring

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestAvailable(t *testing.T) {
	if err := Available(); err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Available error %v does not wrap ErrUnavailable", err)
		}
		t.Skipf("skipping: %v", err)
	}
}

func TestProbe(t *testing.T) {
	r := newRing(t, Options{Entries: 4})
	p, err := r.Probe()
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []Opcode{OpNop, OpRead, OpWrite, OpReadFixed, OpWriteFixed, OpFsync} {
		if !p.Supported(op) {
			t.Errorf("%v not supported", op)
		}
	}
	if p.LastOp < OpWrite {
		t.Errorf("LastOp = %v", p.LastOp)
	}
	t.Logf("kernel supports %d opcodes, last %v; URING_CMD: %v; ring flags %#x features %#x",
		len(p.Ops()), p.LastOp, p.Supported(OpURingCmd), r.Flags(), r.Features())
}

func TestSetupFallbackFlags(t *testing.T) {
	// Asking for everything must succeed (unsupported optional flags are
	// dropped), and DEFER_TASKRUN never comes without SINGLE_ISSUER.
	r := newRing(t, Options{Entries: 8, SingleIssuer: true, CoopTaskrun: true, DeferTaskrun: true})
	f := r.Flags()
	if f&SetupDeferTaskrun != 0 && f&SetupSingleIssuer == 0 {
		t.Fatalf("flags %#x: DEFER_TASKRUN without SINGLE_ISSUER", f)
	}
	t.Logf("flags in effect: %#x", f)
	// SQPOLL + DEFER_TASKRUN is refused by the kernel; New drops DEFER.
	r2 := newRing(t, Options{Entries: 8, SQPoll: true, DeferTaskrun: true})
	if r2.Flags()&SetupDeferTaskrun != 0 || r2.Flags()&SetupSQPoll == 0 {
		t.Fatalf("flags %#x", r2.Flags())
	}
}

func TestNopWraparound(t *testing.T) {
	r := newRing(t, Options{Entries: 8})
	if r.SQEntries() != 8 {
		t.Fatalf("SQEntries = %d", r.SQEntries())
	}
	// A full SQ hands out no more SQEs.
	for i := 0; i < 8; i++ {
		if r.GetSQE() == nil {
			t.Fatalf("GetSQE %d nil", i)
		}
	}
	if r.GetSQE() != nil {
		t.Fatal("GetSQE on a full SQ")
	}
	if n, err := r.SubmitAndWait(8); err != nil || n != 8 {
		t.Fatalf("SubmitAndWait = %d, %v", n, err)
	}
	if got := r.ReapCQEs(make([]CQE, 16)); got != 8 {
		t.Fatalf("reaped %d", got)
	}

	const total = 8 * 2500 // many times the ring size
	seen := make([]bool, total)
	next := 0
	cqes := make([]CQE, 8)
	for batch := 1; next < total; batch = batch%8 + 1 {
		n := min(batch, total-next)
		for i := 0; i < n; i++ {
			s := r.GetSQE()
			s.PrepNop()
			s.SetUserData(uint64(next + i))
		}
		if _, err := r.SubmitAndWait(n); err != nil {
			t.Fatal(err)
		}
		got := 0
		for got < n {
			if batch%2 == 0 { // exercise both completion paths
				c, err := r.WaitCQE()
				if err != nil {
					t.Fatal(err)
				}
				r.CQAdvance(1)
				cqes[0] = c
				got += check1(t, seen, cqes[:1])
			} else {
				got += check1(t, seen, cqes[:r.ReapCQEs(cqes)])
			}
		}
		next += n
	}
	for i, ok := range seen {
		if !ok {
			t.Fatalf("user_data %d never completed", i)
		}
	}
	if _, ok, _ := r.PeekCQE(); ok {
		t.Fatal("stray CQE")
	}
}

func check1(t *testing.T, seen []bool, cqes []CQE) int {
	t.Helper()
	for _, c := range cqes {
		if c.Res != 0 {
			t.Fatalf("NOP res %d", c.Res)
		}
		if c.UserData >= uint64(len(seen)) || seen[c.UserData] {
			t.Fatalf("unexpected or repeated user_data %d", c.UserData)
		}
		seen[c.UserData] = true
	}
	return len(cqes)
}

// pipeline keeps qd requests in flight until total have completed; slot
// numbers in [0, qd) tell prep and done which buffer to use.
func pipeline(t *testing.T, r *Ring, total, qd int, prep func(s *SQE, i, slot int), done func(c CQE, i, slot int)) {
	t.Helper()
	free := make([]int, 0, qd)
	for i := qd - 1; i >= 0; i-- {
		free = append(free, i)
	}
	cqes := make([]CQE, r.CQEntries())
	started, finished := 0, 0
	for finished < total {
		for started < total && len(free) > 0 {
			s := r.GetSQE()
			if s == nil {
				break
			}
			slot := free[len(free)-1]
			free = free[:len(free)-1]
			prep(s, started, slot)
			s.SetUserData(uint64(started)<<16 | uint64(slot))
			started++
		}
		if _, err := r.SubmitAndWait(1); err != nil {
			t.Fatal(err)
		}
		for _, c := range cqes[:r.ReapCQEs(cqes)] {
			slot := int(c.UserData & 0xffff)
			done(c, int(c.UserData>>16), slot)
			free = append(free, slot)
			finished++
		}
	}
}

func TestFixedRoundTripQD(t *testing.T) {
	needURing(t)
	dir := diskDir(t)
	const block = 16 << 10
	for qd := 1; qd <= 256; qd *= 2 {
		t.Run(fmt.Sprintf("QD=%d", qd), func(t *testing.T) {
			n := max(2*qd, 32)
			fd := openDirect(t, dir, n*block)
			r := newRing(t, Options{Entries: uint32(qd)})
			wbuf := alignedBuf(t, qd*block)
			rbuf := alignedBuf(t, qd*block)
			pieces, err := r.RegisterBuffers([][]byte{wbuf, rbuf})
			if err != nil {
				t.Fatal(err)
			}
			if len(pieces) != 2 || pieces[1].Index != 1 || pieces[1].Source != 1 {
				t.Fatalf("pieces %+v", pieces)
			}
			seed := func(i int) uint64 { return uint64(qd)<<32 | uint64(i) }
			pipeline(t, r, n, qd, func(s *SQE, i, slot int) {
				b := wbuf[slot*block : (slot+1)*block]
				fill(b, seed(i))
				s.PrepWriteFixed(int32(fd), b, uint64(i*block), 0)
			}, func(c CQE, i, slot int) {
				if c.Res != block {
					t.Fatalf("write %d: res %d (%v)", i, c.Res, c.Err())
				}
			})
			pipeline(t, r, n, qd, func(s *SQE, i, slot int) {
				b := rbuf[slot*block : (slot+1)*block]
				clear(b)
				s.PrepReadFixed(int32(fd), b, uint64(i*block), 1)
			}, func(c CQE, i, slot int) {
				if c.Res != block {
					t.Fatalf("read %d: res %d (%v)", i, c.Res, c.Err())
				}
				if !bytes.Equal(rbuf[slot*block:(slot+1)*block], pattern(block, seed(i))) {
					t.Fatalf("read %d: data differs", i)
				}
			})
			if err := r.UnregisterBuffers(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSQPoll(t *testing.T) {
	needURing(t)
	r, err := New(Options{Entries: 16, SQPoll: true, SQPollIdle: 10 * time.Millisecond})
	if errors.Is(err, unix.EPERM) {
		t.Skipf("skipping: SQPOLL not permitted: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Flags()&SetupSQPoll == 0 {
		t.Fatal("no SQPOLL")
	}
	p := filepath.Join(t.TempDir(), "f")
	want := pattern(4096, 7)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	round := func(name string) {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			for i := 0; i < 10; i++ {
				s := r.GetSQE()
				s.PrepNop()
				s.SetUserData(uint64(i))
			}
			s := r.GetSQE()
			clear(buf)
			s.PrepRead(int32(f.Fd()), buf, 0)
			s.SetUserData(99)
			if _, err := r.Submit(); err != nil {
				done <- err
				return
			}
			for got := 0; got < 11; got++ {
				c, err := r.WaitCQE()
				if err != nil {
					done <- err
					return
				}
				r.CQAdvance(1)
				if c.UserData == 99 && c.Res != 4096 {
					done <- fmt.Errorf("read res %d", c.Res)
					return
				}
			}
			done <- nil
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: completions never came (poll thread not woken?)", name)
		}
		if !bytes.Equal(buf, want) {
			t.Fatalf("%s: data differs", name)
		}
	}
	round("awake")
	time.Sleep(50 * time.Millisecond) // past the idle time: the thread sleeps
	t.Logf("need-wakeup after idle: %v", (*r.kSQFlags)&sqNeedWakeup != 0)
	round("after idle")
}

func TestLinked(t *testing.T) {
	r := newRing(t, Options{Entries: 8})
	p := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int32(f.Fd())
	a, b := bytes.Repeat([]byte("A"), 512), bytes.Repeat([]byte("B"), 512)
	got := make([]byte, 512)
	// write A, then B over it, then read: links run in order.
	s := r.GetSQE()
	s.PrepWrite(fd, a, 0)
	s.SetFlags(SQEIOLink)
	s.SetUserData(1)
	s = r.GetSQE()
	s.PrepWrite(fd, b, 0)
	s.SetFlags(SQEIOLink)
	s.SetUserData(2)
	s = r.GetSQE()
	s.PrepRead(fd, got, 0)
	s.SetUserData(3)
	if _, err := r.SubmitAndWait(3); err != nil {
		t.Fatal(err)
	}
	cqes := make([]CQE, 8)
	n := 0
	for n < 3 {
		n += r.ReapCQEs(cqes[n:])
		if n < 3 {
			if _, err := r.WaitCQE(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, c := range cqes[:3] {
		if c.UserData != uint64(i+1) || c.Res != 512 {
			t.Fatalf("cqe %d: %+v", i, c)
		}
	}
	if !bytes.Equal(got, b) {
		t.Fatalf("read %q…, want B…", got[:4])
	}
	// A failed link cancels the rest of the chain.
	s = r.GetSQE()
	s.PrepRead(-1, got, 0)
	s.SetFlags(SQEIOLink)
	s.SetUserData(10)
	s = r.GetSQE()
	s.PrepNop()
	s.SetUserData(11)
	if _, err := r.SubmitAndWait(2); err != nil {
		t.Fatal(err)
	}
	res := map[uint64]error{}
	for len(res) < 2 {
		c, err := r.WaitCQE()
		if err != nil {
			t.Fatal(err)
		}
		r.CQAdvance(1)
		res[c.UserData] = c.Err()
	}
	if !errors.Is(res[10], unix.EBADF) || !errors.Is(res[11], unix.ECANCELED) {
		t.Fatalf("chain results %v", res)
	}
}

func TestShortReadAtEOF(t *testing.T) {
	r := newRing(t, Options{Entries: 4})
	p := filepath.Join(t.TempDir(), "f")
	want := pattern(10000, 3)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 8192)
	for _, tc := range []struct {
		off  uint64
		want int32
	}{{8192, 10000 - 8192}, {10000, 0}, {0, 8192}} {
		s := r.GetSQE()
		s.PrepRead(int32(f.Fd()), buf, tc.off)
		if _, err := r.SubmitAndWait(1); err != nil {
			t.Fatal(err)
		}
		c, err := r.WaitCQE()
		if err != nil {
			t.Fatal(err)
		}
		r.CQAdvance(1)
		if c.Res != tc.want {
			t.Fatalf("read at %d: res %d, want %d", tc.off, c.Res, tc.want)
		}
		if !bytes.Equal(buf[:c.Res], want[tc.off:int(tc.off)+int(c.Res)]) {
			t.Fatalf("read at %d: data differs", tc.off)
		}
	}
}

func TestBadFdPerRequest(t *testing.T) {
	r := newRing(t, Options{Entries: 16})
	p := filepath.Join(t.TempDir(), "f")
	want := pattern(4096, 9)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bufs := make([][]byte, 8)
	for round := 0; round < 3; round++ {
		for i := range bufs {
			bufs[i] = make([]byte, 4096)
			s := r.GetSQE()
			fd := int32(f.Fd())
			if round < 2 && i%2 == 1 {
				fd = 1 << 20 // beyond any descriptor table
			}
			s.PrepRead(fd, bufs[i], 0)
			s.SetUserData(uint64(i))
		}
		if _, err := r.SubmitAndWait(len(bufs)); err != nil {
			t.Fatal(err)
		}
		cqes := make([]CQE, 16)
		got := 0
		for got < len(bufs) {
			n := r.ReapCQEs(cqes)
			for _, c := range cqes[:n] {
				bad := round < 2 && c.UserData%2 == 1
				switch {
				case bad && !errors.Is(c.Err(), unix.EBADF):
					t.Fatalf("round %d req %d: %v, want EBADF", round, c.UserData, c.Err())
				case !bad && (c.Res != 4096 || !bytes.Equal(bufs[c.UserData], want)):
					t.Fatalf("round %d req %d: res %d", round, c.UserData, c.Res)
				}
			}
			got += n
			if got < len(bufs) {
				if _, err := r.WaitCQE(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func TestSQE128ZeroingAndURingCmd(t *testing.T) {
	r := newRing(t, Options{Entries: 2, SQE128: true, CQE32: true})
	if r.SQESize() != 128 || r.Flags()&SetupCQE32 == 0 {
		t.Fatalf("sqe size %d flags %#x", r.SQESize(), r.Flags())
	}
	s := r.GetSQE()
	if len(r.CmdArea(s)) != 80 {
		t.Fatalf("cmd area %d bytes", len(r.CmdArea(s)))
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(s)), 128)
	for i := range raw {
		raw[i] = 0xAB // a stale entry
	}
	s.PrepNop() // rewrites the first 64 bytes only
	if raw[64] != 0xAB {
		t.Fatal("PrepNop touched the second half")
	}
	s.SetUserData(1)
	s2 := r.GetSQE()
	s2.PrepNop()
	s2.SetUserData(2)
	if _, err := r.SubmitAndWait(2); err != nil {
		t.Fatal(err)
	}
	cqes := make([]CQE, 4)
	if n := r.ReapCQEs(cqes); n != 2 || cqes[0].Err() != nil || cqes[0].Big != [2]uint64{} {
		t.Fatalf("cqes %d %+v", n, cqes[:n])
	}
	// The ring has two entries: the next GetSQE reuses the stale one.
	s = r.GetSQE()
	for i, v := range unsafe.Slice((*byte)(unsafe.Pointer(s)), 128) {
		if v != 0 {
			t.Fatalf("byte %d of a reused SQE is %#x", i, v)
		}
	}
	cmd := bytes.Repeat([]byte{0x5A}, 80)
	if err := r.PrepURingCmd(s, 0, NVMeURingCmdIO, append(cmd, 1)); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("81-byte command: %v", err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := r.PrepURingCmd(s, int32(f.Fd()), NVMeURingCmdIO, cmd); err != nil {
		t.Fatal(err)
	}
	if s.Opcode != OpURingCmd || uint32(s.Off) != NVMeURingCmdIO || !bytes.Equal(r.CmdArea(s), cmd) {
		t.Fatal("URING_CMD SQE not as prepared")
	}
	s.SetUserData(3)
	if _, err := r.SubmitAndWait(1); err != nil {
		t.Fatal(err)
	}
	c, err := r.WaitCQE()
	if err != nil {
		t.Fatal(err)
	}
	r.CQAdvance(1)
	// A regular file has no uring_cmd: the request fails, the ring goes on.
	if c.UserData != 3 || c.Err() == nil {
		t.Fatalf("URING_CMD on a regular file: %+v", c)
	}
	t.Logf("URING_CMD on a regular file: %v", c.Err())
	s = r.GetSQE()
	s.PrepNop()
	if _, err := r.SubmitAndWait(1); err != nil {
		t.Fatal(err)
	}
	if c, err := r.WaitCQE(); err != nil || c.Err() != nil {
		t.Fatalf("NOP after failed URING_CMD: %+v %v", c, err)
	}
}

func TestSmallRingCmdArea(t *testing.T) {
	r := newRing(t, Options{Entries: 2})
	if n := len(r.CmdArea(r.GetSQE())); n != 16 {
		t.Fatalf("cmd area %d", n)
	}
}

func TestSplitBuffers(t *testing.T) {
	// 2.5 GiB of address space, never touched.
	const size = 5 << 29
	m, err := unix.Mmap(-1, 0, size, unix.PROT_NONE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_NORESERVE)
	if err != nil {
		t.Skipf("skipping: cannot reserve 2.5 GiB of address space: %v", err)
	}
	defer unix.Munmap(m)
	small := make([]byte, 100)
	pieces := SplitBuffers([][]byte{small, m}, 3)
	want := []struct{ idx, src, off, n int }{
		{3, 0, 0, 100}, {4, 1, 0, 1 << 30}, {5, 1, 1 << 30, 1 << 30}, {6, 1, 2 << 30, 1 << 29},
	}
	if len(pieces) != len(want) {
		t.Fatalf("%d pieces", len(pieces))
	}
	for i, w := range want {
		p := pieces[i]
		if int(p.Index) != w.idx || p.Source != w.src || p.Offset != w.off || len(p.Buf) != w.n {
			t.Fatalf("piece %d: index %d source %d offset %d len %d, want %+v", i, p.Index, p.Source, p.Offset, len(p.Buf), w)
		}
	}
	if !pieces[2].Contains(m[1<<30:1<<30+4096]) || pieces[1].Contains(m[1<<30-10:1<<30+10]) {
		t.Fatal("Contains")
	}
}

func TestSparseBufferUpdate(t *testing.T) {
	r := newRing(t, Options{Entries: 4})
	if err := r.RegisterBuffersSparse(4); err != nil {
		t.Skipf("skipping: sparse buffer table unsupported: %v", err)
	}
	p := filepath.Join(t.TempDir(), "f")
	want := pattern(8192, 11)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := alignedBuf(t, 8192)
	read := func(idx uint16) error {
		clear(buf)
		s := r.GetSQE()
		s.PrepReadFixed(int32(f.Fd()), buf, 0, idx)
		if _, err := r.SubmitAndWait(1); err != nil {
			return err
		}
		c, err := r.WaitCQE()
		r.CQAdvance(1)
		if err != nil {
			return err
		}
		if c.Err() == nil && !bytes.Equal(buf, want) {
			return errors.New("data differs")
		}
		return c.Err()
	}
	if err := read(2); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("READ_FIXED on an empty slot: %v, want EFAULT", err)
	}
	if err := r.UpdateBuffers([]FixedBuffer{{Index: 2, Buf: buf}}); err != nil {
		t.Fatal(err)
	}
	if err := read(2); err != nil {
		t.Fatal(err)
	}
	if err := r.UpdateBuffers([]FixedBuffer{{Index: 2}}); err != nil {
		t.Fatal(err)
	}
	if err := read(2); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("READ_FIXED on a cleared slot: %v, want EFAULT", err)
	}
	if err := r.RegisterFiles([]int{int(f.Fd())}); err != nil {
		t.Fatal(err)
	}
	if err := r.UnregisterFiles(); err != nil {
		t.Fatal(err)
	}
}
