package gpu

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/kvfs/kvfs/gpu/cuda"
)

// CUDA is one GPU through the driver API: its primary context, one
// non-blocking copy stream, events on it and pinned host memory
// (cuMemHostAlloc, portable). It implements Device.
type CUDA struct {
	Ordinal int
	Name    string
	// Node is the NUMA node the GPU sits on (-1: unknown, or one node);
	// pinned staging memory is allocated there.
	Node   int
	dev    cuda.Device
	ctx    cuda.Context
	stream cuda.Stream
	once   sync.Once
}

// OpenCUDA retains device ordinal's primary context and creates its copy
// stream. Without a driver or device it returns an error wrapping
// cuda.ErrNoDriver or cuda.ErrNoDevice.
func OpenCUDA(ordinal int) (*CUDA, error) {
	d, ctx, err := cuda.RetainPrimary(ordinal)
	if err != nil {
		return nil, err
	}
	g := &CUDA{Ordinal: ordinal, dev: d, ctx: ctx}
	g.Name, _ = d.Name()
	g.Node = -1
	dom, e1 := d.Attribute(cuda.AttrPCIDomainID)
	bus, e2 := d.Attribute(cuda.AttrPCIBusID)
	dev, e3 := d.Attribute(cuda.AttrPCIDeviceID)
	if e1 == nil && e2 == nil && e3 == nil {
		g.Node = numaNodeOf(dom, bus, dev)
	}
	err = ctx.Do(func() error {
		s, err := cuda.StreamCreate(cuda.StreamNonBlocking)
		g.stream = s
		return err
	})
	if err != nil {
		_ = d.PrimaryCtxRelease()
		return nil, err
	}
	return g, nil
}

// Close destroys the stream and releases the context.
func (g *CUDA) Close() error {
	var err error
	g.once.Do(func() {
		err = g.ctx.Do(func() error {
			return errors.Join(g.stream.Synchronize(), g.stream.Destroy())
		})
		err = errors.Join(err, g.dev.PrimaryCtxRelease())
	})
	return err
}

// Do runs fn with the device's context current on a locked OS thread.
func (g *CUDA) Do(fn func() error) error { return g.ctx.Do(fn) }

// Stream is the device's copy stream.
func (g *CUDA) Stream() cuda.Stream { return g.stream }

// CopyH2D implements Device.
func (g *CUDA) CopyH2D(dst uint64, src []byte) error {
	return g.ctx.Do(func() error { return cuda.MemcpyHtoDAsync(cuda.DevicePtr(dst), src, g.stream) })
}

// CopyD2H implements Device.
func (g *CUDA) CopyD2H(dst []byte, src uint64) error {
	return g.ctx.Do(func() error { return cuda.MemcpyDtoHAsync(dst, cuda.DevicePtr(src), g.stream) })
}

// Bind implements Binder: fn runs on one locked OS thread with the context
// current, and q's copies call the driver directly.
func (g *CUDA) Bind(fn func(q Device) error) error {
	return g.ctx.Do(func() error { return fn(boundCUDA{g}) })
}

// boundCUDA is the device inside Bind: copies without making the context
// current again (the other methods are the device's own).
type boundCUDA struct{ *CUDA }

func (b boundCUDA) CopyH2D(dst uint64, src []byte) error {
	return cuda.MemcpyHtoDAsync(cuda.DevicePtr(dst), src, b.stream)
}

func (b boundCUDA) CopyD2H(dst []byte, src uint64) error {
	return cuda.MemcpyDtoHAsync(dst, cuda.DevicePtr(src), b.stream)
}

func (b boundCUDA) CopyH2D2D(dst uint64, dstPitch int, src []byte, srcPitch, width, rows int) error {
	return cuda.Memcpy2DHtoDAsync(cuda.DevicePtr(dst), dstPitch, src, srcPitch, width, rows, b.stream)
}

func (b boundCUDA) CopyD2H2D(dst []byte, dstPitch int, src uint64, srcPitch, width, rows int) error {
	return cuda.Memcpy2DDtoHAsync(dst, dstPitch, cuda.DevicePtr(src), srcPitch, width, rows, b.stream)
}

func (b boundCUDA) CopyH2DBatch(dsts []uint64, srcs [][]byte) error {
	return cuda.MemcpyBatchHtoDAsync(devPtrs(dsts), srcs, nil, b.stream)
}

// devPtrs views device addresses as cuda.DevicePtr (the same 64 bits).
func devPtrs(a []uint64) []cuda.DevicePtr {
	if len(a) == 0 {
		return nil
	}
	return unsafe.Slice((*cuda.DevicePtr)(unsafe.Pointer(&a[0])), len(a))
}

// CanBatch implements Batcher: the driver has cuMemcpyBatchAsync.
func (g *CUDA) CanBatch() bool { return cuda.HasBatch() }

// CopyH2DBatch implements Batcher.
func (g *CUDA) CopyH2DBatch(dsts []uint64, srcs [][]byte) error {
	return g.ctx.Do(func() error { return cuda.MemcpyBatchHtoDAsync(devPtrs(dsts), srcs, nil, g.stream) })
}

// Can2D implements Copier2D: the driver has cuMemcpy2DAsync.
func (g *CUDA) Can2D() bool { return cuda.Has2D() }

// CopyH2D2D implements Copier2D.
func (g *CUDA) CopyH2D2D(dst uint64, dstPitch int, src []byte, srcPitch, width, rows int) error {
	return g.ctx.Do(func() error {
		return cuda.Memcpy2DHtoDAsync(cuda.DevicePtr(dst), dstPitch, src, srcPitch, width, rows, g.stream)
	})
}

// CopyD2H2D implements Copier2D.
func (g *CUDA) CopyD2H2D(dst []byte, dstPitch int, src uint64, srcPitch, width, rows int) error {
	return g.ctx.Do(func() error {
		return cuda.Memcpy2DDtoHAsync(dst, dstPitch, cuda.DevicePtr(src), srcPitch, width, rows, g.stream)
	})
}

// Synchronize implements Device.
func (g *CUDA) Synchronize() error {
	return g.ctx.Do(g.stream.Synchronize)
}

// AllocHost implements Device: portable pinned memory, on the GPU's NUMA
// node where the machine has several.
func (g *CUDA) AllocHost(n int) ([]byte, func() error, error) {
	var mem []byte
	err := g.ctx.Do(func() error {
		return onNode(g.Node, func() error {
			var err error
			mem, err = cuda.MemHostAlloc(n, cuda.MemHostAllocPortable)
			return err
		})
	})
	if err != nil {
		return nil, nil, err
	}
	return mem, func() error { return g.ctx.Do(func() error { return cuda.MemFreeHost(mem) }) }, nil
}

// NewEvent implements Device (timing disabled: cheapest to record).
func (g *CUDA) NewEvent() (Event, error) {
	var ev cuda.Event
	err := g.ctx.Do(func() error {
		var err error
		ev, err = cuda.EventCreate(cuda.EventDisableTiming)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &cudaEvent{g: g, ev: ev}, nil
}

type cudaEvent struct {
	g  *CUDA
	ev cuda.Event
}

func (e *cudaEvent) Record() error {
	return e.g.ctx.Do(func() error { return e.ev.Record(e.g.stream) })
}

func (e *cudaEvent) Query() (done bool, err error) {
	err = e.g.ctx.Do(func() error {
		var qerr error
		done, qerr = e.ev.Done()
		return qerr
	})
	return done, err
}

func (e *cudaEvent) Wait() error {
	return e.g.ctx.Do(e.ev.Synchronize)
}

func (e *cudaEvent) Destroy() error { return e.g.ctx.Do(e.ev.Destroy) }

// IPCMemory is another process's allocation opened in this one.
type IPCMemory struct {
	g    *CUDA
	Base uint64 // where the allocation is mapped here
	Size int    // the whole allocation's size
	once sync.Once
}

// OpenIPC opens an exported allocation (a raw CUipcMemHandle) on this
// device. The handle names the whole allocation from its base.
func (g *CUDA) OpenIPC(h [64]byte) (*IPCMemory, error) {
	m := &IPCMemory{g: g}
	err := g.ctx.Do(func() error {
		p, err := cuda.IpcOpenMemHandle(cuda.IpcMemHandle{Reserved: h}, cuda.IpcMemLazyEnablePeerAccess)
		if err != nil {
			return err
		}
		base, size, err := cuda.MemGetAddressRange(p)
		if err != nil {
			_ = cuda.IpcCloseMemHandle(p)
			return err
		}
		if base != p {
			_ = cuda.IpcCloseMemHandle(p)
			return fmt.Errorf("gpu: opened handle maps at %#x inside an allocation at %#x", p, base)
		}
		m.Base, m.Size = uint64(p), size
		return nil
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Close waits for the device's queued copies (which may touch the
// allocation) and unmaps it.
func (m *IPCMemory) Close() error {
	var err error
	m.once.Do(func() {
		err = m.g.ctx.Do(func() error {
			return errors.Join(m.g.stream.Synchronize(), cuda.IpcCloseMemHandle(cuda.DevicePtr(m.Base)))
		})
	})
	return err
}

var (
	_ Device   = (*CUDA)(nil)
	_ Copier2D = (*CUDA)(nil)
	_ Binder   = (*CUDA)(nil)
	_ Copier2D = boundCUDA{}
)
