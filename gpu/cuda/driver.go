package cuda

import (
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"unsafe"
)

// Handles. A zero value is "none".
type (
	// Device is a CUdevice (an ordinal resolved by the driver).
	Device int32
	// Context is a CUcontext.
	Context uintptr
	// Stream is a CUstream; 0 is the legacy default stream.
	Stream uintptr
	// Event is a CUevent.
	Event uintptr
	// DevicePtr is a CUdeviceptr.
	DevicePtr uint64
	// Module is a CUmodule.
	Module uintptr
	// Function is a CUfunction.
	Function uintptr
)

// IpcMemHandle is a CUipcMemHandle: 64 opaque bytes, passed by value.
type IpcMemHandle struct{ Reserved [64]byte }

// Flags (cuda.h).
const (
	MemHostAllocPortable      = 0x1
	MemHostAllocDeviceMap     = 0x2
	MemHostAllocWriteCombined = 0x4

	MemHostRegisterPortable  = 0x1
	MemHostRegisterDeviceMap = 0x2
	MemHostRegisterReadOnly  = 0x8

	StreamNonBlocking = 0x1

	EventBlockingSync  = 0x1
	EventDisableTiming = 0x2

	IpcMemLazyEnablePeerAccess = 0x1

	// Device attributes (CUdevice_attribute).
	AttrPCIBusID      = 33
	AttrPCIDeviceID   = 34
	AttrUnifiedAddr   = 41
	AttrComputeMajor  = 75
	AttrComputeMinor  = 76
	AttrPCIDomainID   = 50
	AttrCanMapHostMem = 19

	// Pointer attributes (CUpointer_attribute).
	PointerAttrContext    = 1
	PointerAttrMemoryType = 2
	PointerAttrDeviceOrd  = 9
)

// The driver's functions, nil until Load binds them.
var drv struct {
	cuInit                    func(flags uint32) Result
	cuDriverGetVersion        func(v *int32) Result
	cuGetErrorName            func(code Result, s **byte) Result
	cuDeviceGetCount          func(n *int32) Result
	cuDeviceGet               func(d *Device, ordinal int32) Result
	cuDeviceGetName           func(name *byte, n int32, d Device) Result
	cuDeviceTotalMem          func(b *uint64, d Device) Result
	cuDeviceGetAttribute      func(v *int32, attr int32, d Device) Result
	cuDevicePrimaryCtxRetain  func(c *Context, d Device) Result
	cuDevicePrimaryCtxRelease func(d Device) Result
	cuCtxSetCurrent           func(c Context) Result
	cuCtxGetCurrent           func(c *Context) Result
	cuCtxSynchronize          func() Result
	cuStreamCreate            func(s *Stream, flags uint32) Result
	cuStreamDestroy           func(s Stream) Result
	cuStreamSynchronize       func(s Stream) Result
	cuStreamQuery             func(s Stream) Result
	cuEventCreate             func(e *Event, flags uint32) Result
	cuEventRecord             func(e Event, s Stream) Result
	cuEventQuery              func(e Event) Result
	cuEventSynchronize        func(e Event) Result
	cuEventDestroy            func(e Event) Result
	cuEventElapsedTime        func(ms *float32, start, end Event) Result
	cuMemAlloc                func(p *DevicePtr, n uintptr) Result
	cuMemFree                 func(p DevicePtr) Result
	cuMemHostAlloc            func(p *unsafe.Pointer, n uintptr, flags uint32) Result
	cuMemFreeHost             func(p unsafe.Pointer) Result
	cuMemHostRegister         func(p unsafe.Pointer, n uintptr, flags uint32) Result
	cuMemHostUnregister       func(p unsafe.Pointer) Result
	cuMemcpyHtoD              func(dst DevicePtr, src unsafe.Pointer, n uintptr) Result
	cuMemcpyDtoH              func(dst unsafe.Pointer, src DevicePtr, n uintptr) Result
	cuMemcpyHtoDAsync         func(dst DevicePtr, src unsafe.Pointer, n uintptr, s Stream) Result
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src DevicePtr, n uintptr, s Stream) Result
	cuMemcpyDtoDAsync         func(dst, src DevicePtr, n uintptr, s Stream) Result
	cuMemcpy2DAsync           func(p unsafe.Pointer, s Stream) Result
	// CUDA 13's cuMemcpyBatchAsync (no failIdx), and 12.8's (with it).
	cuMemcpyBatchAsyncV2  func(dsts, srcs, sizes unsafe.Pointer, count uintptr, attrs, attrsIdxs unsafe.Pointer, numAttrs uintptr, s Stream) Result
	cuMemcpyBatchAsync    func(dsts, srcs, sizes unsafe.Pointer, count uintptr, attrs, attrsIdxs unsafe.Pointer, numAttrs uintptr, failIdx *uintptr, s Stream) Result
	cuMemsetD8            func(dst DevicePtr, v uint8, n uintptr) Result
	cuMemsetD8Async       func(dst DevicePtr, v uint8, n uintptr, s Stream) Result
	cuMemGetAddressRange  func(base *DevicePtr, size *uintptr, p DevicePtr) Result
	cuPointerGetAttribute func(data unsafe.Pointer, attr int32, p DevicePtr) Result
	cuIpcGetMemHandle     func(h *IpcMemHandle, p DevicePtr) Result
	cuIpcOpenMemHandle    func(p *DevicePtr, h IpcMemHandle, flags uint32) Result
	cuIpcCloseMemHandle   func(p DevicePtr) Result
	cuModuleLoadData      func(m *Module, image unsafe.Pointer) Result
	cuModuleGetFunction   func(f *Function, m Module, name *byte) Result
	cuModuleUnload        func(m Module) Result
	cuLaunchKernel        func(f Function, gx, gy, gz, bx, by, bz, shmem uint32, s Stream, params unsafe.Pointer, extra unsafe.Pointer) Result
}

var loadState struct {
	once    sync.Once
	err     error
	version int
}

// Load loads and initialises the driver once; later calls return the first
// call's result. ErrNoDriver: no libcuda.so.1; ErrNoDevice: no device.
func Load() error {
	loadState.once.Do(func() { loadState.err = load() })
	return loadState.err
}

// Available reports whether the driver loaded and has at least one device.
func Available() bool {
	if Load() != nil {
		return false
	}
	n, err := DeviceCount()
	return err == nil && n > 0
}

func load() error {
	lib, err := openDriver()
	if err != nil {
		return err
	}
	type sym struct {
		fptr  any
		names []string // first found wins (versioned name first)
		need  bool
	}
	d := &drv
	syms := []sym{
		{&d.cuInit, []string{"cuInit"}, true},
		{&d.cuDriverGetVersion, []string{"cuDriverGetVersion"}, true},
		{&d.cuGetErrorName, []string{"cuGetErrorName"}, false},
		{&d.cuDeviceGetCount, []string{"cuDeviceGetCount"}, true},
		{&d.cuDeviceGet, []string{"cuDeviceGet"}, true},
		{&d.cuDeviceGetName, []string{"cuDeviceGetName"}, true},
		{&d.cuDeviceTotalMem, []string{"cuDeviceTotalMem_v2"}, true},
		{&d.cuDeviceGetAttribute, []string{"cuDeviceGetAttribute"}, true},
		{&d.cuDevicePrimaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}, true},
		{&d.cuDevicePrimaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}, true},
		{&d.cuCtxSetCurrent, []string{"cuCtxSetCurrent"}, true},
		{&d.cuCtxGetCurrent, []string{"cuCtxGetCurrent"}, true},
		{&d.cuCtxSynchronize, []string{"cuCtxSynchronize"}, true},
		{&d.cuStreamCreate, []string{"cuStreamCreate"}, true},
		{&d.cuStreamDestroy, []string{"cuStreamDestroy_v2", "cuStreamDestroy"}, true},
		{&d.cuStreamSynchronize, []string{"cuStreamSynchronize"}, true},
		{&d.cuStreamQuery, []string{"cuStreamQuery"}, true},
		{&d.cuEventCreate, []string{"cuEventCreate"}, true},
		{&d.cuEventRecord, []string{"cuEventRecord"}, true},
		{&d.cuEventQuery, []string{"cuEventQuery"}, true},
		{&d.cuEventSynchronize, []string{"cuEventSynchronize"}, true},
		{&d.cuEventDestroy, []string{"cuEventDestroy_v2", "cuEventDestroy"}, true},
		{&d.cuEventElapsedTime, []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"}, false},
		{&d.cuMemAlloc, []string{"cuMemAlloc_v2"}, true},
		{&d.cuMemFree, []string{"cuMemFree_v2"}, true},
		{&d.cuMemHostAlloc, []string{"cuMemHostAlloc"}, true},
		{&d.cuMemFreeHost, []string{"cuMemFreeHost"}, true},
		{&d.cuMemHostRegister, []string{"cuMemHostRegister_v2", "cuMemHostRegister"}, true},
		{&d.cuMemHostUnregister, []string{"cuMemHostUnregister"}, true},
		{&d.cuMemcpyHtoD, []string{"cuMemcpyHtoD_v2"}, true},
		{&d.cuMemcpyDtoH, []string{"cuMemcpyDtoH_v2"}, true},
		{&d.cuMemcpyHtoDAsync, []string{"cuMemcpyHtoDAsync_v2"}, true},
		{&d.cuMemcpyDtoHAsync, []string{"cuMemcpyDtoHAsync_v2"}, true},
		{&d.cuMemcpyDtoDAsync, []string{"cuMemcpyDtoDAsync_v2"}, false},
		{&d.cuMemcpy2DAsync, []string{"cuMemcpy2DAsync_v2"}, false},
		{&d.cuMemcpyBatchAsyncV2, []string{"cuMemcpyBatchAsync_v2"}, false},
		{&d.cuMemcpyBatchAsync, []string{"cuMemcpyBatchAsync"}, false},
		{&d.cuMemsetD8, []string{"cuMemsetD8_v2"}, true},
		{&d.cuMemsetD8Async, []string{"cuMemsetD8Async"}, false},
		{&d.cuMemGetAddressRange, []string{"cuMemGetAddressRange_v2"}, true},
		{&d.cuPointerGetAttribute, []string{"cuPointerGetAttribute"}, false},
		{&d.cuIpcGetMemHandle, []string{"cuIpcGetMemHandle"}, false},
		{&d.cuIpcOpenMemHandle, []string{"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"}, false},
		{&d.cuIpcCloseMemHandle, []string{"cuIpcCloseMemHandle"}, false},
		{&d.cuModuleLoadData, []string{"cuModuleLoadData"}, false},
		{&d.cuModuleGetFunction, []string{"cuModuleGetFunction"}, false},
		{&d.cuModuleUnload, []string{"cuModuleUnload"}, false},
		{&d.cuLaunchKernel, []string{"cuLaunchKernel"}, false},
	}
	for _, s := range syms {
		found := false
		for _, n := range s.names {
			if bind(lib, s.fptr, n) {
				found = true
				break
			}
		}
		if !found && s.need {
			return fmt.Errorf("%w: %w: %s", ErrNoDriver, ErrMissingSymbol, s.names[0])
		}
	}
	if r := drv.cuInit(0); r != Success {
		if r == ErrorNoDevice || r == ErrorInvalidDevice {
			return fmt.Errorf("%w: %w", ErrNoDevice, newErr("cuInit", r))
		}
		return newErr("cuInit", r)
	}
	var v int32
	if r := drv.cuDriverGetVersion(&v); r == Success {
		loadState.version = int(v)
	}
	return nil
}

func newErr(op string, r Result) error {
	e := &Error{Op: op, Code: r}
	if drv.cuGetErrorName != nil {
		var s *byte
		if drv.cuGetErrorName(r, &s) == Success && s != nil {
			e.Name = goString(s)
		}
	}
	return e
}

func check(op string, r Result) error {
	if r == Success {
		return nil
	}
	return newErr(op, r)
}

func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

func need(f any, name string) error {
	if err := Load(); err != nil {
		return err
	}
	if missing(f) {
		return fmt.Errorf("%w: %s", ErrMissingSymbol, name)
	}
	return nil
}

// missing reports whether f, a driver function variable, was left unbound:
// a nil func inside an interface is not a nil interface, so f == nil
// would never say so and the call would panic.
func missing(f any) bool {
	if f == nil {
		return true
	}
	v := reflect.ValueOf(f)
	return v.Kind() == reflect.Func && v.IsNil()
}

// DriverVersion is the driver's CUDA version (e.g. 13000 for 13.0).
func DriverVersion() (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	return loadState.version, nil
}

// DeviceCount is the number of CUDA devices.
func DeviceCount() (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var n int32
	if err := check("cuDeviceGetCount", drv.cuDeviceGetCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// GetDevice resolves an ordinal; an ordinal out of range wraps ErrNoDevice.
func GetDevice(ordinal int) (Device, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	n, err := DeviceCount()
	if err != nil {
		return 0, err
	}
	if ordinal < 0 || ordinal >= n {
		return 0, fmt.Errorf("%w: ordinal %d, %d devices", ErrNoDevice, ordinal, n)
	}
	var d Device
	if err := check("cuDeviceGet", drv.cuDeviceGet(&d, int32(ordinal))); err != nil {
		return 0, err
	}
	return d, nil
}

// RetainPrimary resolves ordinal (GetDevice) and retains the device's
// primary context (PrimaryCtxRetain); release it with PrimaryCtxRelease.
func RetainPrimary(ordinal int) (Device, Context, error) {
	d, err := GetDevice(ordinal)
	if err != nil {
		return 0, 0, err
	}
	ctx, err := d.PrimaryCtxRetain()
	if err != nil {
		return 0, 0, err
	}
	return d, ctx, nil
}

// Name is the device's marketing name.
func (d Device) Name() (string, error) {
	if err := Load(); err != nil {
		return "", err
	}
	buf := make([]byte, 256)
	if err := check("cuDeviceGetName", drv.cuDeviceGetName(&buf[0], int32(len(buf)), d)); err != nil {
		return "", err
	}
	return goString(&buf[0]), nil
}

// TotalMem is the device's memory in bytes.
func (d Device) TotalMem() (uint64, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var b uint64
	return b, check("cuDeviceTotalMem_v2", drv.cuDeviceTotalMem(&b, d))
}

// Attribute reads a CUdevice_attribute.
func (d Device) Attribute(attr int32) (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var v int32
	return int(v), check("cuDeviceGetAttribute", drv.cuDeviceGetAttribute(&v, attr, d))
}

// PrimaryCtxRetain retains the device's primary context (shared with every
// other user of the device in this process, e.g. a CUDA runtime).
func (d Device) PrimaryCtxRetain() (Context, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var c Context
	return c, check("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(&c, d))
}

// PrimaryCtxRelease releases one retain of the primary context.
func (d Device) PrimaryCtxRelease() error {
	if err := Load(); err != nil {
		return err
	}
	return check("cuDevicePrimaryCtxRelease_v2", drv.cuDevicePrimaryCtxRelease(d))
}

// Do runs fn on the calling goroutine locked to its OS thread with c
// current (the driver's current context is per thread).
func (c Context) Do(fn func() error) error {
	if err := Load(); err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := check("cuCtxSetCurrent", drv.cuCtxSetCurrent(c)); err != nil {
		return err
	}
	return fn()
}

// SetCurrent makes c current on this OS thread; the caller must hold the
// thread (runtime.LockOSThread). Prefer Do.
func (c Context) SetCurrent() error {
	if err := Load(); err != nil {
		return err
	}
	return check("cuCtxSetCurrent", drv.cuCtxSetCurrent(c))
}

// CtxSynchronize waits for all work of the current context.
func CtxSynchronize() error {
	if err := Load(); err != nil {
		return err
	}
	return check("cuCtxSynchronize", drv.cuCtxSynchronize())
}

// StreamCreate creates a stream in the current context.
func StreamCreate(flags uint32) (Stream, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var s Stream
	return s, check("cuStreamCreate", drv.cuStreamCreate(&s, flags))
}

// Destroy destroys the stream (work queued on it still completes).
func (s Stream) Destroy() error { return check("cuStreamDestroy_v2", drv.cuStreamDestroy(s)) }

// Synchronize waits for everything queued on s.
func (s Stream) Synchronize() error {
	return check("cuStreamSynchronize", drv.cuStreamSynchronize(s))
}

// Done reports whether everything queued on s has completed.
func (s Stream) Done() (bool, error) {
	r := drv.cuStreamQuery(s)
	if r == ErrorNotReady {
		return false, nil
	}
	return r == Success, check("cuStreamQuery", r)
}

// EventCreate creates an event in the current context.
func EventCreate(flags uint32) (Event, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var e Event
	return e, check("cuEventCreate", drv.cuEventCreate(&e, flags))
}

// Record records e on s: e completes when everything queued before it has.
func (e Event) Record(s Stream) error { return check("cuEventRecord", drv.cuEventRecord(e, s)) }

// Done reports whether e has completed; an error is the failure of the
// work e waits for (a failed copy), sticky in the context.
func (e Event) Done() (bool, error) {
	r := drv.cuEventQuery(e)
	if r == ErrorNotReady {
		return false, nil
	}
	return r == Success, check("cuEventQuery", r)
}

// Synchronize blocks until e completes.
func (e Event) Synchronize() error {
	return check("cuEventSynchronize", drv.cuEventSynchronize(e))
}

// Destroy destroys the event.
func (e Event) Destroy() error { return check("cuEventDestroy_v2", drv.cuEventDestroy(e)) }

// ElapsedMs is the time between two completed timing events.
func ElapsedMs(start, end Event) (float32, error) {
	if err := need(drv.cuEventElapsedTime, "cuEventElapsedTime"); err != nil {
		return 0, err
	}
	var ms float32
	return ms, check("cuEventElapsedTime", drv.cuEventElapsedTime(&ms, start, end))
}

// MemAlloc allocates n bytes of device memory in the current context.
func MemAlloc(n int) (DevicePtr, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var p DevicePtr
	return p, check("cuMemAlloc_v2", drv.cuMemAlloc(&p, uintptr(n)))
}

// MemFree frees device memory from MemAlloc.
func MemFree(p DevicePtr) error { return check("cuMemFree_v2", drv.cuMemFree(p)) }

// MemHostAlloc allocates n bytes of pinned host memory (page-locked, mapped
// for DMA by the device; MemHostAllocPortable: for every context).
func MemHostAlloc(n int, flags uint32) ([]byte, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	if err := check("cuMemHostAlloc", drv.cuMemHostAlloc(&p, uintptr(n), flags)); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// MemFreeHost frees memory from MemHostAlloc.
func MemFreeHost(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return check("cuMemFreeHost", drv.cuMemFreeHost(unsafe.Pointer(&b[0])))
}

// MemHostRegister page-locks b (memory not owned by Go's heap: mmap'd) for
// DMA by the device.
func MemHostRegister(b []byte, flags uint32) error {
	if err := Load(); err != nil {
		return err
	}
	if len(b) == 0 {
		return newErr("cuMemHostRegister_v2", ErrorInvalidValue)
	}
	return check("cuMemHostRegister_v2", drv.cuMemHostRegister(unsafe.Pointer(&b[0]), uintptr(len(b)), flags))
}

// MemHostUnregister undoes MemHostRegister.
func MemHostUnregister(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return check("cuMemHostUnregister", drv.cuMemHostUnregister(unsafe.Pointer(&b[0])))
}

// MemcpyHtoD copies src to dst synchronously.
func MemcpyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return check("cuMemcpyHtoD_v2", drv.cuMemcpyHtoD(dst, unsafe.Pointer(&src[0]), uintptr(len(src))))
}

// MemcpyDtoH copies len(dst) bytes from src synchronously.
func MemcpyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return check("cuMemcpyDtoH_v2", drv.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), src, uintptr(len(dst))))
}

// MemcpyHtoDAsync queues a copy of src (pinned memory, or the copy is
// synchronous) to dst on s. src must stay untouched until the copy is
// known complete (an event recorded after it).
func MemcpyHtoDAsync(dst DevicePtr, src []byte, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	return check("cuMemcpyHtoDAsync_v2", drv.cuMemcpyHtoDAsync(dst, unsafe.Pointer(&src[0]), uintptr(len(src)), s))
}

// MemcpyDtoHAsync queues a copy of len(dst) bytes from src into dst on s.
func MemcpyDtoHAsync(dst []byte, src DevicePtr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	return check("cuMemcpyDtoHAsync_v2", drv.cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), src, uintptr(len(dst)), s))
}

// memcpy2D is CUDA_MEMCPY2D (cuda.h, 128 bytes): host addresses as
// uintptr, so the struct holds no Go pointers.
type memcpy2D struct {
	srcXInBytes, srcY uintptr
	srcMemoryType     uint32
	_                 uint32
	srcHost           uintptr
	srcDevice         DevicePtr
	srcArray          uintptr
	srcPitch          uintptr
	dstXInBytes, dstY uintptr
	dstMemoryType     uint32
	_                 uint32
	dstHost           uintptr
	dstDevice         DevicePtr
	dstArray          uintptr
	dstPitch          uintptr
	widthInBytes      uintptr
	height            uintptr
}

// CUmemorytype.
const (
	memoryTypeHost   = 1
	memoryTypeDevice = 2
)

func need2D() error {
	if err := Load(); err != nil {
		return err
	}
	if drv.cuMemcpy2DAsync == nil {
		return fmt.Errorf("%w: cuMemcpy2DAsync_v2", ErrMissingSymbol)
	}
	return nil
}

// Has2D reports whether the driver has cuMemcpy2DAsync_v2.
func Has2D() bool { return Load() == nil && drv.cuMemcpy2DAsync != nil }

// Memcpy2DHtoDAsync queues a pitched copy of rows rows of width bytes from
// src (row r at r*srcPitch) to dst (row r at dst + r*dstPitch) on s. src
// must hold (rows-1)*srcPitch + width bytes and stay untouched until the
// copy is known complete.
func Memcpy2DHtoDAsync(dst DevicePtr, dstPitch int, src []byte, srcPitch, width, rows int, s Stream) error {
	if err := need2D(); err != nil {
		return err
	}
	if rows <= 0 || width <= 0 {
		return nil
	}
	if width > srcPitch || width > dstPitch || len(src) < (rows-1)*srcPitch+width {
		return fmt.Errorf("cuda: bad 2D copy: %d rows × %d bytes, pitches %d/%d, %d source bytes", rows, width, srcPitch, dstPitch, len(src))
	}
	sc := getScratch()
	sc.m2d = memcpy2D{
		srcMemoryType: memoryTypeHost, srcHost: uintptr(unsafe.Pointer(&src[0])), srcPitch: uintptr(srcPitch),
		dstMemoryType: memoryTypeDevice, dstDevice: dst, dstPitch: uintptr(dstPitch),
		widthInBytes: uintptr(width), height: uintptr(rows),
	}
	err := check("cuMemcpy2DAsync_v2", drv.cuMemcpy2DAsync(unsafe.Pointer(&sc.m2d), s))
	runtime.KeepAlive(src)
	putScratch(sc)
	return err
}

// Memcpy2DDtoHAsync queues a pitched copy from device src into dst.
func Memcpy2DDtoHAsync(dst []byte, dstPitch int, src DevicePtr, srcPitch, width, rows int, s Stream) error {
	if err := need2D(); err != nil {
		return err
	}
	if rows <= 0 || width <= 0 {
		return nil
	}
	if width > srcPitch || width > dstPitch || len(dst) < (rows-1)*dstPitch+width {
		return fmt.Errorf("cuda: bad 2D copy: %d rows × %d bytes, pitches %d/%d, %d destination bytes", rows, width, srcPitch, dstPitch, len(dst))
	}
	sc := getScratch()
	sc.m2d = memcpy2D{
		srcMemoryType: memoryTypeDevice, srcDevice: src, srcPitch: uintptr(srcPitch),
		dstMemoryType: memoryTypeHost, dstHost: uintptr(unsafe.Pointer(&dst[0])), dstPitch: uintptr(dstPitch),
		widthInBytes: uintptr(width), height: uintptr(rows),
	}
	err := check("cuMemcpy2DAsync_v2", drv.cuMemcpy2DAsync(unsafe.Pointer(&sc.m2d), s))
	runtime.KeepAlive(dst)
	putScratch(sc)
	return err
}

// scratch is the memory a copy hands the driver (a CUDA_MEMCPY2D, a
// batch's arrays and attributes). What is passed through purego escapes to
// the heap, and a load queues thousands of copies: allocated per copy, it
// was garbage the collector then scanned the daemon's heap for. Pooled.
type scratch struct {
	m2d   memcpy2D
	addrs []uintptr
	attrs memcpyAttributes
	idx   uintptr
	fail  uintptr
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

func putScratch(sc *scratch) {
	sc.m2d = memcpy2D{}
	clear(sc.addrs) // no stale host address stays reachable as a number
	scratchPool.Put(sc)
}

// memcpyAttributes is CUmemcpyAttributes (cuda.h, 24 bytes): the source
// access order, location hints (ignored for memory that is not managed;
// left zero) and flags.
type memcpyAttributes struct {
	srcAccessOrder uint32
	srcLocHint     [2]int32
	dstLocHint     [2]int32
	flags          uint32
}

// CU_MEMCPY_SRC_ACCESS_ORDER_STREAM: the source is read in stream order,
// as by any other async copy (staging is reused only after its event).
const srcAccessOrderStream = 1

// HasBatch reports whether the driver has cuMemcpyBatchAsync (CUDA ≥ 12.8).
func HasBatch() bool {
	return Load() == nil && (drv.cuMemcpyBatchAsyncV2 != nil || drv.cuMemcpyBatchAsync != nil)
}

// MemcpyBatchHtoDAsync queues len(dsts) copies, srcs[i] to dsts[i], with
// one call (cuMemcpyBatchAsync): the batch runs in stream order, its
// copies in any order among themselves, so their destinations must not
// overlap. Every source must stay untouched until the copies are known
// complete. On an error none of them may be taken as queued: copy again.
// addrs is scratch of at least 3*len(dsts) words (nil: pooled).
func MemcpyBatchHtoDAsync(dsts []DevicePtr, srcs [][]byte, addrs []uintptr, s Stream) error {
	if err := Load(); err != nil {
		return err
	}
	if drv.cuMemcpyBatchAsyncV2 == nil && drv.cuMemcpyBatchAsync == nil {
		return fmt.Errorf("%w: cuMemcpyBatchAsync", ErrMissingSymbol)
	}
	n := len(dsts)
	if len(srcs) != n {
		return fmt.Errorf("cuda: batch of %d destinations and %d sources", n, len(srcs))
	}
	if n == 0 {
		return nil
	}
	sc := getScratch()
	defer putScratch(sc)
	if len(addrs) < 3*n {
		if cap(sc.addrs) < 3*n {
			sc.addrs = make([]uintptr, 3*n)
		}
		addrs = sc.addrs[:3*n]
	}
	d, src, sz := addrs[:n], addrs[n:2*n], addrs[2*n:3*n]
	for i := range n {
		if len(srcs[i]) == 0 {
			return fmt.Errorf("cuda: empty copy %d in a batch", i)
		}
		d[i], src[i], sz[i] = uintptr(dsts[i]), uintptr(unsafe.Pointer(&srcs[i][0])), uintptr(len(srcs[i]))
	}
	sc.attrs, sc.idx, sc.fail = memcpyAttributes{srcAccessOrder: srcAccessOrderStream}, 0, ^uintptr(0)
	var r Result
	if drv.cuMemcpyBatchAsyncV2 != nil {
		r = drv.cuMemcpyBatchAsyncV2(unsafe.Pointer(&d[0]), unsafe.Pointer(&src[0]), unsafe.Pointer(&sz[0]), uintptr(n),
			unsafe.Pointer(&sc.attrs), unsafe.Pointer(&sc.idx), 1, s)
	} else {
		r = drv.cuMemcpyBatchAsync(unsafe.Pointer(&d[0]), unsafe.Pointer(&src[0]), unsafe.Pointer(&sz[0]), uintptr(n),
			unsafe.Pointer(&sc.attrs), unsafe.Pointer(&sc.idx), 1, &sc.fail, s)
	}
	runtime.KeepAlive(srcs)
	return check("cuMemcpyBatchAsync", r)
}

// MemcpyDtoDAsync queues a device-to-device copy on s.
func MemcpyDtoDAsync(dst, src DevicePtr, n int, s Stream) error {
	if err := need(drv.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"); err != nil {
		return err
	}
	return check("cuMemcpyDtoDAsync_v2", drv.cuMemcpyDtoDAsync(dst, src, uintptr(n), s))
}

// MemsetD8 sets n bytes at dst to v (synchronous to the host for pageable
// semantics; see the CUDA docs).
func MemsetD8(dst DevicePtr, v byte, n int) error {
	return check("cuMemsetD8_v2", drv.cuMemsetD8(dst, v, uintptr(n)))
}

// MemsetD8Async queues setting n bytes at dst to v on s.
func MemsetD8Async(dst DevicePtr, v byte, n int, s Stream) error {
	if err := need(drv.cuMemsetD8Async, "cuMemsetD8Async"); err != nil {
		return err
	}
	return check("cuMemsetD8Async", drv.cuMemsetD8Async(dst, v, uintptr(n), s))
}

// MemGetAddressRange returns the base and size of the allocation holding p.
func MemGetAddressRange(p DevicePtr) (DevicePtr, int, error) {
	if err := Load(); err != nil {
		return 0, 0, err
	}
	var base DevicePtr
	var size uintptr
	if err := check("cuMemGetAddressRange_v2", drv.cuMemGetAddressRange(&base, &size, p)); err != nil {
		return 0, 0, err
	}
	return base, int(size), nil
}

// PointerDeviceOrdinal is the ordinal of the device p lives on.
func PointerDeviceOrdinal(p DevicePtr) (int, error) {
	if err := need(drv.cuPointerGetAttribute, "cuPointerGetAttribute"); err != nil {
		return 0, err
	}
	var v int32
	err := check("cuPointerGetAttribute", drv.cuPointerGetAttribute(unsafe.Pointer(&v), PointerAttrDeviceOrd, p))
	return int(v), err
}

// IpcGetMemHandle exports the allocation holding p (the handle names the
// whole allocation, from its base).
func IpcGetMemHandle(p DevicePtr) (IpcMemHandle, error) {
	var h IpcMemHandle
	if err := need(drv.cuIpcGetMemHandle, "cuIpcGetMemHandle"); err != nil {
		return h, err
	}
	return h, check("cuIpcGetMemHandle", drv.cuIpcGetMemHandle(&h, p))
}

// IpcOpenMemHandle maps another process's exported allocation into the
// current context; the result is the allocation's base. The exporting
// process itself cannot open its own handle.
func IpcOpenMemHandle(h IpcMemHandle, flags uint32) (DevicePtr, error) {
	if err := need(drv.cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2"); err != nil {
		return 0, err
	}
	var p DevicePtr
	return p, check("cuIpcOpenMemHandle_v2", drv.cuIpcOpenMemHandle(&p, h, flags))
}

// IpcCloseMemHandle unmaps memory from IpcOpenMemHandle.
func IpcCloseMemHandle(p DevicePtr) error {
	if err := need(drv.cuIpcCloseMemHandle, "cuIpcCloseMemHandle"); err != nil {
		return err
	}
	return check("cuIpcCloseMemHandle", drv.cuIpcCloseMemHandle(p))
}

// ModuleLoadData loads a module (PTX text, NUL-terminated here, or a cubin/
// fatbin image) into the current context.
func ModuleLoadData(image []byte) (Module, error) {
	if err := need(drv.cuModuleLoadData, "cuModuleLoadData"); err != nil {
		return 0, err
	}
	if len(image) == 0 {
		return 0, newErr("cuModuleLoadData", ErrorInvalidValue)
	}
	img := image
	if img[len(img)-1] != 0 {
		img = append(append(make([]byte, 0, len(image)+1), image...), 0)
	}
	var m Module
	err := check("cuModuleLoadData", drv.cuModuleLoadData(&m, unsafe.Pointer(&img[0])))
	runtime.KeepAlive(img)
	return m, err
}

// Function looks up a kernel by its (mangled or extern "C") name.
func (m Module) Function(name string) (Function, error) {
	if err := need(drv.cuModuleGetFunction, "cuModuleGetFunction"); err != nil {
		return 0, err
	}
	cname := append([]byte(name), 0)
	var f Function
	return f, check("cuModuleGetFunction", drv.cuModuleGetFunction(&f, m, &cname[0]))
}

// Unload unloads the module.
func (m Module) Unload() error {
	if err := need(drv.cuModuleUnload, "cuModuleUnload"); err != nil {
		return err
	}
	return check("cuModuleUnload", drv.cuModuleUnload(m))
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// LaunchKernel queues f on s. Each element of args points at one kernel
// parameter's value (e.g. &devicePtr, &n), as cuLaunchKernel's kernelParams.
func LaunchKernel(f Function, grid, block Dim3, sharedMem uint32, s Stream, args ...unsafe.Pointer) error {
	if err := need(drv.cuLaunchKernel, "cuLaunchKernel"); err != nil {
		return err
	}
	fix := func(d Dim3) Dim3 {
		if d.Y == 0 {
			d.Y = 1
		}
		if d.Z == 0 {
			d.Z = 1
		}
		return d
	}
	grid, block = fix(grid), fix(block)
	// The parameter array lives outside the Go stack for the call.
	params := make([]unsafe.Pointer, len(args)+1)
	copy(params, args)
	err := check("cuLaunchKernel", drv.cuLaunchKernel(f, grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z, sharedMem, s, unsafe.Pointer(&params[0]), nil))
	runtime.KeepAlive(params)
	runtime.KeepAlive(args)
	return err
}
