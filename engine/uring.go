package engine

import (
	"github.com/kvfs/kvfs/engine/internal/ringowner"
	uringengine "github.com/kvfs/kvfs/engine/uring"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

// probeUring reports whether io_uring can be used by this process.
func probeUring(string) error { return uring.Available() }

func openUring(path string, o Options) (store.Engine, error) {
	return uringengine.OpenEngine(path, uringengine.EngineOptions{
		QueueDepth:    o.QueueDepth,
		Rings:         o.Rings,
		BufferPoolMax: o.PoolMax,
		AsyncReads:    o.AsyncReads,
		InlineReads:   o.InlineReads,
		Logger:        o.Logger,
		Direct:        true, // dropped by the engine where the file system refuses it
		ReadOnly:      o.ReadOnly,
	})
}

// MaxRings is the most rings (Options.Rings) an engine runs.
const MaxRings = ringowner.MaxRings

// AutoRings is the ring count Options.Rings 0 gives on this machine: one
// per 4 usable cores (affinity mask, cgroup CPU quota), at least one per
// NUMA node, at most MaxRings.
func AutoRings() int { return ringowner.AutoRings() }
