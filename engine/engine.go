package engine

import (
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/kvfs/kvfs/store"
)

// Engine kinds accepted by Options.Kind.
const (
	KindAuto  = "auto"
	KindPosix = "posix"
	KindUring = "uring"
	KindNVMe  = "nvme"
)

// Kinds lists the accepted kinds, for help texts.
var Kinds = []string{KindAuto, KindPosix, KindUring, KindNVMe}

// Sentinel errors.
var (
	// ErrKind is returned for an engine kind that does not exist.
	ErrKind = errors.New("engine: unknown engine kind")
	// ErrUnavailable is wrapped when an engine kind cannot serve a path
	// (not an NVMe namespace, io_uring disabled).
	ErrUnavailable = errors.New("engine: unavailable")
)

// Options control Open.
type Options struct {
	// Kind is auto (also ""), posix, uring or nvme.
	Kind string
	// ReadOnly opens the device read-only.
	ReadOnly bool
	// QueueDepth bounds the requests in flight per ring (uring, nvme); 0
	// means the engine's default. posix runs at queue depth 1.
	QueueDepth int
	// Rings is the number of io_uring instances of the uring and nvme
	// engines (callers are spread over them); 0 means one per 4 usable
	// cores (ringowner.AutoRings).
	Rings int
	// AsyncReads is the uring engine's IOSQE_ASYNC choice for reads:
	// "auto" (""), "on" or "off" (see uring.EngineOptions.AsyncReads).
	AsyncReads string
	// InlineReads is the uring and posix engines' choice of reading
	// page-cache files on the verifying goroutine: "auto" (""), "on" or
	// "off" (see uring.EngineOptions.InlineReads).
	InlineReads string
	// PoolMax caps the engine's growing registered buffer pool (bytes);
	// 0 means the engine's default (1 GiB or an eighth of the RAM), a
	// negative value means the pool never grows.
	PoolMax int
	// Logger receives the selection lines; nil means none.
	Logger *zap.Logger
	// FDP selects flexible data placement for the nvme engine; "" lets the
	// engine decide.
	FDP string
}

// backend is one engine kind. probe reports, cheaply, why the kind cannot
// serve path (nil: try to open it); open opens it. Their errors are plain
// reasons; openOne adds the kind.
type backend struct {
	kind  string
	probe func(path string) error
	open  func(path string, o Options) (store.Engine, error)
}

// backends in the order auto tries them. Tests replace it.
var backends = []backend{
	{KindNVMe, probeNVMe, openNVMe},
	{KindUring, probeUring, openUring},
	{KindPosix, probePosix, openPosix},
}

// ParseKind normalises a user-given kind ("" means auto).
func ParseKind(s string) (string, error) {
	k := strings.ToLower(strings.TrimSpace(s))
	if k == "" {
		return KindAuto, nil
	}
	for _, known := range Kinds {
		if k == known {
			return k, nil
		}
	}
	return "", fmt.Errorf("%w %q (want %s)", ErrKind, s, strings.Join(Kinds, ", "))
}

// Open opens the engine of kind o.Kind on path. With auto it falls back from
// nvme to uring to posix, logging why each kind was passed over.
func Open(path string, o Options) (store.Engine, error) {
	kind, err := ParseKind(o.Kind)
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if kind != KindAuto {
		for _, b := range backends {
			if b.kind == kind {
				return openOne(b, path, o)
			}
		}
		return nil, fmt.Errorf("%w %q", ErrKind, kind)
	}
	var errs []error
	for _, b := range backends {
		e, err := openOne(b, path, o)
		if err == nil {
			log.Debug("engine: opened", zap.String("engine", e.Name()), zap.String("path", path))
			return e, nil
		}
		log.Info("engine: not using "+b.kind, zap.String("path", path), zap.String("reason", err.Error()))
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("engine: no engine can open %s: %w", path, errors.Join(errs...))
}

// openOne probes and opens one backend.
func openOne(b backend, path string, o Options) (store.Engine, error) {
	if b.probe != nil {
		if err := b.probe(path); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, b.kind, err)
		}
	}
	e, err := b.open(path, o)
	if err != nil {
		return nil, fmt.Errorf("engine: %s: %w", b.kind, err)
	}
	return e, nil
}
