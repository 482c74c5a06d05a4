package storetest

import (
	"math/rand/v2"
	"sync"

	"github.com/kvfs/kvfs/store"
)

// Notifying wraps an engine with store.NotifyEngine the way a ring engine
// offers it: DoNotify performs each request on its own goroutine (so
// requests complete in any order, concurrently) and calls done(i) there as
// ios[i] completes.
type Notifying struct {
	store.Engine
	// Calls counts DoNotify calls.
	mu    sync.Mutex
	calls int
}

// NewNotifying wraps e.
func NewNotifying(e store.Engine) *Notifying { return &Notifying{Engine: e} }

// DoNotify implements store.NotifyEngine.
func (n *Notifying) DoNotify(ios []store.IO, done func(i int)) error {
	n.mu.Lock()
	n.calls++
	n.mu.Unlock()
	var wg sync.WaitGroup
	for _, i := range rand.Perm(len(ios)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.Engine.Do(ios[i : i+1]); err != nil && ios[i].Err == nil {
				ios[i].Err = err
			}
			if done != nil {
				done(i)
			}
		}()
	}
	wg.Wait()
	return nil
}

// Calls is the number of DoNotify calls so far.
func (n *Notifying) Calls() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls
}

// VectorReads reports the inner engine's answer (store.VectorReader).
func (n *Notifying) VectorReads() bool {
	v, ok := n.Engine.(store.VectorReader)
	return ok && v.VectorReads()
}

var _ store.NotifyEngine = (*Notifying)(nil)
