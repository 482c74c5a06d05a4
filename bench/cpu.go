package bench

import (
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// CPUSeconds is the user plus system CPU time this process has used so far
// (getrusage RUSAGE_SELF): every thread, the engine's ring threads and the
// kernel work they do included. Every measurement reports the difference
// over its run as cpu_s, and cpu_s per GB moved.
func CPUSeconds() float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
}

func tvSeconds(tv unix.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }

// rusageSeconds is the user plus system CPU of a reaped child (its
// os.ProcessState.SysUsage), which covers the descendants it waited for.
func rusageSeconds(u any) float64 {
	ru, ok := u.(*syscall.Rusage)
	if !ok || ru == nil {
		return 0
	}
	return float64(ru.Utime.Sec) + float64(ru.Utime.Usec)/1e6 + float64(ru.Stime.Sec) + float64(ru.Stime.Usec)/1e6
}

// PerGB is cpu seconds per 10^9 bytes moved (0 when nothing moved).
func PerGB(cpu float64, bytes int64) float64 {
	if bytes <= 0 {
		return 0
	}
	return cpu / (float64(bytes) / 1e9)
}

// MachineJiffies is the idle and total CPU time of the whole machine so
// far, in clock ticks (/proc/stat's cpu line: user to steal, iowait
// counted idle); ok is false where it cannot be read.
func MachineJiffies() (idle, total uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, false
	}
	for k := 1; k <= 8; k++ { // user nice system idle iowait irq softirq steal
		v, err := strconv.ParseUint(f[k], 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += v
		if k == 4 || k == 5 {
			idle += v
		}
	}
	return idle, total, true
}
