package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/store"
)

// umountOptions are the flags of kvfs umount.
type umountOptions struct {
	lazy bool
	wait time.Duration
}

func init() {
	var o umountOptions
	c := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount a kvfs mount and wait for its daemon to close the store",
		Long: `Unmount the kvfs mount on MOUNTPOINT. The daemon serving it then closes its
store durably and exits; umount waits (up to --wait) until the store is
released, so the store can be opened again as soon as umount returns.

Fails with "busy" while files are open on the mount, unless --lazy: the
mount then disappears at once and goes when the last file closes. A stale
mount of a dead daemon is detached.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 || args[0] == "" {
				return usageErrorf("umount takes exactly one MOUNTPOINT, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	c.Flags().BoolVar(&o.lazy, "lazy", false, "detach now even if files are open (MNT_DETACH)")
	c.Flags().DurationVar(&o.wait, "wait", 30*time.Second, "how long to wait for the daemon to release the store")
	addCommand(c)
}

func (o *umountOptions) run(cmd *cobra.Command, mountpoint string) error {
	mi, ok, err := fs.FindMount(mountpoint)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s is not mounted", mountpoint)
	}
	if mi.FSType != "fuse.kvfs" {
		return fmt.Errorf("%s is a %s mount, not kvfs", mountpoint, mi.FSType)
	}
	if stale, err := fs.CleanStale(mountpoint); err != nil {
		return err
	} else if stale {
		return nil // the daemon is gone: nothing holds the store
	}
	if o.lazy {
		err = fs.Detach(mountpoint)
	} else {
		err = fs.Unmount(mountpoint)
	}
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%s is busy: files are open on it (close them, or use --lazy)", mountpoint)
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", mountpoint, err)
	}
	return waitReleased(mi.Source, o.wait)
}

// waitReleased waits until nobody holds the store's lock: the daemon has
// closed it. A source that is not a path (an old mount) is not waited for.
func waitReleased(storePath string, wait time.Duration) error {
	if _, err := os.Stat(storePath); err != nil {
		return nil
	}
	deadline := time.Now().Add(wait)
	for {
		lock, err := engine.Lock(storePath)
		if err == nil {
			return lock.Close()
		}
		if !errors.Is(err, store.ErrLocked) {
			return nil // not a lock we can take here (permissions): do not wait
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("unmounted, but the daemon still holds %s after %v", storePath, wait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
