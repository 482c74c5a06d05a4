package uring

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrUnavailable is wrapped by Available's error.
var ErrUnavailable = errors.New("uring: io_uring unavailable")

var avail struct {
	once sync.Once
	err  error
}

// Available reports whether io_uring can be used by this process: nil, or
// an error wrapping ErrUnavailable and the errno that explains why (ENOSYS:
// kernel without io_uring; EPERM: kernel.io_uring_disabled or a seccomp or
// LSM policy). The answer is computed once.
func Available() error {
	avail.once.Do(func() {
		var p params
		fd, err := sysSetup(1, &p)
		if err == nil {
			_ = unix.Close(fd)
			return
		}
		why := "io_uring_setup failed"
		switch {
		case errors.Is(err, unix.ENOSYS):
			why = "kernel has no io_uring (ENOSYS)"
		case errors.Is(err, unix.EPERM):
			why = "io_uring denied (EPERM): seccomp or LSM policy"
			if b, rerr := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); rerr == nil {
				if v := strings.TrimSpace(string(b)); v != "0" {
					why = "io_uring disabled by sysctl kernel.io_uring_disabled=" + v
				}
			}
		}
		avail.err = fmt.Errorf("%w: %s: %w", ErrUnavailable, why, err)
	})
	return avail.err
}
