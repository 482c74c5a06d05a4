package ctl

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// spinHandler answers every ioctl after spinning (busy, not sleeping) for
// the duration in spin: a stand-in for a handler doing that much work.
type spinHandler struct{ spin *time.Duration }

func (h spinHandler) Open(uid, gid uint32) (fs.CtlSession, syscall.Errno) { return h, 0 }
func (h spinHandler) Release()                                            {}
func (h spinHandler) Ioctl(cmd uint32, in, out []byte) (int32, syscall.Errno) {
	copy(out, in)
	if cmd == abi.CmdInfo {
		(&abi.Info{ABI: abi.Version}).Marshal(out)
	}
	for t0 := time.Now(); time.Since(t0) < *h.spin; {
	}
	return 0, 0
}

// TestMeasureFUSEWakeup measures what FUSE alone adds to an ioctl whose
// handler is busy for a given time: the round trip minus the handler time.
// It separates the cost of the kernel and go-fuse (which grows with the
// time the caller sleeps, through wakeup latency) from the ctl server's.
//
//	KVFS_MEASURE=1 go test -run MeasureFUSEWakeup -v ./integration/ctl
func TestMeasureFUSEWakeup(t *testing.T) {
	if os.Getenv("KVFS_MEASURE") == "" {
		t.Skip("set KVFS_MEASURE=1 to measure")
	}
	requireMount(t)
	mem := storetest.Formatted(t, testGeo, 2, 4096)
	st := storetest.Open(t, mem, store.Options{})
	var spin time.Duration
	dir := t.TempDir()
	srv, err := fs.Mount(dir, st, fs.Options{Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), Ctl: spinHandler{&spin}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for range 100 {
			if err := srv.Unmount(); err == nil || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		srv.Wait()
	}()
	c, err := client.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	arg := make([]byte, abi.BatchSize)
	(&abi.BatchHeader{ABI: abi.Version}).Marshal(arg)
	for _, d := range []time.Duration{0, 25 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond,
		200 * time.Microsecond, 400 * time.Microsecond, 800 * time.Microsecond} {
		spin = d
		n := int(min(5000, 2*time.Second/max(d, 20*time.Microsecond)))
		t0 := time.Now()
		for range n {
			if _, err := c.Ioctl(abi.CmdLoad, arg); err != nil {
				t.Fatal(err)
			}
		}
		rt := time.Since(t0) / time.Duration(n)
		t.Logf("handler busy %4d µs: round trip %6.1f µs, FUSE adds %5.1f µs", d.Microseconds(),
			float64(rt.Nanoseconds())/1e3, float64((rt-d).Nanoseconds())/1e3)
	}
}
