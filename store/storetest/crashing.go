package storetest

import (
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/kvfs/kvfs/store"
)

// Crashing wraps a real engine (posix, uring, nvme) to simulate a power cut
// on its device: it keeps an undo record of every write not yet made durable
// by Sync, and Crash rolls a random choice of them back (whole or torn by
// sector) on the device itself, so the store can be reopened on the very
// same file with the same engine.
//
// Undo is applied newest first; for writes that overlap within one sync
// window the result is one of the possible device states, not all of them.
type Crashing struct {
	store.Engine
	mu      sync.Mutex
	undo    []undoRec
	writes  int
	crashAt int
	crashed bool
}

type undoRec struct {
	off      int64
	old, new []byte
}

// NewCrashing wraps e.
func NewCrashing(e store.Engine) *Crashing { return &Crashing{Engine: e} }

// CrashAt makes the k-th write from now (k ≥ 1) and everything after it
// fail with ErrCrashed; the k-th write may reach the device in part.
func (c *Crashing) CrashAt(k int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.crashAt = c.writes + k
}

// Crashed reports whether the crash point was reached.
func (c *Crashing) Crashed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.crashed
}

// Writes is the number of write requests seen.
func (c *Crashing) Writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// Do implements store.Engine.
func (c *Crashing) Do(ios []store.IO) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range ios {
		r := &ios[i]
		if c.crashed {
			r.Err = ErrCrashed
			continue
		}
		if r.Op == store.OpRead {
			if err := c.Engine.Do(ios[i : i+1]); err != nil {
				return err
			}
			continue
		}
		c.writes++
		old, err := c.read(r.Off, len(r.Buf))
		if err != nil {
			return err
		}
		rec := undoRec{off: r.Off, old: old, new: append([]byte(nil), r.Buf...)}
		if c.crashAt > 0 && c.writes >= c.crashAt {
			c.crashed = true
			// The interrupted write: written, so Crash may keep, undo or
			// tear it, but reported as failed.
			if err := c.Engine.Do(ios[i : i+1]); err != nil {
				return err
			}
			c.undo = append(c.undo, rec)
			r.Err = ErrCrashed
			continue
		}
		if err := c.Engine.Do(ios[i : i+1]); err != nil {
			return err
		}
		if r.Err == nil {
			c.undo = append(c.undo, rec)
		}
	}
	return nil
}

func (c *Crashing) read(off int64, n int) ([]byte, error) {
	buf, err := store.AllocAligned(n)
	if err != nil {
		return nil, err
	}
	defer store.FreeAligned(buf)
	io := []store.IO{{Op: store.OpRead, Off: off, Buf: buf}}
	if err := c.Engine.Do(io); err != nil {
		return nil, err
	}
	if io[0].Err != nil {
		return nil, fmt.Errorf("storetest: read before write at %d: %w", off, io[0].Err)
	}
	return append([]byte(nil), buf...), nil
}

// Sync implements store.Engine.
func (c *Crashing) Sync() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.crashed {
		return ErrCrashed
	}
	if err := c.Engine.Sync(); err != nil {
		return err
	}
	c.undo = nil
	return nil
}

// Crash simulates the power cut: each write since the last Sync is kept,
// undone, or torn (a random subset of its sector-sized pieces undone). The
// device is then synced; the wrapper stays crashed.
func (c *Crashing) Crash(rng *rand.Rand, sector int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.crashed = true
	for i := len(c.undo) - 1; i >= 0; i-- {
		u := c.undo[i]
		var restore []store.IO
		switch rng.IntN(3) {
		case 0: // never reached the device
			restore = append(restore, store.IO{Op: store.OpWrite, Off: u.off, Buf: u.old})
		case 1: // landed
		case 2: // torn
			for s := 0; s < len(u.old); s += sector {
				if rng.IntN(2) == 0 {
					restore = append(restore, store.IO{Op: store.OpWrite, Off: u.off + int64(s), Buf: u.old[s:min(s+sector, len(u.old))]})
				}
			}
		}
		for _, r := range restore {
			buf, err := store.AllocAligned(len(r.Buf))
			if err != nil {
				return err
			}
			copy(buf, r.Buf)
			r.Buf = buf
			ios := []store.IO{r}
			err = c.Engine.Do(ios)
			store.FreeAligned(buf)
			if err == nil {
				err = ios[0].Err
			}
			if err != nil {
				return fmt.Errorf("storetest: crash rollback at %d: %w", r.Off, err)
			}
		}
	}
	c.undo = nil
	return c.Engine.Sync()
}
