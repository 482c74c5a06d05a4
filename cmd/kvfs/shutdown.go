package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/fs"
)

// The daemon's shutdown bounds: after a signal, a clean unmount is retried
// while files are open for busyRetry, then the mount is detached lazily;
// the clients left get until abortAfter (from the signal) to close their
// files; then the FUSE connection is aborted, and the server gets
// abortWait to stop. Together with closing the store they make the 10 s
// that the help of kvfs mount and docs/abi.md ("Lifetime") promise.
const (
	busyRetry  = 2 * time.Second
	abortAfter = 8 * time.Second
	abortWait  = 1500 * time.Millisecond
)

// shutdown unmounts after a signal: a clean unmount, retried while files are
// open (EBUSY) for busyRetry, then a lazy one (the mount disappears at once
// and goes when the last file closes). If the server still has not stopped
// abortAfter after the signal, or a second signal comes, the FUSE connection
// is aborted: every request in flight and to come fails, so the server's
// loop ends and the store can be closed. Requests already answered were
// done: a STORE is durable before it is answered. If even the abort cannot
// end the connection (a daemon that is not root, where fusectl is not
// mounted), the daemon exits without closing the store, whose recovery on
// the next open keeps every answered write, rather than serve on.
func shutdown(log *zap.Logger, mountpoint string, conn uint32, sigs <-chan os.Signal, done <-chan struct{}) {
	start := time.Now()
	for {
		err := fs.Unmount(mountpoint)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EBUSY) || time.Since(start) > busyRetry {
			log.Warn("mount: unmount failed, detaching lazily", zap.Error(err))
			if err := fs.Detach(mountpoint); err != nil {
				log.Error("mount: lazy unmount", zap.Error(err))
			}
			break
		}
		select {
		case <-done:
			return
		case <-sigs:
			log.Warn("mount: second signal, detaching and aborting the FUSE connection")
			_ = fs.Detach(mountpoint)
			abortStop(log, conn, done)
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	select {
	case <-done:
		return
	case <-sigs:
		log.Warn("mount: second signal, aborting the FUSE connection")
	case <-time.After(time.Until(start.Add(abortAfter))):
		log.Warn("mount: files still open after the unmount, aborting the FUSE connection",
			zap.Duration("after", time.Since(start)))
	}
	abortStop(log, conn, done)
}

// abortStop aborts connection conn and waits abortWait for the server to
// stop; when it does not, the process exits (status 1) without closing the
// store.
func abortStop(log *zap.Logger, conn uint32, done <-chan struct{}) {
	if err := abortConn(conn); err != nil {
		log.Error("mount: abort FUSE connection", zap.Uint32("connection", conn), zap.Error(err))
	}
	select {
	case <-done:
		return
	case <-time.After(abortWait):
	}
	log.Error("mount: the FUSE connection could not be ended; exiting without closing the store (the next mount recovers it)",
		zap.Uint32("connection", conn))
	_ = log.Sync()
	os.Exit(1)
}

// fusectlDir is where fusectl is normally mounted.
const fusectlDir = "/sys/fs/fuse/connections"

// abortConn aborts FUSE connection conn (the minor device number of the
// mount) by writing its fusectl abort file. Where fusectl is not mounted
// (no such connection directory there), a root daemon mounts it itself on
// a temporary directory of its own, aborts, and unmounts it again: fusectl
// has one instance, so any mount of it shows every connection, and
// /sys/fs/fuse/connections stays as it was.
func abortConn(conn uint32) error {
	if conn == 0 {
		return errors.New("no connection number (the mount point could not be stat'ed)")
	}
	name := fmt.Sprintf("%d/abort", conn)
	err := os.WriteFile(filepath.Join(fusectlDir, name), []byte("1"), 0)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return err
	}
	dir, terr := os.MkdirTemp("", "kvfs-fusectl-")
	if terr != nil {
		return fmt.Errorf("%v; no fusectl to mount: %w", err, terr)
	}
	defer os.Remove(dir)
	if merr := unix.Mount("fusectl", dir, "fusectl", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); merr != nil {
		return fmt.Errorf("%v; mount fusectl on %s: %w", err, dir, merr)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	return os.WriteFile(filepath.Join(dir, name), []byte("1"), 0)
}
