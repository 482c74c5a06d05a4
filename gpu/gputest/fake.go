// Package gputest has a fake GPU for tests of package gpu and its users on
// machines without one: device memory is a byte arena, copies run in order
// on a background goroutine after a delay, events complete when the copies
// queued before them have, and failures can be injected. A copy reads its
// source when it runs, not when it is queued, so a staging buffer reused
// too early shows up as wrong bytes on the "device" (and as a violation).
package gputest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
	"unsafe"

	"github.com/kvfs/kvfs/gpu"
)

// Base is the device address of the arena's first byte.
const Base uint64 = 0x7f00_0000_0000

// ErrInjected is the error of an injected failure.
var ErrInjected = errors.New("gputest: injected failure")

type op struct {
	h2d  bool
	dev  uint64
	host []byte
	err  error // set when it ran and failed
}

// Device is a fake gpu.Device.
type Device struct {
	// Delay is how long each copy takes (plus up to Jitter at random).
	Delay, Jitter time.Duration
	// FailCopy, when set, is asked as copy number i (0-based, in queue
	// order) runs; an error fails it (the event covering it reports it).
	FailCopy func(i int) error
	// FailEnqueue, when set, is asked as copy i is queued; an error is
	// returned from CopyH2D/CopyD2H and nothing is queued.
	FailEnqueue func(i int) error
	// FailRecord, when set, is asked at each event record.
	FailRecord func() error
	// Enable2D makes the device a gpu.Copier2D (a pitched copy is queued
	// as one operation per row, run in order like any other).
	Enable2D bool
	// EnableBatch makes the device a gpu.Batcher (a batch is queued as its
	// copies, run in order like any other); FailBatch, when set, is asked
	// at each batch, and an error fails it with nothing queued.
	EnableBatch bool
	FailBatch   func() error
	// LaneCount above 1 makes the device a gpu.Laner: its lanes are views
	// that queue on the same ordered queue (stricter than separate
	// streams) and count the events recorded on each (LaneRecords).
	LaneCount int
	// FailRegister, when set, is asked at each RegisterHost; an error
	// refuses the registration.
	FailRegister func() error

	mu       sync.Mutex
	hosts    int // host ranges registered now (RegisterHost)
	devTop   int // AllocDevice hands out memory below it (0: the arena's end)
	devAlloc int // bytes allocated now
	devPeak  int // the most allocated at once
	cond     sync.Cond
	mem      []byte
	ops      []op
	executed int
	stop     bool
	done     chan struct{}
	enq      int
	viol     []string
	syncs    int
	copies2D int
	calls    int // copy calls (a 2D copy or a batch one)
	batches  int
	laneRecs map[int]int
	events   int
}

// NewDevice returns a fake device with size bytes of memory; Close stops it.
func NewDevice(size int) *Device {
	d := &Device{mem: make([]byte, size), done: make(chan struct{})}
	d.cond.L = &d.mu
	go d.run()
	return d
}

// Close stops the copy goroutine after the queue drained.
func (d *Device) Close() {
	d.mu.Lock()
	d.stop = true
	d.cond.Broadcast()
	d.mu.Unlock()
	<-d.done
}

// Mem is the device memory at addr (n bytes), for checking results.
func (d *Device) Mem(addr uint64, n int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	off := addr - Base
	return append([]byte(nil), d.mem[off:off+uint64(n)]...)
}

// Fill sets device memory at addr.
func (d *Device) Fill(addr uint64, b []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(d.mem[addr-Base:], b)
}

// Violations are the misuses seen: host memory written while a queued copy
// still read or wrote it.
func (d *Device) Violations() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.viol...)
}

// Syncs is how many device-wide synchronizes were asked for.
func (d *Device) Syncs() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.syncs
}

// Copies is how many copies were queued.
func (d *Device) Copies() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ops)
}

func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// HostWrite is called by a fake store before it writes host memory b: a
// queued copy still using b is a violation (the staging buffer was reused
// before its event completed).
func (d *Device) HostWrite(b []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := d.executed; i < len(d.ops); i++ {
		if overlaps(d.ops[i].host, b) {
			d.viol = append(d.viol, fmt.Sprintf("host memory written while copy %d (queued, not run) uses it", i))
			return
		}
	}
}

func (d *Device) run() {
	defer close(d.done)
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		for d.executed == len(d.ops) && !d.stop {
			d.cond.Wait()
		}
		if d.executed == len(d.ops) && d.stop {
			return
		}
		i := d.executed
		delay := d.Delay
		if d.Jitter > 0 {
			delay += time.Duration(rand.Int64N(int64(d.Jitter)))
		}
		d.mu.Unlock()
		if delay > 0 {
			time.Sleep(delay)
		}
		var err error
		if d.FailCopy != nil {
			err = d.FailCopy(i)
		}
		d.mu.Lock()
		o := &d.ops[i]
		if err != nil {
			o.err = err
		} else {
			off := o.dev - Base
			if o.h2d {
				copy(d.mem[off:off+uint64(len(o.host))], o.host)
			} else {
				copy(o.host, d.mem[off:off+uint64(len(o.host))])
			}
		}
		d.executed++
		d.cond.Broadcast()
	}
}

func (d *Device) queue(h2d bool, dev uint64, host []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := d.enq
	d.enq++
	if d.FailEnqueue != nil {
		if err := d.FailEnqueue(i); err != nil {
			return err
		}
	}
	if dev < Base || dev-Base+uint64(len(host)) > uint64(len(d.mem)) {
		return fmt.Errorf("gputest: copy of %d bytes at %#x outside device memory", len(host), dev)
	}
	if !h2d {
		// A D2H copy writes host memory too.
		for k := d.executed; k < len(d.ops); k++ {
			if overlaps(d.ops[k].host, host) && d.ops[k].h2d {
				d.viol = append(d.viol, fmt.Sprintf("D2H into host memory copy %d still reads", k))
				break
			}
		}
	}
	d.ops = append(d.ops, op{h2d: h2d, dev: dev, host: host})
	d.cond.Broadcast()
	return nil
}

// CopyH2D implements gpu.Device.
func (d *Device) CopyH2D(dst uint64, src []byte) error { d.call(); return d.queue(true, dst, src) }

// CopyD2H implements gpu.Device.
func (d *Device) CopyD2H(dst []byte, src uint64) error { d.call(); return d.queue(false, src, dst) }

func (d *Device) call() {
	d.mu.Lock()
	d.calls++
	d.mu.Unlock()
}

// Calls is how many copy calls were made: a 2D copy or a batch is one
// call (Copies counts the rows and members).
func (d *Device) Calls() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls
}

// Bind implements gpu.Binder (no per-thread setup: fn gets the device).
func (d *Device) Bind(fn func(q gpu.Device) error) error { return fn(d) }

// Can2D implements gpu.Copier2D.
func (d *Device) Can2D() bool { return d.Enable2D }

// CopyH2D2D implements gpu.Copier2D.
func (d *Device) CopyH2D2D(dst uint64, dstPitch int, src []byte, srcPitch, width, rows int) error {
	if width > srcPitch || width > dstPitch || len(src) < (rows-1)*srcPitch+width {
		return fmt.Errorf("gputest: bad 2D copy: %d rows × %d, pitches %d/%d, %d bytes", rows, width, srcPitch, dstPitch, len(src))
	}
	d.mu.Lock()
	d.copies2D++
	d.calls++
	d.mu.Unlock()
	for r := range rows {
		if err := d.queue(true, dst+uint64(r*dstPitch), src[r*srcPitch:r*srcPitch+width]); err != nil {
			return err
		}
	}
	return nil
}

// Lanes implements gpu.Laner.
func (d *Device) Lanes() int { return max(1, d.LaneCount) }

// Lane implements gpu.Laner.
func (d *Device) Lane(i int) gpu.Device { return &lane{Device: d, i: i % d.Lanes()} }

// LaneRecords is, per lane, how many events were recorded on it.
func (d *Device) LaneRecords() map[int]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := map[int]int{}
	for k, v := range d.laneRecs {
		m[k] = v
	}
	return m
}

// lane is a view of the device as one of its lanes.
type lane struct {
	*Device
	i int
}

// RecordOn implements gpu.LaneRecorder.
func (l *lane) RecordOn(ev gpu.Event) error {
	l.mu.Lock()
	if l.laneRecs == nil {
		l.laneRecs = map[int]int{}
	}
	l.laneRecs[l.i]++
	l.mu.Unlock()
	return ev.Record()
}

// CanBatch implements gpu.Batcher.
func (d *Device) CanBatch() bool { return d.EnableBatch }

// CopyH2DBatch implements gpu.Batcher.
func (d *Device) CopyH2DBatch(dsts []uint64, srcs [][]byte) error {
	if len(dsts) != len(srcs) {
		return fmt.Errorf("gputest: batch of %d destinations and %d sources", len(dsts), len(srcs))
	}
	if f := d.FailBatch; f != nil {
		if err := f(); err != nil {
			return err
		}
	}
	d.mu.Lock()
	d.batches++
	d.calls++
	d.mu.Unlock()
	for i, dst := range dsts {
		if err := d.queue(true, dst, srcs[i]); err != nil {
			return err
		}
	}
	return nil
}

// Batches is how many batches of copies were queued.
func (d *Device) Batches() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.batches
}

// CopyD2H2D implements gpu.Copier2D.
func (d *Device) CopyD2H2D(dst []byte, dstPitch int, src uint64, srcPitch, width, rows int) error {
	if width > srcPitch || width > dstPitch || len(dst) < (rows-1)*dstPitch+width {
		return fmt.Errorf("gputest: bad 2D copy: %d rows × %d, pitches %d/%d, %d bytes", rows, width, srcPitch, dstPitch, len(dst))
	}
	d.mu.Lock()
	d.copies2D++
	d.calls++
	d.mu.Unlock()
	for r := range rows {
		if err := d.queue(false, src+uint64(r*srcPitch), dst[r*dstPitch:r*dstPitch+width]); err != nil {
			return err
		}
	}
	return nil
}

// Copies2D is how many 2D copies were queued.
func (d *Device) Copies2D() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.copies2D
}

// Synchronize implements gpu.Device.
func (d *Device) Synchronize() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.syncs++
	n := len(d.ops)
	for d.executed < n {
		d.cond.Wait()
	}
	return nil
}

// AllocHost implements gpu.Device.
func (d *Device) AllocHost(n int) ([]byte, func() error, error) {
	return make([]byte, n), func() error { return nil }, nil
}

// NewEvent implements gpu.Device.
func (d *Device) NewEvent() (gpu.Event, error) {
	d.mu.Lock()
	d.events++
	d.mu.Unlock()
	return &event{d: d, seq: -1}, nil
}

type event struct {
	d         *Device
	from, seq int
}

func (e *event) Record() error {
	d := e.d
	if d.FailRecord != nil {
		if err := d.FailRecord(); err != nil {
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e.from = max(e.seq, 0)
	e.seq = len(d.ops)
	return nil
}

func (e *event) errLocked() error {
	for i := e.from; i < e.seq; i++ {
		if err := e.d.ops[i].err; err != nil {
			return fmt.Errorf("gputest: copy %d: %w", i, err)
		}
	}
	return nil
}

func (e *event) Query() (bool, error) {
	d := e.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.executed < e.seq {
		return false, nil
	}
	return true, e.errLocked()
}

func (e *event) Wait() error {
	d := e.d
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.executed < e.seq {
		d.cond.Wait()
	}
	return e.errLocked()
}

func (e *event) Destroy() error { return nil }

var _ gpu.Device = (*Device)(nil)

// RegisterHost implements gpu.HostRegistrar: the fake reads any host
// memory, so it only counts the registrations (Registered); the
// unregister func fails when called twice.
func (d *Device) RegisterHost(b []byte) (func() error, error) {
	if d.FailRegister != nil {
		if err := d.FailRegister(); err != nil {
			return nil, err
		}
	}
	d.mu.Lock()
	d.hosts++
	d.mu.Unlock()
	var once sync.Once
	return func() error {
		err := fmt.Errorf("gputest: host range of %d bytes unregistered twice", len(b))
		once.Do(func() {
			d.mu.Lock()
			d.hosts--
			d.mu.Unlock()
			err = nil
		})
		return err
	}, nil
}

// AllocDevice implements gpu.DeviceAllocator: memory from the top of the
// arena down (tests keep their tiles below it); freeing releases the
// bytes' count (Allocated), not the range.
func (d *Device) AllocDevice(n int) (uint64, func() error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.devTop == 0 {
		d.devTop = len(d.mem)
	}
	if n <= 0 || n > d.devTop {
		return 0, nil, fmt.Errorf("gputest: no %d bytes of device memory left", n)
	}
	d.devTop -= n
	d.devAlloc += n
	d.devPeak = max(d.devPeak, d.devAlloc)
	addr := Base + uint64(d.devTop)
	var once sync.Once
	return addr, func() error {
		once.Do(func() {
			d.mu.Lock()
			d.devAlloc -= n
			d.mu.Unlock()
		})
		return nil
	}, nil
}

// PeakAllocated is the most bytes AllocDevice had handed out at once.
func (d *Device) PeakAllocated() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.devPeak
}

// Allocated is how many bytes AllocDevice handed out and were not freed.
func (d *Device) Allocated() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.devAlloc
}

// Registered is how many host ranges are registered now.
func (d *Device) Registered() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hosts
}

// Pending reports whether a queued copy that has not run uses host memory b.
func (d *Device) Pending(b []byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := d.executed; i < len(d.ops); i++ {
		if overlaps(d.ops[i].host, b) {
			return true
		}
	}
	return false
}
