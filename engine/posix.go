package engine

import (
	"github.com/kvfs/kvfs/engine/posix"
	"github.com/kvfs/kvfs/store"
)

// posix serves any regular file or block device; posix.Open reports why not.
func probePosix(string) error { return nil }

func openPosix(path string, o Options) (store.Engine, error) {
	return posix.Open(path, posix.Options{ReadOnly: o.ReadOnly, InlineReads: o.InlineReads})
}
