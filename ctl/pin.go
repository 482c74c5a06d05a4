package ctl

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// pins accounts the registered memory an engine pinned (fixed buffers),
// daemon-wide and per real uid. A registration is pinned only when it fits
// all of: the daemon-wide cap (Options.MaxPinnedBytes), the uid's share
// (Options.MaxPinnedPerUID), and — unless the caller has CAP_IPC_LOCK, as
// for mlock(2) and io_uring's own buffer registration — the caller's
// RLIMIT_MEMLOCK, against which everything this daemon pinned for the same
// uid counts.
type pins struct {
	max, perUID int64
	mu          sync.Mutex
	total       int64
	byUID       map[uint32]int64
}

func (p *pins) charge(c *cred, n int64) error {
	limit := int64(-1) // none
	if !c.hasCap(capIPCLock) {
		var err error
		if limit, err = memlockOf(c.tgid); err != nil {
			return fmt.Errorf("%w: cannot read RLIMIT_MEMLOCK of process %d: %v", ErrPinLimit, c.tgid, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	have := p.byUID[c.ruid]
	switch {
	case n > p.max-p.total:
		return fmt.Errorf("%w: %d bytes pinned by all callers, %d more asked, daemon limit %d", ErrPinLimit, p.total, n, p.max)
	case n > p.perUID-have:
		return fmt.Errorf("%w: %d bytes pinned for uid %d, %d more asked, per-uid limit %d", ErrPinLimit, have, c.ruid, n, p.perUID)
	case limit >= 0 && n > limit-have:
		return fmt.Errorf("%w: %d bytes pinned for uid %d, %d more asked, caller's RLIMIT_MEMLOCK %d", ErrPinLimit, have, c.ruid, n, limit)
	}
	if p.byUID == nil {
		p.byUID = map[uint32]int64{}
	}
	p.byUID[c.ruid] = have + n
	p.total += n
	return nil
}

func (p *pins) uncharge(uid uint32, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total -= n
	if v := p.byUID[uid] - n; v > 0 {
		p.byUID[uid] = v
	} else {
		delete(p.byUID, uid)
	}
}

func (p *pins) pinned() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total
}

// memlockOf is the soft RLIMIT_MEMLOCK of process pid, -1 for unlimited.
// It reads /proc/<pid>/limits, which anyone may read (prlimit(2) of
// another user's process needs CAP_SYS_RESOURCE).
func memlockOf(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Max locked memory")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 1 {
			break
		}
		if f[0] == "unlimited" {
			return -1, nil
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("limits: %q", line)
		}
		return int64(min(n, 1<<62)), nil
	}
	return 0, fmt.Errorf("no \"Max locked memory\" in /proc/%d/limits", pid)
}

// physicalMemory is the machine's RAM in bytes (0 when unknown).
func physicalMemory() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}
