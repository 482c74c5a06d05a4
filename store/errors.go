package store

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error the store returns wraps one of these (or an
// engine error); check them with errors.Is.
var (
	ErrNotFound   = errors.New("store: group not found")
	ErrCorrupt    = errors.New("store: checksum mismatch")
	ErrSize       = errors.New("store: wrong data size")
	ErrInvalid    = errors.New("store: invalid request")
	ErrFull       = errors.New("store: no slot available")
	ErrClosed     = errors.New("store: closed")
	ErrLocked     = errors.New("store: in use by another process")
	ErrExists     = errors.New("store: a store already exists (use --force to overwrite)")
	ErrTooSmall   = errors.New("store: device too small")
	ErrNoStore    = errors.New("store: not a kvfs store")
	ErrVersion    = errors.New("store: unsupported format version")
	ErrGeometry   = errors.New("store: geometry mismatch")
	ErrSuperblock = errors.New("store: superblock damaged")
	ErrHeader     = errors.New("store: slot header damaged")
	ErrEngine     = errors.New("store: engine unusable")
	// ErrInvariant is wrapped by CheckInvariants' report of in-memory state
	// that disagrees with itself or with the device: a bug in the store.
	ErrInvariant = errors.New("store: invariant violated")
)

// ErrTagMismatch is a read's answer for a request whose expected tag
// (ReadReq.Tag) is not the stored block's: the block stands for another
// prefix, and its bytes are not served. It wraps ErrNotFound (to a caller
// that does not look for it, the group is absent) but is not equal to it.
var ErrTagMismatch = fmt.Errorf("%w: the block is stored under another tag", ErrNotFound)

// ErrBlockExists is RenameBlock's refusal: the target id is already a
// block.
var ErrBlockExists = errors.New("store: block already exists")
