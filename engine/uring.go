package engine

import "github.com/kvfs/kvfs/store"

// probeUring reports whether io_uring can be used by this process.
func probeUring(string) error {
	return errNotBuilt // TODO(wire uring): return uring.Available()
}

func openUring(path string, o Options) (store.Engine, error) {
	return nil, errNotBuilt // TODO(wire uring): uring.OpenEngine(path, uring.EngineOptions{…})
}
