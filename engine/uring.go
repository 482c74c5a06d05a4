package engine

import (
	uringengine "github.com/kvfs/kvfs/engine/uring"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

// probeUring reports whether io_uring can be used by this process.
func probeUring(string) error { return uring.Available() }

func openUring(path string, o Options) (store.Engine, error) {
	return uringengine.OpenEngine(path, uringengine.EngineOptions{
		QueueDepth: o.QueueDepth,
		Logger:     o.Logger,
		Direct:     true, // dropped by the engine where the file system refuses it
		ReadOnly:   o.ReadOnly,
	})
}
