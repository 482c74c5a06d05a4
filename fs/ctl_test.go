package fs

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// echoCtl is a CtlHandler whose sessions answer every ioctl with the input
// reversed and the input's size as the result.
type echoCtl struct {
	mu       sync.Mutex
	opened   int
	released int
	uid, gid uint32
}

type echoSession struct{ c *echoCtl }

func (c *echoCtl) Open(uid, gid uint32) (CtlSession, syscall.Errno) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opened++
	c.uid, c.gid = uid, gid
	return echoSession{c}, 0
}

func (s echoSession) Ioctl(cmd uint32, in, out []byte) (int32, syscall.Errno) {
	if cmd>>30 == 0 {
		return 0, syscall.EINVAL
	}
	for i := range out {
		if i < len(in) {
			out[i] = in[len(in)-1-i]
		}
	}
	return int32(len(in)), 0
}

func (s echoSession) Release() {
	s.c.mu.Lock()
	s.c.released++
	s.c.mu.Unlock()
}

func (c *echoCtl) counts() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opened, c.released
}

// iowr is _IOWR('k', nr, size).
func iowr(nr, size uint32) uint32 { return 3<<30 | size<<16 | uint32('k')<<8 | nr }

func ioctl(fd uintptr, cmd uint32, buf []byte) (int, error) {
	var p unsafe.Pointer
	if len(buf) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uintptr(cmd), uintptr(p))
	if errno != 0 {
		return int(r), errno
	}
	return int(r), nil
}

func TestCtlSessionsAndIoctls(t *testing.T) {
	h := &echoCtl{}
	e := mountEnv(t, 4, Options{Ctl: h})
	p := filepath.Join(e.dir, ".kvfs", "ctl")
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o600 || st.Uid != uint32(os.Getuid()) || st.Gid != uint32(os.Getgid()) {
		t.Fatalf("ctl mode %o owner %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	// Sizes up to the restricted-ioctl limit of 16383 bytes.
	for _, n := range []uint32{1, 64, 4096, 8192, 16383} {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		want := make([]byte, n)
		for i := range want {
			want[i] = buf[len(buf)-1-i]
		}
		r, err := ioctl(f.Fd(), iowr(1, n), buf)
		if err != nil || r != int(n) {
			t.Fatalf("ioctl of %d bytes: %d, %v", n, r, err)
		}
		if string(buf) != string(want) {
			t.Fatalf("ioctl of %d bytes: wrong output", n)
		}
	}
	_, err = ioctl(f.Fd(), 'k'<<8|9, nil) // _IO: no data
	wantErrno(t, "ioctl the session refuses", err, syscall.EINVAL)
	if o, r := h.counts(); o != 1 || r != 0 {
		t.Fatalf("sessions opened %d released %d", o, r)
	}
	h.mu.Lock()
	uid, gid := h.uid, h.gid
	h.mu.Unlock()
	if uid != uint32(os.Getuid()) || gid != uint32(os.Getgid()) {
		t.Fatalf("session credentials %d:%d", uid, gid)
	}
	f2, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f2.Close(); err != nil {
		t.Fatal(err)
	}
	// Release is asynchronous to close(2): wait for it.
	waitFor(t, func() bool { o, r := h.counts(); return o == 2 && r == 2 })
	if m := e.srv.FS.Metrics(); m.CtlOpen != 0 || m.CtlSessions != 2 || m.Ioctls != 6 {
		t.Fatalf("metrics %+v", m)
	}
}

func TestCtlWithoutHandlerIsENOTTY(t *testing.T) {
	gid := uint32(4242)
	e := mountEnv(t, 4, Options{CtlMode: 0o660, CtlGID: &gid})
	p := filepath.Join(e.dir, ".kvfs", "ctl")
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil || st.Mode&0o7777 != 0o660 || st.Gid != gid {
		t.Fatalf("ctl mode %o gid %d: %v", st.Mode&0o7777, st.Gid, err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = ioctl(f.Fd(), iowr(1, 16), make([]byte, 16))
	wantErrno(t, "ioctl without handler", err, syscall.ENOTTY)
	// Ioctls on other files are ENOTTY too.
	g, err := os.Open(filepath.Join(e.dir, ".kvfs", "geometry"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	_, err = ioctl(g.Fd(), iowr(1, 16), make([]byte, 16))
	wantErrno(t, "ioctl on geometry", err, syscall.ENOTTY)
}

// TestHandler: fs.Handler forwards the credentials, and a failed open is a
// nil CtlSession, not an interface holding a nil *echoSession.
func TestHandler(t *testing.T) {
	var got [2]uint32
	h := Handler(func(uid, gid uint32) (*echoSession, syscall.Errno) {
		got = [2]uint32{uid, gid}
		if uid == 7 {
			return nil, syscall.EACCES
		}
		return &echoSession{c: &echoCtl{}}, 0
	})
	if s, errno := h.Open(1, 2); errno != 0 || s == nil || got != [2]uint32{1, 2} {
		t.Fatalf("open: %v, %v, credentials %v", s, errno, got)
	}
	if s, errno := h.Open(7, 0); errno != syscall.EACCES || s != nil {
		t.Fatalf("failed open: %#v, %v; want a nil session and EACCES", s, errno)
	}
}
