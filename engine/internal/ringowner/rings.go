package ringowner

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/store"
)

// MaxRings bounds Rings (and AutoRings).
const MaxRings = 16

// coresPerRing is how many usable cores AutoRings gives one ring: a ring's
// goroutine does the copies of buffered reads (tmpfs, page cache) itself,
// and the callers, the CRC checks and the FUSE threads need cores too.
const coresPerRing = 4

// AutoRings is the number of rings for this machine: one per 4 usable
// cores (at least one per NUMA node, never more than the cores), between 1
// and MaxRings. Usable cores are the CPUs of the scheduler affinity mask,
// lowered by a cgroup CPU quota (cpu.max, or cpu.cfs_quota_us on cgroup
// v1) where one is readable.
func AutoRings() int {
	cores := UsableCPUs()
	n := max(cores/coresPerRing, min(numaNodes(), cores), 1)
	return min(n, MaxRings)
}

// UsableCPUs is the number of CPUs this process may run on: the affinity
// mask, lowered by a cgroup quota where readable.
func UsableCPUs() int {
	n := 0
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err == nil {
		n = set.Count()
	}
	if n <= 0 {
		n = 1
	}
	if q := cgroupQuota(); q > 0 && q < float64(n) {
		n = max(1, int(q+0.5))
	}
	return n
}

// cgroupQuota is the CPU quota of this process's cgroup in cores, 0 when
// none or unreadable.
func cgroupQuota() float64 {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	best := 0.0
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var q float64
		switch {
		case parts[0] == "0" && parts[1] == "": // cgroup v2
			q = quotaV2("/sys/fs/cgroup", parts[2])
		case strings.Contains(","+parts[1]+",", ",cpu,"): // cgroup v1
			q = quotaV1(filepath.Join("/sys/fs/cgroup/cpu", parts[2]))
		}
		if q > 0 && (best == 0 || q < best) {
			best = q
		}
	}
	return best
}

// quotaV2 reads cpu.max of the cgroup rel under root and of its ancestors
// up to root; the tightest quota wins.
func quotaV2(root, rel string) float64 {
	best := 0.0
	for d := filepath.Join(root, rel); strings.HasPrefix(d, root); d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "cpu.max")); err == nil {
			f := strings.Fields(string(data))
			if len(f) == 2 && f[0] != "max" {
				quota, err1 := strconv.ParseFloat(f[0], 64)
				period, err2 := strconv.ParseFloat(f[1], 64)
				if err1 == nil && err2 == nil && quota > 0 && period > 0 {
					if q := quota / period; best == 0 || q < best {
						best = q
					}
				}
			}
		}
		if d == root {
			break
		}
	}
	return best
}

func quotaV1(dir string) float64 {
	read := func(name string) float64 {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(string(data)), 64)
		if err != nil {
			return 0
		}
		return v
	}
	quota, period := read("cpu.cfs_quota_us"), read("cpu.cfs_period_us")
	if quota <= 0 || period <= 0 {
		return 0
	}
	return quota / period
}

// numaNodes is the number of online NUMA nodes (1 when unreadable).
func numaNodes() int {
	data, err := os.ReadFile("/sys/devices/system/node/online")
	if err != nil {
		return 1
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(data)), ",") {
		lo, hi, found := strings.Cut(r, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		b := a
		if found {
			if b, err = strconv.Atoi(hi); err != nil {
				continue
			}
		}
		n += b - a + 1
	}
	return max(n, 1)
}

// DefaultPoolMax is the default cap of a growing buffer pool: 1 GiB, or
// an eighth of the RAM when that is less, but at least least.
func DefaultPoolMax(least int) int {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil && si.Totalram > 0 {
		ram := int(uint64(si.Totalram) * uint64(si.Unit))
		return max(min(1<<30, ram/8), least)
	}
	return max(1<<30, least)
}

// Rings runs several Owners (rings, each with its goroutine on its own OS
// thread) for one engine, so that the work of the ring goroutines — on
// buffered files the copies themselves — spreads over cores. Calls are
// spread over the rings round robin; a large Do batch is split over them.
// The rings share one buffer pool (each of its segments registered on
// every ring) and one count of SQEs in flight.
//
// Failure: a ring that fails follows the Owner's rules (cancel and reap
// before its callers are released, or leak on purpose); later calls go to
// the rings that still work, and fail with the ring's error when none
// does. Sync goes to one ring: a flush (fdatasync, NVMe Flush) covers every
// write completed before it, whichever ring carried it.
type Rings struct {
	name   string
	owners []*Owner
	sh     *shared
	log    *zap.Logger
	next   atomic.Uint32

	closeOnce sync.Once
	closeErr  error
}

// splitMin is the fewest IOs of a Do batch that each ring of a split gets.
const splitMin = 4

// StartRings starts n rings (n ≤ 0: AutoRings; at most MaxRings) with the
// configuration cfg, each with its own driver from newDriver (drivers hold
// per-ring state and run on their ring's goroutine). cfg.QueueDepth is per
// ring. The pool (cfg.PoolBytes, growing to cfg.PoolMaxBytes) is shared.
func StartRings(cfg Config, n int, newDriver func(ring int) Driver) (*Rings, error) {
	if n <= 0 {
		n = AutoRings()
	}
	n = min(n, MaxRings)
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	p, err := poolConfig(cfg, cfg.Name)
	if err != nil {
		return nil, err
	}
	r := &Rings{name: cfg.Name, sh: &shared{pool: p}, log: cfg.Logger}
	for i := 0; i < n; i++ {
		c := cfg
		c.shared = r.sh
		if n > 1 {
			c.Logger = cfg.Logger.With(zap.Int("ring", i))
		}
		o, err := Start(c, newDriver(i))
		if err != nil {
			for _, o := range r.owners {
				_ = o.Close()
			}
			p.retire()
			return nil, err
		}
		r.owners = append(r.owners, o)
	}
	p.onGrow = func(mem []byte) {
		for _, o := range r.owners {
			o.registerSegment(mem)
		}
	}
	if n > 1 {
		r.log.Info("rings ready", zap.Int("rings", n), zap.Int("queue_depth_per_ring", cfg.QueueDepth),
			zap.Int("pool_bytes", p.size()), zap.Int("pool_max_bytes", p.capBytes()))
	}
	return r, nil
}

// N is the number of rings.
func (r *Rings) N() int { return len(r.owners) }

// Ring is ring i (tests, stats).
func (r *Rings) Ring(i int) *Owner { return r.owners[i] }

// pick returns the next working ring, round robin, or the error of the
// failed rings when none works (or the closed error).
func (r *Rings) pick() (*Owner, error) {
	start := r.next.Add(1)
	var firstErr error
	for k := range uint32(len(r.owners)) {
		o := r.owners[(start+k)%uint32(len(r.owners))]
		if !o.down.Load() {
			return o, nil
		}
		o.mu.Lock()
		err := o.mu.broken
		if err == nil && o.mu.closed {
			err = o.closed
		}
		o.mu.Unlock()
		if err == nil {
			return o, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, firstErr
}

// Do performs the batch and waits for it; see store.Engine. A batch of at
// least 2·splitMin IOs is split into contiguous parts on several rings.
func (r *Rings) Do(ios []store.IO) error { return r.DoNotify(ios, nil) }

// DoNotify is Do that also calls done(i), when done is not nil, on a ring
// goroutine as ios[i] completes (ios[i].Err set), so that the caller can
// work on each request's bytes while the rest are in flight. done must be
// quick and must not block or call into the engine. DoNotify returns once
// every request started has completed and done has returned for it; when
// it returns an error, done may not have been called for some requests.
func (r *Rings) DoNotify(ios []store.IO, done func(i int)) error {
	if len(ios) == 0 {
		return nil
	}
	parts := min(len(r.owners), len(ios)/splitMin)
	if parts <= 1 {
		o, err := r.pick()
		if err != nil {
			return err
		}
		return o.DoNotify(ios, done)
	}
	calls := make([]*call, 0, parts)
	var firstErr error
	per := (len(ios) + parts - 1) / parts
	for lo := 0; lo < len(ios); lo += per {
		part := ios[lo:min(lo+per, len(ios))]
		o, err := r.pick()
		if err == nil {
			c := newCall(callIO, len(part))
			c.ios = part
			if done != nil {
				base := lo
				c.cb = func(i int) { done(base + i) }
			}
			if err = o.enqueue(c); err == nil {
				calls = append(calls, c)
				continue
			}
		}
		// Never started: its IOs fail with the error, the rest go on.
		for i := range part {
			part[i].Err = err
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	// Every part that started is waited for, failed or not: the callers'
	// memory is theirs again only then.
	for _, c := range calls {
		<-c.done
		if c.err != nil && firstErr == nil {
			firstErr = c.err
		}
	}
	return firstErr
}

// DoAsync starts the batch on one ring; see Owner.DoAsync.
func (r *Rings) DoAsync(ios []store.IO, done func(i int)) error {
	if len(ios) == 0 {
		return nil
	}
	o, err := r.pick()
	if err != nil {
		return err
	}
	return o.DoAsync(ios, done)
}

// Sync flushes completed writes through one ring.
func (r *Rings) Sync() error {
	o, err := r.pick()
	if err != nil {
		return err
	}
	return o.Sync()
}

// AllocBuffer returns n bytes from the shared pool (growing it when it
// may), else from store.AllocAligned.
func (r *Rings) AllocBuffer(n int) ([]byte, error) {
	if b, ok := r.sh.pool.alloc(n); ok {
		return b, nil
	}
	return store.AllocAligned(n)
}

// FreeBuffer releases a buffer from AllocBuffer. After a ring failure
// that left requests unreaped, buffers outside the pool are leaked, not
// unmapped.
func (r *Rings) FreeBuffer(b []byte) {
	if r.sh.pool.release(b) {
		return
	}
	if r.Leaked() {
		keepLeaked(b)
		return
	}
	store.FreeAligned(b)
}

// RegisterMemory registers b on every ring; the returned function
// unregisters it from all of them. Without fixed buffers the error wraps
// ErrNoFixed.
func (r *Rings) RegisterMemory(b []byte) (func(), error) {
	uns := make([]func(), 0, len(r.owners))
	undo := func() {
		for _, un := range uns {
			un()
		}
	}
	for _, o := range r.owners {
		un, err := o.RegisterMemory(b)
		if err != nil {
			undo()
			return nil, err
		}
		uns = append(uns, un)
	}
	var once sync.Once
	return func() { once.Do(undo) }, nil
}

// Leaked reports whether any ring left requests that could not be reaped.
func (r *Rings) Leaked() bool {
	for _, o := range r.owners {
		if o.Leaked() {
			return true
		}
	}
	return false
}

// Stats sums the rings' counters; MaxInFlight is over all rings at once.
func (r *Rings) Stats() Stats {
	var s Stats
	for _, o := range r.owners {
		t := o.Stats()
		s.IOs += t.IOs
		s.Errors += t.Errors
		s.Bytes += t.Bytes
		s.SQEs += t.SQEs
		s.FixedSQEs += t.FixedSQEs
		s.Resubmits += t.Resubmits
		s.Retries += t.Retries
		s.Enters += t.Enters
		s.Wakeups += t.Wakeups
		s.Syncs += t.Syncs
		s.PoolSegments += t.PoolSegments
		s.MaxInFlight, s.PoolBytes = t.MaxInFlight, t.PoolBytes
	}
	return s
}

// PoolMem is the pool's first segment (nil when none or unmapped).
func (r *Rings) PoolMem() []byte { return r.owners[0].PoolMem() }

// PoolSize is the bytes of all the pool's segments.
func (r *Rings) PoolSize() int { return r.sh.pool.size() }

// PoolOwns reports whether b was carved out of the pool.
func (r *Rings) PoolOwns(b []byte) bool { return r.sh.pool.owns(b) }

// PoolInUse is the bytes of the pool handed out.
func (r *Rings) PoolInUse() int { return r.sh.pool.inUse() }

// PoolFreeExtents is the number of free extents over the pool's segments.
func (r *Rings) PoolFreeExtents() int { return r.sh.pool.freeExtents() }

// Close closes every ring (each waits for its requests in flight), then
// retires the pool (unmapped when its last chunk comes back, never after a
// leak). A second Close returns nil.
func (r *Rings) Close() error {
	first := false
	r.closeOnce.Do(func() {
		first = true
		var errs []error
		for _, o := range r.owners {
			if err := o.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		if used := r.sh.pool.retire(); used > 0 {
			r.log.Warn("buffer pool chunks still out at close; unmapping the pool when they are freed", zap.Int("bytes", used))
		}
		r.closeErr = errors.Join(errs...)
	})
	if !first {
		return nil
	}
	return r.closeErr
}

// String describes the rings for logs.
func (r *Rings) String() string {
	return fmt.Sprintf("%s: %d rings, pool %d bytes", r.name, len(r.owners), r.sh.pool.size())
}
