// Package par runs work spread over goroutines the way the daemon needs
// when the work touches client memory: the helpers fault as the caller
// would (its debug.SetPanicOnFault setting), and a panic in any of them is
// raised again in the caller only once all have stopped, so nothing
// touches the memory after Run returns.
package par

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// Run runs work on n goroutines, the caller's among them. The others touch
// caller memory as the calling goroutine would: with its panic-on-fault
// setting. A panic in any of them (a fault on a client's mapping cut
// short) is raised again in the caller once every one has stopped.
func Run(n int, work func()) {
	if n <= 1 {
		work()
		return
	}
	onFault := debug.SetPanicOnFault(true)
	debug.SetPanicOnFault(onFault)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var caught any
	run := func() {
		defer func() {
			if r := recover(); r != nil {
				mu.Lock()
				if caught == nil {
					caught = r
				}
				mu.Unlock()
			}
		}()
		work()
	}
	wg.Add(n - 1)
	for range n - 1 {
		go func() {
			defer wg.Done()
			debug.SetPanicOnFault(onFault)
			run()
		}()
	}
	run()
	wg.Wait()
	if caught != nil {
		panic(caught)
	}
}

// Pieces runs do(lo, hi) over [0, n) in pieces of per, on up to workers
// goroutines (the caller's among them) that take the next piece as they
// finish one; as Run, a panic is raised in the caller once all stopped.
func Pieces(n, per, workers int, do func(lo, hi int)) {
	if n <= 0 {
		return
	}
	per = max(1, per)
	pieces := (n + per - 1) / per
	var next atomic.Int64
	Run(min(pieces, workers), func() {
		for {
			p := int(next.Add(1) - 1)
			if p >= pieces {
				return
			}
			do(p*per, min((p+1)*per, n))
		}
	})
}
