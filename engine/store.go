package engine

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/kvfs/kvfs/store"
)

// LockedError is returned when another process holds a store's lock. It
// wraps store.ErrLocked.
type LockedError struct {
	Path string
	Err  error
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("engine: store %s is in use by another process (is it mounted?)", e.Path)
}

func (e *LockedError) Unwrap() error { return e.Err }

// Lock takes the store's process lock (store.Lock); close the file to
// release it. A lock held elsewhere gives a *LockedError.
func Lock(path string) (*os.File, error) {
	f, err := store.Lock(path)
	if errors.Is(err, store.ErrLocked) {
		return nil, &LockedError{Path: path, Err: err}
	}
	return f, err
}

// OpenStore locks path, opens its engine with o and the store on it with so.
// o.ReadOnly implies so.ReadOnly; so.Logger defaults to o.Logger. The
// returned function closes the store, the engine and the lock, in that
// order, and returns their errors joined; it may be called more than once.
func OpenStore(path string, o Options, so store.Options) (*store.Store, func() error, error) {
	lock, err := Lock(path)
	if err != nil {
		return nil, nil, err
	}
	e, err := Open(path, o)
	if err != nil {
		lock.Close()
		return nil, nil, err
	}
	if o.ReadOnly {
		so.ReadOnly = true
	}
	if so.Logger == nil {
		so.Logger = o.Logger
	}
	s, err := store.Open(e, so)
	if err != nil {
		e.Close()
		lock.Close()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	var once sync.Once
	var cerr error
	closeAll := func() error {
		once.Do(func() { cerr = errors.Join(s.Close(), e.Close(), lock.Close()) })
		return cerr
	}
	return s, closeAll, nil
}
