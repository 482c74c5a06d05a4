package storetest

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/store"
)

// Fault is what an injector does to one request.
type Fault int

// Faults.
const (
	None       Fault = iota
	EIO              // fail with EIO, transfer nothing
	ShortRead        // read only the first half, then report an error
	ShortWrite       // write only the first half, then report an error
	TornWrite        // write a random-looking half (every other sector), report EIO
	SyncFail         // (for Sync) fail with EIO
)

// Injector decides the fault for the n-th request (0-based) of the engine.
type Injector func(n int, r store.IO) Fault

// Faulty wraps an engine and injects faults into its requests.
type Faulty struct {
	store.Engine
	mu     sync.Mutex
	n      int
	inject Injector
	syncFn func() bool
}

// NewFaulty wraps e. inject may be nil (no faults); failSync, when set and
// returning true, makes that Sync fail.
func NewFaulty(e store.Engine, inject Injector, failSync func() bool) *Faulty {
	return &Faulty{Engine: e, inject: inject, syncFn: failSync}
}

// SetInjector replaces the injector.
func (f *Faulty) SetInjector(inj Injector) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inject = inj
}

// Do implements store.Engine.
func (f *Faulty) Do(ios []store.IO) error {
	f.mu.Lock()
	faults := make([]Fault, len(ios))
	for i := range ios {
		if f.inject != nil {
			faults[i] = f.inject(f.n, ios[i])
		}
		f.n++
	}
	f.mu.Unlock()
	var pass []store.IO
	var idx []int
	for i, r := range ios {
		half := len(r.Buf) / 2 / max(f.Align(), 1) * max(f.Align(), 1)
		switch faults[i] {
		case None:
			pass = append(pass, r)
			idx = append(idx, i)
		case EIO:
			ios[i].Err = fmt.Errorf("storetest: injected: %w", unix.EIO)
		case ShortRead, ShortWrite:
			if half > 0 {
				part := []store.IO{{Op: r.Op, Off: r.Off, Buf: r.Buf[:half], Stream: r.Stream}}
				if err := f.Engine.Do(part); err != nil {
					return err
				}
			}
			ios[i].Err = fmt.Errorf("storetest: injected short %s (%d of %d bytes): %w", r.Op, half, len(r.Buf), unix.EIO)
		case TornWrite:
			a := max(f.Align(), 512)
			var part []store.IO
			for o := 0; o+a <= len(r.Buf); o += 2 * a {
				part = append(part, store.IO{Op: r.Op, Off: r.Off + int64(o), Buf: r.Buf[o : o+a], Stream: r.Stream})
			}
			if err := f.Engine.Do(part); err != nil {
				return err
			}
			ios[i].Err = fmt.Errorf("storetest: injected torn write: %w", unix.EIO)
		}
	}
	if len(pass) > 0 {
		if err := f.Engine.Do(pass); err != nil {
			return err
		}
		for j, i := range idx {
			ios[i].Err = pass[j].Err
		}
	}
	return nil
}

// Sync implements store.Engine.
func (f *Faulty) Sync() error {
	if f.syncFn != nil && f.syncFn() {
		return fmt.Errorf("storetest: injected sync failure: %w", unix.EIO)
	}
	return f.Engine.Sync()
}
