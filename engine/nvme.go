package engine

import (
	"fmt"
	"os"

	nvmeengine "github.com/kvfs/kvfs/engine/nvme"
	"github.com/kvfs/kvfs/nvme"
	"github.com/kvfs/kvfs/store"
)

// probeNVMe reports whether path is an NVMe namespace reachable through
// passthrough. Anything but a device is turned away without asking the
// device layer, so the reason logged for a store file is the plain one.
func probeNVMe(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.Mode()&os.ModeDevice == 0 {
		return fmt.Errorf("%s is not a device, so not an NVMe namespace", path)
	}
	return nvme.Available(path)
}

// openNVMe opens the passthrough engine. It has no read-only mode: a
// read-only store simply issues no writes.
func openNVMe(path string, o Options) (store.Engine, error) {
	return nvmeengine.OpenEngine(path, nvmeengine.EngineOptions{
		QueueDepth:    o.QueueDepth,
		Rings:         o.Rings,
		BufferPoolMax: o.PoolMax,
		FDP:           o.FDP,
		Logger:        o.Logger,
	})
}
