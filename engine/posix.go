package engine

import "github.com/kvfs/kvfs/store"

// posix serves any regular file or block device; OpenPosix reports why not.
func probePosix(string) error { return nil }

func openPosix(path string, o Options) (store.Engine, error) {
	return store.OpenPosix(path, store.PosixOptions{ReadOnly: o.ReadOnly})
}
