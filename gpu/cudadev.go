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
	lanes  []cudaLane // more copy streams (AddLanes)
	once   sync.Once
	// spin: events made from now on are waited for by spinning on a
	// core (the driver's default), not by sleeping until the GPU's
	// interrupt (cuda.EventBlockingSync). See SetSpinWait.
	spin bool
}

// SetSpinWait chooses how a wait for a staging buffer's copies (Event.Wait)
// spends its time, for the events made after it: spinning on a core until
// they complete (the driver's default for a context on a machine with more
// cores than contexts), or, by default, sleeping until the GPU's interrupt.
// A spinning wait holds a core per waiting caller: with many callers those
// are the cores the store's reads and checksums need.
func (g *CUDA) SetSpinWait(spin bool) { g.spin = spin }

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
			err := errors.Join(g.stream.Synchronize(), g.stream.Destroy())
			for _, l := range g.lanes {
				err = errors.Join(err, l.s.Synchronize(), l.s.Destroy())
			}
			return err
		})
		err = errors.Join(err, g.dev.PrimaryCtxRelease())
	})
	return err
}

// Do runs fn with the device's context current on a locked OS thread.
func (g *CUDA) Do(fn func() error) error { return g.ctx.Do(fn) }

// Stream is the device's copy stream.
func (g *CUDA) Stream() cuda.Stream { return g.stream }

// own is the device on its own stream (lane 0): the copy methods below
// are its.
func (g *CUDA) own() cudaLane { return cudaLane{g, g.stream} }

// CopyH2D implements Device.
func (g *CUDA) CopyH2D(dst uint64, src []byte) error { return g.own().CopyH2D(dst, src) }

// CopyD2H implements Device.
func (g *CUDA) CopyD2H(dst []byte, src uint64) error { return g.own().CopyD2H(dst, src) }

// Bind implements Binder: fn runs on one locked OS thread with the context
// current, and q's copies call the driver directly.
func (g *CUDA) Bind(fn func(q Device) error) error { return g.own().Bind(fn) }

// boundCUDA is the device inside Bind: copies on stream s without making
// the context current again (the other methods are the device's own).
type boundCUDA struct {
	*CUDA
	s cuda.Stream
}

func (b boundCUDA) CopyH2D(dst uint64, src []byte) error {
	return cuda.MemcpyHtoDAsync(cuda.DevicePtr(dst), src, b.s)
}

func (b boundCUDA) CopyD2H(dst []byte, src uint64) error {
	return cuda.MemcpyDtoHAsync(dst, cuda.DevicePtr(src), b.s)
}

func (b boundCUDA) CopyH2D2D(dst uint64, dstPitch int, src []byte, srcPitch, width, rows int) error {
	return cuda.Memcpy2DHtoDAsync(cuda.DevicePtr(dst), dstPitch, src, srcPitch, width, rows, b.s)
}

func (b boundCUDA) CopyD2H2D(dst []byte, dstPitch int, src uint64, srcPitch, width, rows int) error {
	return cuda.Memcpy2DDtoHAsync(dst, dstPitch, cuda.DevicePtr(src), srcPitch, width, rows, b.s)
}

func (b boundCUDA) CopyH2DBatch(dsts []uint64, srcs [][]byte) error {
	return cuda.MemcpyBatchHtoDAsync(devPtrs(dsts), srcs, nil, b.s)
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
	return g.own().CopyH2DBatch(dsts, srcs)
}

// Can2D implements Copier2D: the driver has cuMemcpy2DAsync.
func (g *CUDA) Can2D() bool { return cuda.Has2D() }

// CopyH2D2D implements Copier2D.
func (g *CUDA) CopyH2D2D(dst uint64, dstPitch int, src []byte, srcPitch, width, rows int) error {
	return g.own().CopyH2D2D(dst, dstPitch, src, srcPitch, width, rows)
}

// CopyD2H2D implements Copier2D.
func (g *CUDA) CopyD2H2D(dst []byte, dstPitch int, src uint64, srcPitch, width, rows int) error {
	return g.own().CopyD2H2D(dst, dstPitch, src, srcPitch, width, rows)
}

// Synchronize implements Device.
// With lanes it waits for every stream's work.
func (g *CUDA) Synchronize() error {
	return g.ctx.Do(func() error {
		err := g.stream.Synchronize()
		for _, l := range g.lanes {
			err = errors.Join(err, l.s.Synchronize())
		}
		return err
	})
}

// AddLanes gives the device n copy streams in all (n-1 more than its own),
// for Laner: batches on different lanes queue and run their copies
// independently (several copy engines, no batch's copies behind
// another's). Call it before the device is used.
func (g *CUDA) AddLanes(n int) error {
	return g.ctx.Do(func() error {
		for len(g.lanes)+1 < n {
			st, err := cuda.StreamCreate(cuda.StreamNonBlocking)
			if err != nil {
				return err
			}
			g.lanes = append(g.lanes, cudaLane{CUDA: g, s: st})
		}
		return nil
	})
}

// Lanes implements Laner.
func (g *CUDA) Lanes() int { return 1 + len(g.lanes) }

// Lane implements Laner: lane 0 is the device's own stream.
func (g *CUDA) Lane(i int) Device {
	if k := i % g.Lanes(); k > 0 {
		return g.lanes[k-1]
	}
	return g
}

// RecordOn implements LaneRecorder for the device's own stream.
func (g *CUDA) RecordOn(ev Event) error { return ev.Record() }

// cudaLane is the device on one of its copy streams: its copies, events
// and Synchronize use that stream, each call making the context current
// and then queueing as boundCUDA does; the rest is the device's.
type cudaLane struct {
	*CUDA
	s cuda.Stream
}

func (l cudaLane) do(fn func(b boundCUDA) error) error {
	return l.ctx.Do(func() error { return fn(boundCUDA(l)) })
}

func (l cudaLane) CopyH2D(dst uint64, src []byte) error {
	return l.do(func(b boundCUDA) error { return b.CopyH2D(dst, src) })
}

func (l cudaLane) CopyD2H(dst []byte, src uint64) error {
	return l.do(func(b boundCUDA) error { return b.CopyD2H(dst, src) })
}

func (l cudaLane) Bind(fn func(q Device) error) error {
	return l.do(func(b boundCUDA) error { return fn(b) })
}

func (l cudaLane) CopyH2D2D(dst uint64, dstPitch int, src []byte, srcPitch, width, rows int) error {
	return l.do(func(b boundCUDA) error { return b.CopyH2D2D(dst, dstPitch, src, srcPitch, width, rows) })
}

func (l cudaLane) CopyD2H2D(dst []byte, dstPitch int, src uint64, srcPitch, width, rows int) error {
	return l.do(func(b boundCUDA) error { return b.CopyD2H2D(dst, dstPitch, src, srcPitch, width, rows) })
}

func (l cudaLane) CopyH2DBatch(dsts []uint64, srcs [][]byte) error {
	return l.do(func(b boundCUDA) error { return b.CopyH2DBatch(dsts, srcs) })
}

func (l cudaLane) Synchronize() error { return l.ctx.Do(l.s.Synchronize) }

// RecordOn implements LaneRecorder: ev marks the work queued on the lane.
func (l cudaLane) RecordOn(ev Event) error {
	e, ok := ev.(*cudaEvent)
	if !ok {
		return fmt.Errorf("gpu: event %T is not the device's", ev)
	}
	return l.ctx.Do(func() error { return e.ev.Record(l.s) })
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

// AllocDevice implements DeviceAllocator.
func (g *CUDA) AllocDevice(n int) (uint64, func() error, error) {
	var p cuda.DevicePtr
	if err := g.ctx.Do(func() error {
		var err error
		p, err = cuda.MemAlloc(n)
		return err
	}); err != nil {
		return 0, nil, err
	}
	return uint64(p), func() error { return g.ctx.Do(func() error { return cuda.MemFree(p) }) }, nil
}

// RegisterHost implements HostRegistrar: b (memory mapped from a file, not
// Go's heap) is page-locked for DMA by every device (portable) and only
// read by them (read-only: b may be a read-only mapping). Unregister
// before b is unmapped.
func (g *CUDA) RegisterHost(b []byte) (func() error, error) {
	if err := g.ctx.Do(func() error {
		return cuda.MemHostRegister(b, cuda.MemHostRegisterPortable|cuda.MemHostRegisterReadOnly)
	}); err != nil {
		return nil, err
	}
	return func() error { return g.ctx.Do(func() error { return cuda.MemHostUnregister(b) }) }, nil
}

// NewEvent implements Device (timing disabled: cheapest to record; a
// blocking wait unless SetSpinWait).
func (g *CUDA) NewEvent() (Event, error) {
	var ev cuda.Event
	flags := uint32(cuda.EventDisableTiming)
	if !g.spin {
		flags |= cuda.EventBlockingSync
	}
	err := g.ctx.Do(func() error {
		var err error
		ev, err = cuda.EventCreate(flags)
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
	_ Device          = (*CUDA)(nil)
	_ Copier2D        = (*CUDA)(nil)
	_ Binder          = (*CUDA)(nil)
	_ HostRegistrar   = (*CUDA)(nil)
	_ DeviceAllocator = (*CUDA)(nil)
	_ Copier2D        = boundCUDA{}
)
