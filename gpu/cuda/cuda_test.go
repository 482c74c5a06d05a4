package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"unsafe"
)

// requireGPU skips when this machine has no CUDA driver or device.
func requireGPU(t testing.TB) Context {
	t.Helper()
	if err := Load(); err != nil {
		t.Skipf("no GPU here: %v", err)
	}
	n, err := DeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no GPU here: %d devices, %v", n, err)
	}
	d, err := GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.PrimaryCtxRetain()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.PrimaryCtxRelease() })
	return c
}

func TestLoadWithoutDriverIsSentinel(t *testing.T) {
	_, err := openDriver()
	if err == nil {
		t.Skip("a CUDA driver is installed here")
	}
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("openDriver without libcuda: %v, want ErrNoDriver", err)
	}
	lerr := Load()
	if !errors.Is(lerr, ErrNoDriver) {
		t.Fatalf("Load: %v, want ErrNoDriver", lerr)
	}
	// Every entry point answers the same error and does not crash.
	if _, err := DeviceCount(); !errors.Is(err, ErrNoDriver) {
		t.Fatalf("DeviceCount: %v", err)
	}
	if _, _, err := RetainPrimary(0); !errors.Is(err, ErrNoDriver) {
		t.Fatalf("RetainPrimary: %v", err)
	}
	if _, err := MemHostAlloc(4096, 0); !errors.Is(err, ErrNoDriver) {
		t.Fatalf("MemHostAlloc: %v", err)
	}
	if _, err := IpcOpenMemHandle(IpcMemHandle{}, 0); !errors.Is(err, ErrNoDriver) {
		t.Fatalf("IpcOpenMemHandle: %v", err)
	}
	if err := (Context(0)).Do(func() error { return nil }); !errors.Is(err, ErrNoDriver) {
		t.Fatalf("Do: %v", err)
	}
	if Available() {
		t.Fatal("Available() true without a driver")
	}
}

func TestErrorMatching(t *testing.T) {
	e := error(&Error{Op: "cuEventQuery", Code: ErrorNotReady, Name: "CUDA_ERROR_NOT_READY"})
	if !errors.Is(fmt.Errorf("wrap: %w", e), &Error{Code: ErrorNotReady}) {
		t.Fatal("errors.Is by code failed")
	}
	if errors.Is(e, &Error{Code: ErrorInvalidValue}) {
		t.Fatal("matched another code")
	}
	if !errors.Is(&Error{Code: ErrorNoDevice}, ErrNoDevice) {
		t.Fatal("no-device code is not ErrNoDevice")
	}
	if Code(fmt.Errorf("x: %w", e)) != ErrorNotReady || Code(nil) != Success || Code(errors.New("x")) != -1 {
		t.Fatal("Code")
	}
}

func TestDeviceRoundTrip(t *testing.T) {
	c := requireGPU(t)
	err := c.Do(func() error {
		d, _ := GetDevice(0)
		name, err := d.Name()
		if err != nil {
			return err
		}
		mem, _ := d.TotalMem()
		v, _ := DriverVersion()
		t.Logf("device 0: %s, %d MiB, driver CUDA %d", name, mem>>20, v)
		const n = 8 << 20
		s, err := StreamCreate(StreamNonBlocking)
		if err != nil {
			return err
		}
		defer s.Destroy()
		ev, err := EventCreate(EventDisableTiming)
		if err != nil {
			return err
		}
		defer ev.Destroy()
		dp, err := MemAlloc(n)
		if err != nil {
			return err
		}
		defer MemFree(dp)
		h, err := MemHostAlloc(n, MemHostAllocPortable)
		if err != nil {
			return err
		}
		defer MemFreeHost(h)
		for i := range h {
			h[i] = byte(i*7 + i>>13)
		}
		if err := MemcpyHtoDAsync(dp, h, s); err != nil {
			return err
		}
		if err := ev.Record(s); err != nil {
			return err
		}
		if err := ev.Synchronize(); err != nil {
			return err
		}
		if done, err := ev.Done(); !done || err != nil {
			return fmt.Errorf("event after synchronize: %v %v", done, err)
		}
		back := make([]byte, n)
		if err := MemcpyDtoH(back, dp); err != nil {
			return err
		}
		if !bytes.Equal(back, h) {
			return errors.New("device round trip differs")
		}
		base, size, err := MemGetAddressRange(dp + 4096)
		if err != nil {
			return err
		}
		if base != dp || size < n {
			return fmt.Errorf("address range %x+%d, want %x+%d", base, size, dp, n)
		}
		ord, err := PointerDeviceOrdinal(dp)
		if err != nil || ord != 0 {
			return fmt.Errorf("ordinal %d %v", ord, err)
		}
		// A handle cannot be opened by its exporter: the driver says so.
		ih, err := IpcGetMemHandle(dp)
		if err != nil {
			return err
		}
		if p, err := IpcOpenMemHandle(ih, IpcMemLazyEnablePeerAccess); err == nil {
			_ = IpcCloseMemHandle(p)
			t.Log("note: this driver let the exporter open its own handle")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// fillPTX writes v into n uint32s at dst.
const fillPTX = `
.version 7.0
.target sm_52
.address_size 64
.visible .entry kvfs_fill(.param .u64 p_dst, .param .u32 p_n, .param .u32 p_v)
{
	.reg .pred %p<2>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [p_dst];
	ld.param.u32 %r1, [p_n];
	ld.param.u32 %r2, [p_v];
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %tid.x;
	mad.lo.s32 %r6, %r3, %r4, %r5;
	setp.ge.u32 %p1, %r6, %r1;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.u32 %rd3, %r6, 4;
	add.s64 %rd4, %rd2, %rd3;
	st.global.u32 [%rd4], %r2;
DONE:
	ret;
}
`

func TestKernelLaunch(t *testing.T) {
	c := requireGPU(t)
	err := c.Do(func() error {
		m, err := ModuleLoadData([]byte(fillPTX))
		if err != nil {
			return err
		}
		defer m.Unload()
		f, err := m.Function("kvfs_fill")
		if err != nil {
			return err
		}
		const n = 1000
		dp, err := MemAlloc(n * 4)
		if err != nil {
			return err
		}
		defer MemFree(dp)
		cnt, val := uint32(n), uint32(0xC0FFEE)
		if err := LaunchKernel(f, Dim3{X: (n + 255) / 256}, Dim3{X: 256}, 0, 0,
			unsafe.Pointer(&dp), unsafe.Pointer(&cnt), unsafe.Pointer(&val)); err != nil {
			return err
		}
		if err := CtxSynchronize(); err != nil {
			return err
		}
		back := make([]byte, n*4)
		if err := MemcpyDtoH(back, dp); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if v := *(*uint32)(unsafe.Pointer(&back[i*4])); v != val {
				return fmt.Errorf("word %d = %#x", i, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkH2DPinned is the reference the GPU load path is measured against:
// queue-depth-8 async copies from pinned host memory, one event per buffer.
func BenchmarkH2DPinned(b *testing.B) {
	for _, size := range []int{256 << 10, 1 << 20, 4 << 20, 16 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			c := requireGPU(b)
			err := c.Do(func() error {
				const depth = 8
				s, err := StreamCreate(StreamNonBlocking)
				if err != nil {
					return err
				}
				defer s.Destroy()
				dp, err := MemAlloc(size * depth)
				if err != nil {
					return err
				}
				defer MemFree(dp)
				h, err := MemHostAlloc(size*depth, MemHostAllocPortable)
				if err != nil {
					return err
				}
				defer MemFreeHost(h)
				evs := make([]Event, depth)
				for i := range evs {
					if evs[i], err = EventCreate(EventDisableTiming); err != nil {
						return err
					}
					defer evs[i].Destroy()
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					k := i % depth
					if i >= depth {
						if err := evs[k].Synchronize(); err != nil {
							return err
						}
					}
					if err := MemcpyHtoDAsync(dp+DevicePtr(k*size), h[k*size:(k+1)*size], s); err != nil {
						return err
					}
					if err := evs[k].Record(s); err != nil {
						return err
					}
				}
				return s.Synchronize()
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestMemcpy2DLayout: CUDA_MEMCPY2D as cuda.h lays it out on 64-bit Linux.
func TestMemcpy2DLayout(t *testing.T) {
	var c memcpy2D
	for _, f := range []struct {
		name      string
		off, want uintptr
	}{
		{"size", unsafe.Sizeof(c), 128},
		{"srcMemoryType", unsafe.Offsetof(c.srcMemoryType), 16},
		{"srcHost", unsafe.Offsetof(c.srcHost), 24},
		{"srcDevice", unsafe.Offsetof(c.srcDevice), 32},
		{"srcPitch", unsafe.Offsetof(c.srcPitch), 48},
		{"dstXInBytes", unsafe.Offsetof(c.dstXInBytes), 56},
		{"dstMemoryType", unsafe.Offsetof(c.dstMemoryType), 72},
		{"dstHost", unsafe.Offsetof(c.dstHost), 80},
		{"dstDevice", unsafe.Offsetof(c.dstDevice), 88},
		{"dstPitch", unsafe.Offsetof(c.dstPitch), 104},
		{"WidthInBytes", unsafe.Offsetof(c.widthInBytes), 112},
		{"Height", unsafe.Offsetof(c.height), 120},
	} {
		if f.off != f.want {
			t.Errorf("%s at %d, want %d", f.name, f.off, f.want)
		}
	}
}

// TestMemcpyAttributesLayout: CUmemcpyAttributes as cuda.h lays it out.
func TestMemcpyAttributesLayout(t *testing.T) {
	var a memcpyAttributes
	if unsafe.Sizeof(a) != 24 || unsafe.Offsetof(a.srcLocHint) != 4 || unsafe.Offsetof(a.dstLocHint) != 12 || unsafe.Offsetof(a.flags) != 20 {
		t.Fatalf("CUmemcpyAttributes: size %d, offsets %d %d %d; want 24, 4 12 20", unsafe.Sizeof(a),
			unsafe.Offsetof(a.srcLocHint), unsafe.Offsetof(a.dstLocHint), unsafe.Offsetof(a.flags))
	}
}

// TestMemcpyBatch: one cuMemcpyBatchAsync of scattered copies of several
// sizes, from pinned memory to one allocation in a shuffled order, lands
// every byte where it belongs and nothing between.
func TestMemcpyBatch(t *testing.T) {
	c := requireGPU(t)
	if !HasBatch() {
		t.Skip("the driver has no cuMemcpyBatchAsync")
	}
	err := c.Do(func() error {
		s, err := StreamCreate(StreamNonBlocking)
		if err != nil {
			return err
		}
		defer s.Destroy()
		const n, slot = 97, 64 << 10
		dp, err := MemAlloc(n * slot)
		if err != nil {
			return err
		}
		defer MemFree(dp)
		if err := MemsetD8(dp, 0xAA, n*slot); err != nil {
			return err
		}
		h, err := MemHostAlloc(n*slot, MemHostAllocPortable)
		if err != nil {
			return err
		}
		defer MemFreeHost(h)
		for i := range h {
			h[i] = byte(i*13 + i>>11)
		}
		dsts, srcs := make([]DevicePtr, n), make([][]byte, n)
		sizes := make([]int, n)
		for i := range n {
			j := (i * 37) % n // a permutation of the slots
			sizes[j] = 4096 * (1 + i%16)
			dsts[i] = dp + DevicePtr(j*slot)
			srcs[i] = h[i*slot : i*slot+sizes[j]]
		}
		if err := MemcpyBatchHtoDAsync(dsts, srcs, nil, s); err != nil {
			return err
		}
		if err := s.Synchronize(); err != nil {
			return err
		}
		back := make([]byte, n*slot)
		if err := MemcpyDtoH(back, dp); err != nil {
			return err
		}
		for i := range n {
			j := (i * 37) % n
			got := back[j*slot : (j+1)*slot]
			if !bytes.Equal(got[:sizes[j]], srcs[i]) {
				return fmt.Errorf("copy %d into slot %d: wrong bytes", i, j)
			}
			if !bytes.Equal(got[sizes[j]:], bytes.Repeat([]byte{0xAA}, slot-sizes[j])) {
				return fmt.Errorf("slot %d written past its %d bytes", j, sizes[j])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkQueueScattered: queueing 1,024 copies of 32 KiB (one HND
// (block, layer, kind) tile each) to scattered places, one call each
// against one batch call; the copies then run, so GB/s is end to end.
func BenchmarkQueueScattered(b *testing.B) {
	c := requireGPU(b)
	for _, batch := range []bool{false, true} {
		b.Run(fmt.Sprintf("batch=%v", batch), func(b *testing.B) {
			if batch && !HasBatch() {
				b.Skip("no cuMemcpyBatchAsync")
			}
			err := c.Do(func() error {
				s, err := StreamCreate(StreamNonBlocking)
				if err != nil {
					return err
				}
				defer s.Destroy()
				const n, size = 1024, 32 << 10
				dp, err := MemAlloc(2 * n * size)
				if err != nil {
					return err
				}
				defer MemFree(dp)
				h, err := MemHostAlloc(n*size, MemHostAllocPortable)
				if err != nil {
					return err
				}
				defer MemFreeHost(h)
				dsts, srcs := make([]DevicePtr, n), make([][]byte, n)
				for i := range n {
					dsts[i] = dp + DevicePtr(((i*389)%(2*n))*size)
					srcs[i] = h[i*size : (i+1)*size]
				}
				addrs := make([]uintptr, 3*n)
				b.SetBytes(n * size)
				b.ResetTimer()
				for range b.N {
					if batch {
						if err := MemcpyBatchHtoDAsync(dsts, srcs, addrs, s); err != nil {
							return err
						}
					} else {
						for i := range n {
							if err := MemcpyHtoDAsync(dsts[i], srcs[i], s); err != nil {
								return err
							}
						}
					}
					if err := s.Synchronize(); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestMissingSymbol: an unbound optional driver function is reported
// missing (not called through a nil func).
func TestMissingSymbol(t *testing.T) {
	var unbound func(s Stream) Result
	if !missing(unbound) || !missing(nil) || missing(func(s Stream) Result { return Success }) {
		t.Fatalf("missing: unbound %v, nil %v, bound %v", missing(unbound), missing(nil), missing(func(s Stream) Result { return Success }))
	}
}
