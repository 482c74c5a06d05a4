// Package cuda is kvfs's binding of the CUDA driver API (libcuda.so.1),
// loaded with purego: no cgo, no CUDA headers at build time, and nothing
// happens until a GPU function is first called.
//
// Load (called by every function here) dlopens libcuda.so.1 once, resolves
// the versioned driver symbols (cuMemAlloc_v2, cuIpcOpenMemHandle_v2, ...:
// the names cuda.h maps the API's calls to, listed in driver.go) and calls
// cuInit. Without a driver it returns
// ErrNoDriver, without a device ErrNoDevice; the result is remembered, so a
// machine without a GPU pays one failed dlopen and every GPU request gets
// the same clear error while nothing else in the daemon changes.
//
// The driver's current context is per OS thread. Context.Do locks the
// calling goroutine to its thread, makes the context current, runs the
// function and unlocks: every call that needs a context goes through it.
// Stream, event, memory and module calls take the context implicitly (the
// current one), as in the C API.
//
// Builds tagged kvfs_nocuda (the static binaries of the emulated-NVMe rig,
// which boot without a dynamic loader) leave purego out; Load then returns
// ErrNoDriver.
//
// Errors: a failing driver call returns *Error (operation, CUresult and the
// driver's name for it); errors.Is(err, ErrNotReady) etc. match by code.
package cuda
