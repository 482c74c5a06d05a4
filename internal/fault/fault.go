// Package fault turns a memory fault inside memory the caller names into an
// error instead of a crash: the one guard of every access to memory another
// party can shrink under the daemon (a client's registered mapping, the
// store's file mapped for writes).
//
// A process that shrinks a file another process mapped makes that
// process's accesses past the new end raise SIGBUS. Guard runs a function
// with debug.SetPanicOnFault, so such a fault becomes a panic on the
// faulting goroutine, and recovers it only when the faulting address is
// one the caller owns: any other fault, and any other panic, propagates
// unchanged. The guard covers the calling goroutine only.
package fault

import (
	"runtime/debug"
	"unsafe"
)

// Guard runs f with memory faults turned into panics. When f faults at an
// address for which mine reports true, Guard returns that address with
// faulted set (and f's work stops where it faulted); otherwise it returns
// f's error. A fault elsewhere, and any other panic, propagates. mine is
// called only after a fault.
func Guard(mine func(addr uintptr) bool, f func() error) (addr uintptr, faulted bool, err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		r := recover()
		if r == nil {
			return
		}
		a, ok := r.(interface{ Addr() uintptr })
		if !ok || !mine(a.Addr()) {
			panic(r)
		}
		addr, faulted, err = a.Addr(), true, nil
	}()
	return 0, false, f()
}

// In reports whether addr lies in mem.
func In(mem []byte, addr uintptr) bool {
	if len(mem) == 0 {
		return false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	return addr >= base && addr-base < uintptr(len(mem))
}
