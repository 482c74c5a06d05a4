package crc32c

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/kvfs/kvfs/gpu/cuda"
)

// ErrClosed is returned by a Module's methods after Close.
var ErrClosed = errors.New("crc32c: module closed")

// attrMultiprocessorCount is CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT.
const attrMultiprocessorCount = 16

const threadsPerBlock = warpsPerBlock * lanes

// Module is the CRC32C kernels loaded into one device's primary context,
// with their tables in device memory. Its methods are safe for concurrent
// use.
type Module struct {
	dev    cuda.Device
	ctx    cuda.Context
	mod    cuda.Module
	sum    cuda.Function
	verify cuda.Function
	zero   cuda.Function
	land   cuda.Function
	tab    cuda.DevicePtr
	sms    int

	mu     sync.Mutex
	closed bool
}

// Load retains device ordinal's primary context, loads PTX into it and
// fills the tables (kvfs_crc32c_init, once). Without a driver or device it
// returns the error of package cuda (errors.Is cuda.ErrNoDriver or
// cuda.ErrNoDevice).
func Load(ordinal int) (*Module, error) {
	d, ctx, err := cuda.RetainPrimary(ordinal)
	if err != nil {
		return nil, err
	}
	m := &Module{dev: d, ctx: ctx}
	if m.sms, err = d.Attribute(attrMultiprocessorCount); err != nil || m.sms <= 0 {
		m.sms = 16
	}
	err = ctx.Do(func() error {
		var err error
		if m.mod, err = cuda.ModuleLoadData(PTX); err != nil {
			return fmt.Errorf("crc32c: load module: %w", err)
		}
		fns := map[string]*cuda.Function{kernelSum: &m.sum, kernelVerify: &m.verify, kernelZero: &m.zero, kernelLand: &m.land}
		for name, f := range fns {
			if *f, err = m.mod.Function(name); err != nil {
				return fmt.Errorf("crc32c: %s: %w", name, err)
			}
		}
		initFn, err := m.mod.Function(kernelInit)
		if err != nil {
			return fmt.Errorf("crc32c: %s: %w", kernelInit, err)
		}
		if m.tab, err = cuda.MemAlloc(tabWords * 4); err != nil {
			return fmt.Errorf("crc32c: tables: %w", err)
		}
		tab := m.tab
		if err := cuda.LaunchKernel(initFn, cuda.Dim3{X: 1}, cuda.Dim3{X: 1024}, 0, 0, unsafe.Pointer(&tab)); err != nil {
			return fmt.Errorf("crc32c: %s: %w", kernelInit, err)
		}
		if err := cuda.CtxSynchronize(); err != nil {
			return fmt.Errorf("crc32c: %s: %w", kernelInit, err)
		}
		return nil
	})
	if err != nil {
		m.release()
		return nil, err
	}
	return m, nil
}

// release frees what Load got, ignoring errors (Load's failure path).
func (m *Module) release() {
	_ = m.ctx.Do(func() error {
		if m.tab != 0 {
			_ = cuda.MemFree(m.tab)
		}
		if m.mod != 0 {
			_ = m.mod.Unload()
		}
		return nil
	})
	_ = m.dev.PrimaryCtxRelease()
}

// Close unloads the module, frees its tables and releases the context. Work
// still queued must have completed (synchronize its stream first).
func (m *Module) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	err := m.ctx.Do(func() error {
		return errors.Join(cuda.MemFree(m.tab), m.mod.Unload())
	})
	return errors.Join(err, m.dev.PrimaryCtxRelease())
}

// Context is the context the module is loaded in; the Async methods expect
// it current (cuda.Context.Do).
func (m *Module) Context() cuda.Context { return m.ctx }

// grid is the launch grid for n groups: a warp a group, at most 8 blocks a
// multiprocessor (the kernels stride over the rest).
func (m *Module) grid(n int) cuda.Dim3 {
	blocks := (n + warpsPerBlock - 1) / warpsPerBlock
	return cuda.Dim3{X: uint32(max(1, min(blocks, 8*m.sms)))}
}

func (m *Module) launch(name string, f cuda.Function, n int, s cuda.Stream, args ...unsafe.Pointer) error {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if n < 0 || n > math.MaxUint32 {
		return fmt.Errorf("crc32c: %d groups", n)
	}
	if n == 0 {
		return nil
	}
	if err := cuda.LaunchKernel(f, m.grid(n), cuda.Dim3{X: threadsPerBlock}, 0, s, args...); err != nil {
		return fmt.Errorf("crc32c: %s: %w", name, err)
	}
	return nil
}

// SumAsync queues kvfs_crc32c on s: for each of the n groups described at
// desc (GroupSize bytes each, AppendGroups' encoding, in device memory),
// got[i] (n uint32 in device memory) becomes its CRC32C. The caller must
// have the module's context current, and must have checked the groups
// (Group.Check) and that they lie in memory the device may read.
func (m *Module) SumAsync(s cuda.Stream, desc cuda.DevicePtr, n int, got cuda.DevicePtr) error {
	tab, nn := m.tab, uint32(n)
	return m.launch(kernelSum, m.sum, n, s, unsafe.Pointer(&tab), unsafe.Pointer(&desc), unsafe.Pointer(&nn), unsafe.Pointer(&got))
}

// VerifyAsync queues kvfs_crc32c_verify on s: as SumAsync, and each group
// whose CRC differs from want[i] (n uint32 in device memory) is zeroed in
// place. The caller learns which failed by comparing got with want.
func (m *Module) VerifyAsync(s cuda.Stream, desc cuda.DevicePtr, n int, want, got cuda.DevicePtr) error {
	tab, nn := m.tab, uint32(n)
	return m.launch(kernelVerify, m.verify, n, s, unsafe.Pointer(&tab), unsafe.Pointer(&desc), unsafe.Pointer(&nn), unsafe.Pointer(&want), unsafe.Pointer(&got))
}

// LandAsync queues kvfs_crc32c_land on s: each group src[i] (descriptors
// in memory the device reads) is checked against want[i] and copied to
// dst[i], or zeros are written there when it differs; got[i] becomes its
// CRC32C. The caller has the module's context current and has checked the
// groups (src[i] and dst[i] of the same shape, disjoint).
func (m *Module) LandAsync(s cuda.Stream, src, dst cuda.DevicePtr, n int, want, got cuda.DevicePtr) error {
	tab, nn := m.tab, uint32(n)
	return m.launch(kernelLand, m.land, n, s, unsafe.Pointer(&tab), unsafe.Pointer(&src), unsafe.Pointer(&dst), unsafe.Pointer(&nn),
		unsafe.Pointer(&want), unsafe.Pointer(&got))
}

// ZeroAsync queues kvfs_zero_groups on s: each group i with mask[i] != 0
// (n uint32 in device memory) is zeroed.
func (m *Module) ZeroAsync(s cuda.Stream, desc cuda.DevicePtr, n int, mask cuda.DevicePtr) error {
	nn := uint32(n)
	return m.launch(kernelZero, m.zero, n, s, unsafe.Pointer(&desc), unsafe.Pointer(&nn), unsafe.Pointer(&mask))
}

// scratch is device memory for one synchronous call: the descriptors and
// two uint32 arrays.
type scratch struct {
	desc, a, b cuda.DevicePtr
}

func (m *Module) withScratch(groups []Group, a, b []uint32, fn func(sc scratch) error) error {
	for i, g := range groups {
		if err := g.Check(); err != nil {
			return fmt.Errorf("crc32c: group %d: %w", i, err)
		}
	}
	if len(groups) == 0 {
		return nil
	}
	return m.ctx.Do(func() error {
		n := len(groups)
		buf, err := cuda.MemAlloc(n*GroupSize + 2*n*4 + 16)
		if err != nil {
			return fmt.Errorf("crc32c: scratch: %w", err)
		}
		defer cuda.MemFree(buf)
		sc := scratch{desc: buf, a: buf + cuda.DevicePtr(n*GroupSize), b: buf + cuda.DevicePtr(n*GroupSize+n*4)}
		if err := cuda.MemcpyHtoD(sc.desc, AppendGroups(make([]byte, 0, n*GroupSize), groups)); err != nil {
			return fmt.Errorf("crc32c: %w", err)
		}
		if a != nil {
			if err := cuda.MemcpyHtoD(sc.a, u32bytes(a)); err != nil {
				return fmt.Errorf("crc32c: %w", err)
			}
		}
		if err := fn(sc); err != nil {
			return err
		}
		if b != nil {
			out := make([]byte, 4*n)
			if err := cuda.MemcpyDtoH(out, sc.b); err != nil {
				return fmt.Errorf("crc32c: %w", err)
			}
			for i := range b {
				b[i] = binary.LittleEndian.Uint32(out[4*i:])
			}
		}
		if err := cuda.CtxSynchronize(); err != nil {
			return fmt.Errorf("crc32c: %w", err)
		}
		return nil
	})
}

func u32bytes(v []uint32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	return b
}

// Sum returns the CRC32C of each group (device addresses), computed on the
// GPU, and waits for it. A group that fails Check is an error wrapping
// ErrGroup and nothing is launched.
func (m *Module) Sum(groups []Group) ([]uint32, error) {
	got := make([]uint32, len(groups))
	err := m.withScratch(groups, nil, got, func(sc scratch) error {
		return m.SumAsync(0, sc.desc, len(groups), sc.b)
	})
	return got, err
}

// Verify checks each group against want[i] on the GPU, zeroes those that
// differ, and returns their indexes (ascending) with the CRCs the GPU
// computed.
func (m *Module) Verify(groups []Group, want []uint32) (bad []int, got []uint32, err error) {
	if len(want) != len(groups) {
		return nil, nil, fmt.Errorf("crc32c: %d groups, %d checksums", len(groups), len(want))
	}
	got = make([]uint32, len(groups))
	err = m.withScratch(groups, want, got, func(sc scratch) error {
		return m.VerifyAsync(0, sc.desc, len(groups), sc.a, sc.b)
	})
	if err != nil {
		return nil, nil, err
	}
	for i := range got {
		if got[i] != want[i] {
			bad = append(bad, i)
		}
	}
	return bad, got, nil
}

// Zero zeroes the groups on the GPU and waits for it.
func (m *Module) Zero(groups []Group) error {
	mask := make([]uint32, len(groups))
	for i := range mask {
		mask[i] = 1
	}
	return m.withScratch(groups, mask, nil, func(sc scratch) error {
		return m.ZeroAsync(0, sc.desc, len(groups), sc.a)
	})
}
