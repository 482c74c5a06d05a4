package gpu

import (
	"fmt"
	"sync"
)

// Staging is one pinned host buffer and its event.
type Staging struct {
	Mem []byte
	ev  Event
	id  int
	// busy: the event was recorded after copies that read or write Mem and
	// has not been observed complete; Put refuses the buffer then.
	busy bool
	// c is the chunk of the batch holding the buffer: reset for each
	// batch that takes it, its working slices keep their memory.
	c *chunk
}

// PoolConfig sizes a staging pool.
type PoolConfig struct {
	Count int // buffers (default 16)
	Size  int // bytes each (default 4 MiB)
	// Registrar, when set, registers each buffer with the store's engine
	// (a failure is tolerated: I/O then bounces inside the engine).
	Registrar Registrar
}

func (c *PoolConfig) ensureDefaults() {
	if c.Count <= 0 {
		c.Count = 16
	}
	if c.Size <= 0 {
		c.Size = 4 << 20
	}
}

// Pool is a device's staging buffers, shared by concurrent batches.
type Pool struct {
	dev           Device
	cfg           PoolConfig
	mu            sync.Mutex
	cond          sync.Cond
	free          []*Staging
	all           []*Staging
	frees, unregs []func() error
	closed        bool
	leaked        int
	fixed         int // buffers the engine registered
}

// NewPool allocates cfg.Count pinned buffers of cfg.Size bytes on dev.
func NewPool(dev Device, cfg PoolConfig) (*Pool, error) {
	cfg.ensureDefaults()
	p := &Pool{dev: dev, cfg: cfg}
	p.cond.L = &p.mu
	for i := 0; i < cfg.Count; i++ {
		mem, free, err := dev.AllocHost(cfg.Size)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("gpu: staging buffer %d of %d bytes: %w", i, cfg.Size, err)
		}
		p.frees = append(p.frees, free)
		ev, err := dev.NewEvent()
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("gpu: staging event: %w", err)
		}
		s := &Staging{Mem: mem, ev: ev, id: i}
		if cfg.Registrar != nil {
			if un, err := cfg.Registrar.RegisterMemory(mem); err == nil {
				p.unregs = append(p.unregs, func() error { un(); return nil })
				p.fixed++
			}
		}
		p.all = append(p.all, s)
		p.free = append(p.free, s)
	}
	return p, nil
}

// BufferSize is the size of each staging buffer.
func (p *Pool) BufferSize() int { return p.cfg.Size }

// Count is the number of staging buffers.
func (p *Pool) Count() int { return p.cfg.Count }

// Registered is how many buffers the engine registered as fixed buffers.
func (p *Pool) Registered() int { return p.fixed }

// Get blocks until a buffer is free.
func (p *Pool) Get() (*Staging, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.free) == 0 && !p.closed {
		p.cond.Wait()
	}
	if p.closed {
		return nil, ErrClosed
	}
	s := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return s, nil
}

// TryGet returns a free buffer or nil.
func (p *Pool) TryGet() *Staging {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 || p.closed {
		return nil
	}
	s := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return s
}

// Put returns a buffer whose copies are known complete. A buffer with a
// copy possibly in flight is an error and is not reused.
func (p *Pool) Put(s *Staging) error {
	if s.busy {
		p.mu.Lock()
		p.leaked++
		p.mu.Unlock()
		return fmt.Errorf("gpu: staging buffer %d returned with a copy in flight", s.id)
	}
	p.mu.Lock()
	p.free = append(p.free, s)
	p.mu.Unlock()
	p.cond.Signal()
	return nil
}

// leak drops a buffer whose copies could not be confirmed finished.
func (p *Pool) leak(s *Staging) {
	p.mu.Lock()
	p.leaked++
	p.mu.Unlock()
}

// Leaked is the number of buffers withdrawn because their copies could not
// be confirmed finished.
func (p *Pool) Leaked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leaked
}

// Close frees the buffers once every batch has returned its own; with a
// buffer still out it frees nothing and says so.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	out := len(p.all) - len(p.free) - p.leaked
	p.mu.Unlock()
	p.cond.Broadcast()
	if out > 0 {
		// A batch still holds a buffer (and may be reading into it): keep
		// the memory rather than free it under the batch.
		return fmt.Errorf("gpu: pool close: %d staging buffers still out; their memory is kept", out)
	}
	if p.leaked > 0 {
		if err := p.dev.Synchronize(); err != nil {
			return fmt.Errorf("gpu: pool close: %d buffers with unconfirmed copies and the device did not synchronize (memory kept): %w", p.leaked, err)
		}
	}
	for _, u := range p.unregs {
		_ = u()
	}
	for _, s := range p.all {
		_ = s.ev.Destroy()
	}
	var first error
	for _, f := range p.frees {
		if err := f(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
