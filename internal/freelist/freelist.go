// Package freelist keeps idle working memory for the next call: a bounded
// stack under a mutex. Not a sync.Pool, which drops its items at every
// collection (and at random under the race detector): memory sized for
// large calls would then be made again, and faulted in, call after call.
package freelist

import "sync"

// DefaultMax is how many idle items a List keeps when Max is 0.
const DefaultMax = 64

// List is a free list of *T. The zero value is ready to use.
type List[T any] struct {
	// Max is how many idle items it keeps (0: DefaultMax); Put drops the
	// others to the collector.
	Max  int
	mu   sync.Mutex
	free []*T
}

// Get returns an idle item, or a new zero one.
func (l *List[T]) Get() *T {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.free); n > 0 {
		x := l.free[n-1]
		l.free[n-1] = nil
		l.free = l.free[:n-1]
		return x
	}
	return new(T)
}

// Put keeps x for a later Get, unless Max items are idle already; it
// reports whether it kept x (an item holding more than memory, a device
// event, is then released by the caller). The caller has emptied it of
// anything that must not outlive its call.
func (l *List[T]) Put(x *T) bool {
	m := l.Max
	if m <= 0 {
		m = DefaultMax
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.free) < m {
		l.free = append(l.free, x)
		return true
	}
	return false
}

// Drain empties the list and returns what it kept (items that hold more
// than memory, to release).
func (l *List[T]) Drain() []*T {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.free
	l.free = nil
	return out
}
