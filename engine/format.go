package engine

import (
	"errors"
	"fmt"
	"os"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// ErrNeedSize is returned by FormatPath for a file that does not exist yet
// and no size to create it with.
var ErrNeedSize = errors.New("engine: a size is needed to create a store file")

// ErrZeroDevice is returned by FormatPath for FormatPathOptions.Zero on a
// block device.
var ErrZeroDevice = errors.New("engine: only a store file can be zeroed")

// FormatPathOptions control FormatPath.
type FormatPathOptions struct {
	// Geometry of the new store.
	Geometry layout.Geometry
	// Size is the bytes the store uses. It is required to create a file;
	// 0 keeps an existing file's size, or takes the whole device.
	Size int64
	// Force overwrites an existing store.
	Force bool
	// Zero writes zeros over the parts of a store file never written
	// (store.ZeroFile), so every slot is written data: reads of it reach the
	// device, and a first write into it needs no extent conversion. Files
	// only; a block device is refused.
	Zero bool
	// ZeroProgress, when not nil, follows Zero (bytes zeroed, bytes to
	// zero).
	ZeroProgress func(done, total int64)
	// Engine chooses the engine that writes the store (Kind, Logger).
	Engine Options
}

// FormatPath creates an empty store at path: a file (created, or resized to
// o.Size) or a block device. It opens an engine on path and writes the
// store through store.Format. It takes the store's lock first, so a mounted
// store is never formatted under its daemon.
//
// Refusals change nothing on disk: a geometry the device cannot align to
// (wrapping layout.ErrGeometry), a size below one slot of the geometry
// (store.ErrTooSmall, naming the minimum), an existing store without
// o.Force (store.ErrExists), a store in use (*LockedError), ErrNeedSize. A
// file FormatPath created is removed again when a later step fails.
func FormatPath(path string, o FormatPathOptions) (_ *store.Superblock, err error) {
	g := o.Geometry
	if err := g.Validate(); err != nil {
		return nil, err
	}
	if o.Size < 0 {
		return nil, fmt.Errorf("%w: size %d", store.ErrTooSmall, o.Size)
	}
	size := o.Size
	st, statErr := os.Stat(path)
	existed := statErr == nil
	isDev := existed && st.Mode()&os.ModeDevice != 0
	switch {
	case existed && !isDev && !st.Mode().IsRegular():
		return nil, fmt.Errorf("%s is neither a regular file nor a block device", path)
	case statErr != nil && !errors.Is(statErr, os.ErrNotExist):
		return nil, statErr
	case size == 0 && !existed:
		return nil, fmt.Errorf("%w: %s does not exist", ErrNeedSize, path)
	case size == 0 && !isDev:
		size = st.Size() // an existing file keeps its size
	}
	if size > 0 || !isDev {
		if err := checkSize(g, size, path); err != nil {
			return nil, err
		}
	}
	if o.Zero && isDev {
		return nil, fmt.Errorf("%w: %s is a block device; zeroing is for store files", ErrZeroDevice, path)
	}
	eo := o.Engine
	eo.ReadOnly = false

	// An existing file or device: lock it and make sure it may be
	// overwritten before anything changes.
	if existed {
		lock, err := Lock(path)
		if err != nil {
			return nil, err
		}
		defer lock.Close()
		if err := checkExisting(path, eo, g, o.Force); err != nil {
			return nil, err
		}
	}
	if err := store.PrepareFile(path, size); err != nil {
		return nil, err
	}
	if !existed {
		// Anything that fails from here leaves no new file behind.
		defer func() {
			if err != nil {
				os.Remove(path)
			}
		}()
		lock, err := Lock(path)
		if err != nil {
			return nil, err
		}
		defer lock.Close()
	}
	if o.Zero {
		if err := store.ZeroFile(path, o.ZeroProgress); err != nil {
			return nil, err
		}
	}
	e, err := Open(path, eo)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	if !existed {
		if err := checkAlign(e, g); err != nil {
			return nil, err
		}
	}
	if isDev {
		if size > e.Size() {
			return nil, fmt.Errorf("%w: %d bytes asked for, %s has %d", store.ErrTooSmall, size, path, e.Size())
		}
		if err := checkSize(g, e.Size(), path); err != nil {
			return nil, err
		}
	}
	sb, err := store.Format(e, g, store.FormatOptions{Force: o.Force, Size: size})
	if err != nil {
		if errors.Is(err, layout.ErrGeometry) {
			return nil, err
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := e.Close(); err != nil {
		return nil, err
	}
	return sb, nil
}

// checkExisting refuses, without writing, to format over an existing store
// (unless force) or with an alignment the device cannot do.
func checkExisting(path string, eo Options, g layout.Geometry, force bool) error {
	eo.ReadOnly = true
	e, err := Open(path, eo)
	if err != nil {
		return err
	}
	defer e.Close()
	if err := checkAlign(e, g); err != nil {
		return err
	}
	if force {
		return nil
	}
	found, err := store.HoldsStore(e)
	if err != nil {
		return fmt.Errorf("%s: looking for an existing store: %w", path, err)
	}
	if found {
		return fmt.Errorf("%s: %w", path, store.ErrExists)
	}
	return nil
}

// checkAlign refuses a geometry whose alignment the engine cannot do.
func checkAlign(e store.Engine, g layout.Geometry) error {
	if a := e.Align(); a > store.SuperblockSize || g.Align%a != 0 {
		return fmt.Errorf("%w: align %d: %s needs %d-byte alignment", layout.ErrGeometry, g.Align, e.Name(), a)
	}
	return nil
}

// checkSize refuses a size below one slot of g, naming the minimum.
func checkSize(g layout.Geometry, size int64, path string) error {
	if minSize := store.MinSize(g); size < minSize {
		return fmt.Errorf("%w: %d bytes for %s; one slot of this geometry (%v) needs at least %d bytes",
			store.ErrTooSmall, size, path, g, minSize)
	}
	return nil
}
