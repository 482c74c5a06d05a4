// Package storetest holds engines for testing the store and anything built
// on it: an in-memory engine that simulates crashes (everything not yet made
// durable by Sync can be lost, and writes in flight can tear), and a
// fault-injecting wrapper around any engine.
package storetest

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"

	"github.com/kvfs/kvfs/store"
)

// ErrCrashed is returned by a Mem engine after its crash point.
var ErrCrashed = errors.New("storetest: engine crashed")

// Mem is an in-memory engine. Reads see every write; Sync makes writes
// durable; CrashImage returns what a device might hold after a power cut.
type Mem struct {
	mu      sync.Mutex
	view    []byte
	durable []byte
	pending []write
	align   int
	writes  int
	crashAt int // crash on this write (1-based); 0 never
	crashed bool
	syncs   int
	vec     bool
	// hostView: HostView offers view.
	hostView bool
}

type write struct {
	off  int64
	data []byte
}

var _ store.Engine = (*Mem)(nil)

// NewMem returns a zeroed device of size bytes needing align-byte alignment.
func NewMem(size int64, align int) *Mem {
	return &Mem{view: make([]byte, size), durable: make([]byte, size), align: align}
}

// NewMemFrom returns a device holding image (as if all of it were durable).
func NewMemFrom(image []byte, align int) *Mem {
	return &Mem{view: append([]byte(nil), image...), durable: append([]byte(nil), image...), align: align}
}

// CrashAt makes the engine crash when it receives its k-th write (k ≥ 1,
// counted from now): that write and everything after fail with ErrCrashed.
func (m *Mem) CrashAt(k int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.crashAt = m.writes + k
}

// Crashed reports whether the crash point was reached.
func (m *Mem) Crashed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.crashed
}

// Writes is the number of write requests received so far.
func (m *Mem) Writes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes
}

// SetVectorReads makes the engine take vector reads (IO.Vec), as the posix
// engine does with preadv(2); off by default.
func (m *Mem) SetVectorReads(on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.vec = on
}

// VectorReads implements store.VectorReader.
func (m *Mem) VectorReads() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.vec
}

// HostView implements store.HostViewer when SetHostView turned it on: the
// device's bytes themselves (not a copy), which writes change in place;
// read them only between writes.
func (m *Mem) HostView() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.hostView {
		return nil
	}
	return m.view
}

// SetHostView makes HostView offer the device's bytes (off by default).
func (m *Mem) SetHostView(on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hostView = on
}

func (m *Mem) Name() string { return "mem" }
func (m *Mem) Size() int64  { return int64(len(m.view)) }
func (m *Mem) Align() int   { return m.align }
func (m *Mem) Close() error { return nil }

// Do implements store.Engine.
func (m *Mem) Do(ios []store.IO) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range ios {
		r := &ios[i]
		r.Err = nil
		if m.crashed {
			r.Err = ErrCrashed
			continue
		}
		if r.Vec != nil {
			r.Err = m.readVec(r)
			continue
		}
		if r.Off%int64(m.align) != 0 || len(r.Buf)%m.align != 0 {
			r.Err = fmt.Errorf("storetest: unaligned %s of %d at %d", r.Op, len(r.Buf), r.Off)
			continue
		}
		if r.Off < 0 || r.Off+int64(len(r.Buf)) > int64(len(m.view)) {
			r.Err = fmt.Errorf("storetest: %s at %d+%d: %w", r.Op, r.Off, len(r.Buf), io.ErrUnexpectedEOF)
			continue
		}
		if r.Op == store.OpRead {
			copy(r.Buf, m.view[r.Off:])
			continue
		}
		m.writes++
		if m.crashAt > 0 && m.writes >= m.crashAt {
			m.crashed = true
			// The crashing write may have reached the device in part.
			m.pending = append(m.pending, write{r.Off, append([]byte(nil), r.Buf...)})
			r.Err = ErrCrashed
			continue
		}
		copy(m.view[r.Off:], r.Buf)
		m.pending = append(m.pending, write{r.Off, append([]byte(nil), r.Buf...)})
	}
	return nil
}

func (m *Mem) readVec(r *store.IO) error {
	if !m.vec || r.Op != store.OpRead || r.Buf != nil {
		return fmt.Errorf("storetest: vector %s not accepted", r.Op)
	}
	if r.Off%int64(m.align) != 0 {
		return fmt.Errorf("storetest: unaligned vector read at %d", r.Off)
	}
	n := int64(r.VecLen())
	if r.Off < 0 || r.Off+n > int64(len(m.view)) {
		return fmt.Errorf("storetest: read at %d+%d: %w", r.Off, n, io.ErrUnexpectedEOF)
	}
	off := r.Off
	for _, v := range r.Vec {
		if !store.Aligned(v, m.align) {
			return fmt.Errorf("storetest: unaligned vector segment of %d", len(v))
		}
		off += int64(copy(v, m.view[off:]))
	}
	return nil
}

// Sync implements store.Engine.
func (m *Mem) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return ErrCrashed
	}
	for _, w := range m.pending {
		copy(m.durable[w.off:], w.data)
	}
	m.pending = nil
	m.syncs++
	return nil
}

// Syncs is the number of successful Syncs.
func (m *Mem) Syncs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncs
}

// CrashImage is a possible device content after a power cut now: the
// durable bytes plus a random subset of the writes not yet synced, each of
// which may be torn (only some of its sectors, of size sector, written).
func (m *Mem) CrashImage(rng *rand.Rand, sector int) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	img := append([]byte(nil), m.durable...)
	for _, w := range m.pending {
		switch rng.IntN(3) {
		case 0: // lost
		case 1: // landed
			copy(img[w.off:], w.data)
		case 2: // torn: a random subset of its sectors
			for s := 0; s < len(w.data); s += sector {
				if rng.IntN(2) == 0 {
					copy(img[w.off+int64(s):], w.data[s:min(s+sector, len(w.data))])
				}
			}
		}
	}
	return img
}

// Image is the current content as reads see it.
func (m *Mem) Image() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]byte(nil), m.view...)
}

// Poke overwrites bytes directly (to simulate on-disk corruption).
func (m *Mem) Poke(off int64, b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(m.view[off:], b)
	copy(m.durable[off:], b)
}
