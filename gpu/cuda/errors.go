package cuda

import (
	"errors"
	"fmt"
)

// Result is a CUresult.
type Result int32

// CUresult values the rest of kvfs looks at.
const (
	Success                          Result = 0
	ErrorInvalidValue                Result = 1
	ErrorOutOfMemory                 Result = 2
	ErrorNotInit                     Result = 3
	ErrorNoDevice                    Result = 100
	ErrorInvalidDevice               Result = 101
	ErrorInvalidHandle               Result = 400
	ErrorNotFound                    Result = 500
	ErrorNotReady                    Result = 600
	ErrorAlreadyMapped               Result = 208
	ErrorHostMemoryAlreadyRegistered Result = 712
	ErrorNotSupported                Result = 801
)

var (
	// ErrNoDriver: libcuda.so.1 could not be loaded (no NVIDIA driver on this
	// machine, or a build without CUDA support).
	ErrNoDriver = errors.New("cuda: no CUDA driver (libcuda.so.1 not loadable)")
	// ErrNoDevice: the driver loaded but reports no usable device.
	ErrNoDevice = errors.New("cuda: no CUDA device")
	// ErrMissingSymbol: the driver lacks a function this call needs (an old
	// driver).
	ErrMissingSymbol = errors.New("cuda: driver lacks this function")
)

// Error is a failed driver call.
type Error struct {
	Op   string // the driver function, e.g. "cuMemAlloc_v2"
	Code Result
	Name string // the driver's name for Code (cuGetErrorName), if known
}

func (e *Error) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("cuda: %s: %s (%d)", e.Op, e.Name, int32(e.Code))
	}
	return fmt.Sprintf("cuda: %s: error %d", e.Op, int32(e.Code))
}

// Is matches another *Error by code, and ErrNoDevice for the no-device
// codes, so errors.Is(err, &cuda.Error{Code: cuda.ErrorNotReady}) works.
func (e *Error) Is(target error) bool {
	if target == ErrNoDevice {
		return e.Code == ErrorNoDevice || e.Code == ErrorInvalidDevice
	}
	t, ok := target.(*Error)
	return ok && t.Op == "" && t.Code == e.Code
}

// Code returns the CUresult inside err, Success for nil, or -1 when err is
// not a driver error.
func Code(err error) Result {
	if err == nil {
		return Success
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return -1
}
