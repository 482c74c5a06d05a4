package bench

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/gpu/cuda"
)

// ParseInto parses bench-load's --into: "host" (nil), "cuda" (device 0),
// "cuda:N" or "cuda:N,M,…" (jobs spread over the devices round-robin);
// "pinned[:N,…]" the same devices with pinned true: host targets the client
// pins for CUDA and copies to the device itself after each call.
func ParseInto(s string) (devs []int, pinned bool, err error) {
	if p, ok := strings.CutPrefix(s, "pinned"); ok {
		if p != "" && !strings.HasPrefix(p, ":") {
			return nil, false, fmt.Errorf("%w: --into %q: want host, cuda, cuda:N, cuda:N,M or pinned[:N,…]", ErrConfig, s)
		}
		devs, err := parseCUDA("cuda" + p)
		return devs, true, err
	}
	devs, err = parseCUDA(s)
	return devs, false, err
}

func parseCUDA(s string) ([]int, error) {
	switch {
	case s == "" || s == "host":
		return nil, nil
	case s == "cuda":
		return []int{0}, nil
	case strings.HasPrefix(s, "cuda:"):
		var devs []int
		for _, f := range strings.Split(strings.TrimPrefix(s, "cuda:"), ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("%w: --into %q: want host, cuda, cuda:N, cuda:N,M or pinned[:N,…]", ErrConfig, s)
			}
			for _, d := range devs {
				if d == n {
					return nil, fmt.Errorf("%w: --into %q names device %d twice", ErrConfig, s, n)
				}
			}
			devs = append(devs, n)
		}
		return devs, nil
	}
	return nil, fmt.Errorf("%w: --into %q: want host, cuda, cuda:N, cuda:N,M or pinned[:N,…]", ErrConfig, s)
}

// DeviceResult is one device's share of a load into GPU memory.
type DeviceResult struct {
	Device int     `json:"device"`
	Name   string  `json:"name"`
	Jobs   int     `json:"jobs"`
	Bytes  int64   `json:"bytes"`
	GBps   float64 `json:"gbps"`
	// H2DGBps is the pinned host-to-device copy rate measured by this
	// process on the device in the same run (cuMemcpyHtoD from
	// cuMemHostAlloc memory, H2DChunk bytes per copy).
	H2DGBps  float64 `json:"h2d_gbps"`
	H2DChunk int     `json:"h2d_chunk"`
}

// cudaAlloc is device memory this process allocated and registered with
// the daemon through an IPC handle.
type cudaAlloc struct {
	dev  cuda.Device
	ctx  cuda.Context
	ptr  cuda.DevicePtr
	size int
	name string
}

// newCUDAAlloc allocates n bytes on device ordinal.
func newCUDAAlloc(ordinal, n int) (*cudaAlloc, error) {
	d, ctx, err := cuda.RetainPrimary(ordinal)
	if err != nil {
		return nil, err
	}
	a := &cudaAlloc{dev: d, ctx: ctx, size: n}
	a.name, _ = d.Name()
	if err := ctx.Do(func() error {
		var err error
		a.ptr, err = cuda.MemAlloc(n)
		return err
	}); err != nil {
		_ = d.PrimaryCtxRelease()
		return nil, err
	}
	return a, nil
}

// register exports the allocation and registers it whole with the daemon.
func (a *cudaAlloc) register(c *client.Client, ordinal int) (client.BufferID, error) {
	var h cuda.IpcMemHandle
	if err := a.ctx.Do(func() error {
		var err error
		h, err = cuda.IpcGetMemHandle(a.ptr)
		return err
	}); err != nil {
		return 0, err
	}
	return c.RegisterCUDA(h.Reserved, 0, uint64(a.size), ordinal)
}

func (a *cudaAlloc) free() {
	_ = a.ctx.Do(func() error { return cuda.MemFree(a.ptr) })
	_ = a.dev.PrimaryCtxRelease()
}

// PinnedH2D measures this process's pinned host-to-device copy rate on
// device ordinal: copies of chunk bytes from cuMemHostAlloc memory, for
// about dur, synchronous (each copy waits for the previous).
func PinnedH2D(ordinal, chunk int, dur time.Duration) (float64, error) {
	a, err := newCUDAAlloc(ordinal, chunk)
	if err != nil {
		return 0, err
	}
	defer a.free()
	var gbps float64
	err = a.ctx.Do(func() error {
		host, err := cuda.MemHostAlloc(chunk, cuda.MemHostAllocPortable)
		if err != nil {
			return err
		}
		defer cuda.MemFreeHost(host)
		for i := range host {
			host[i] = byte(i)
		}
		if err := cuda.MemcpyHtoD(a.ptr, host); err != nil { // warm up
			return err
		}
		gbps, err = h2dRate(dur, chunk, func() error { return cuda.MemcpyHtoD(a.ptr, host) })
		return err
	})
	return gbps, err
}

// h2dRate runs copyOne (one synchronous copy of chunk bytes) for about dur,
// at least 4 times, and returns the rate in GB/s.
func h2dRate(dur time.Duration, chunk int, copyOne func() error) (float64, error) {
	n, start := 0, time.Now()
	for time.Since(start) < dur || n < 4 {
		if err := copyOne(); err != nil {
			return 0, err
		}
		n++
	}
	return float64(n) * float64(chunk) / time.Since(start).Seconds() / 1e9, nil
}

// copyTo copies host (pinned by the caller) to the allocation, synchronously.
func (a *cudaAlloc) copyTo(host []byte) error {
	return a.ctx.Do(func() error { return cuda.MemcpyHtoD(a.ptr, host[:min(len(host), a.size)]) })
}

// MappedH2DResult is MappedH2D's measurement of one file.
type MappedH2DResult struct {
	// Pageable is the copy rate before the mapping is registered (the
	// driver stages pageable memory itself), Registered after.
	Pageable, Registered float64
	// Register is how long cuMemHostRegister of the whole mapping took.
	Register time.Duration
}

// MappedH2D measures copies of chunk bytes from random chunk-aligned places
// of the file at path, mapped shared and read-only, to device ordinal: for
// about dur each, first with the mapping pageable, then registered with
// CUDA (portable, read-only). It is the ceiling of a GPU load that copies
// straight from a store file in memory (tmpfs), with no staging.
func MappedH2D(ordinal int, path string, chunk int, dur time.Duration) (MappedH2DResult, error) {
	var res MappedH2DResult
	f, err := os.Open(path)
	if err != nil {
		return res, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return res, err
	}
	n := int(st.Size()) / chunk * chunk
	if n < chunk {
		return res, fmt.Errorf("%w: %s holds no %d-byte chunk", ErrConfig, path, chunk)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return res, fmt.Errorf("mmap %s: %w", path, err)
	}
	defer unix.Munmap(m)
	a, err := newCUDAAlloc(ordinal, chunk)
	if err != nil {
		return res, err
	}
	defer a.free()
	rng := rand.New(rand.NewPCG(1, 2))
	rate := func() (float64, error) {
		return h2dRate(dur, chunk, func() error {
			off := rng.IntN(n/chunk) * chunk
			return cuda.MemcpyHtoD(a.ptr, m[off:off+chunk])
		})
	}
	err = a.ctx.Do(func() error {
		var err error
		if res.Pageable, err = rate(); err != nil {
			return err
		}
		t := time.Now()
		if err := cuda.MemHostRegister(m, cuda.MemHostRegisterPortable|cuda.MemHostRegisterReadOnly); err != nil {
			return err
		}
		res.Register = time.Since(t)
		defer cuda.MemHostUnregister(m)
		res.Registered, err = rate()
		return err
	})
	return res, err
}
