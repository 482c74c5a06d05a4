package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// FioConfig describes the fio job that mirrors a Config.
type FioConfig struct {
	Path     string
	Op       string // "read" or "write"
	Pattern  string // "seq" or "random"
	IOSize   int
	QD       int
	Duration time.Duration
	// Region bytes from Offset (default: the rest of the file); it must lie
	// inside the file, or fio would write the file out first.
	Region int64
	Offset int64
	// Buffered drops --direct=1 (for a filesystem without O_DIRECT).
	Buffered bool
	// NumJobs runs that many fio jobs (processes) on the file, each with
	// QD in flight, reported together (default 1).
	NumJobs int
	// Passthrough runs fio's NVMe passthrough engine (io_uring_cmd,
	// cmd_type=nvme) on Path, an NVMe namespace's char device (/dev/ngXnY):
	// the reference for the nvme engine.
	Passthrough bool
	// Fio is the fio binary (default "fio" from $PATH).
	Fio string
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
}

// FileSize is the size of a regular file or block device.
func FileSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	if st.Mode()&os.ModeDevice != 0 {
		n, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
		if err != nil {
			return 0, fmt.Errorf("bench: size of %s: %w", path, err)
		}
		return int64(n), nil
	}
	return st.Size(), nil
}

func (c *FioConfig) validate() error {
	jobDefaults(&c.Op, &c.Pattern, &c.IOSize, &c.QD, &c.Duration)
	if c.Fio == "" {
		c.Fio = "fio"
	}
	if c.Path == "" {
		return fmt.Errorf("%w: no path", ErrConfig)
	}
	size, err := FileSize(c.Path)
	if err != nil {
		return err
	}
	if c.Region == 0 {
		c.Region = size - c.Offset
	}
	c.Region -= c.Region % int64(max(c.IOSize, 1))
	if err := checkShape(c.Op, c.Pattern, c.IOSize, c.QD, c.Duration, c.Offset, c.Region); err != nil {
		return err
	}
	if c.Offset+c.Region > size {
		return fmt.Errorf("%w: region [%d, %d) ends past the %d bytes of %s (fio would write the file out)",
			ErrConfig, c.Offset, c.Offset+c.Region, size, c.Path)
	}
	return nil
}

// rw is fio's --rw value.
func (c *FioConfig) rw() string {
	switch {
	case c.Op == OpRead && c.Pattern == PatternRandom:
		return "randread"
	case c.Op == OpRead:
		return "read"
	case c.Pattern == PatternRandom:
		return "randwrite"
	default:
		return "write"
	}
}

// Args is fio's command line (without the binary) for c, after defaults;
// it validates c first.
func (c *FioConfig) Args() ([]string, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	direct := "1"
	if c.Buffered {
		direct = "0"
	}
	engine := []string{"--ioengine=io_uring", "--direct=" + direct}
	if c.Passthrough {
		engine = []string{"--ioengine=io_uring_cmd", "--cmd_type=nvme"}
	}
	args := append([]string{"--name=kvfs-bench", "--filename=" + c.Path}, engine...)
	args = append(args,
		"--fixedbufs",
		"--registerfiles",
		"--rw="+c.rw(),
		"--bs="+strconv.Itoa(c.IOSize),
		"--iodepth="+strconv.Itoa(c.QD),
		"--size="+strconv.FormatInt(c.Region, 10),
		"--offset="+strconv.FormatInt(c.Offset, 10),
		"--runtime="+strconv.FormatInt(max(c.Duration.Milliseconds(), 1), 10)+"ms",
		"--time_based",
		"--numjobs="+strconv.Itoa(max(c.NumJobs, 1)),
		"--group_reporting",
		"--output-format=json",
	)
	if c.Pattern == PatternRandom {
		// Like Run: fresh offsets each run, drawn with replacement.
		args = append(args, "--randrepeat=0", "--norandommap")
	}
	return append(args, c.ExtraArgs...), nil
}

// RunFio runs fio for c and parses its JSON report.
func RunFio(ctx context.Context, c FioConfig) (Result, error) {
	args, err := c.Args()
	if err != nil {
		return Result{}, err
	}
	cmd := exec.CommandContext(ctx, c.Fio, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return Result{}, fmt.Errorf("bench: %s %v: %w: %s", c.Fio, args, err, bytes.TrimSpace(stderr.Bytes()))
	}
	res, err := ParseFio(stdout.Bytes(), c.Op)
	if err != nil {
		return Result{}, err
	}
	// fio's CPU and that of the job processes it reaped.
	res.CPUs = rusageSeconds(cmd.ProcessState.SysUsage())
	res.CPUsPerGB = PerGB(res.CPUs, res.Bytes)
	res.Pattern, res.IOSize, res.QD = c.Pattern, c.IOSize, c.QD
	return res, nil
}

// ParseFio reads fio's --output-format=json report (the first job's read
// or write side, by op). Text before the JSON (fio warnings) is skipped.
func ParseFio(data []byte, op string) (Result, error) {
	i := bytes.IndexByte(data, '{')
	if i < 0 {
		return Result{}, fmt.Errorf("bench: no JSON in fio output: %q", truncate(data))
	}
	var rep struct {
		Jobs []struct {
			Error int        `json:"error"`
			Read  fioSideRep `json:"read"`
			Write fioSideRep `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(data[i:], &rep); err != nil {
		return Result{}, fmt.Errorf("bench: parse fio JSON: %w", err)
	}
	if len(rep.Jobs) == 0 {
		return Result{}, errors.New("bench: fio report has no jobs")
	}
	job := rep.Jobs[0]
	if job.Error != 0 {
		return Result{}, fmt.Errorf("bench: fio job failed with error %d (%v)", job.Error, unix.Errno(job.Error))
	}
	side := job.Read
	if op == OpWrite {
		side = job.Write
	}
	if side.TotalIOs == 0 && side.IOBytes == 0 {
		return Result{}, fmt.Errorf("bench: fio report has no %s I/O", op)
	}
	res := Result{
		Engine: "fio", Op: op,
		GBps: float64(side.BWBytes) / 1e9, IOPS: side.IOPS,
		Bytes: side.IOBytes, Ops: side.TotalIOs, Seconds: float64(side.RuntimeMs) / 1e3,
	}
	pct := side.Clat.Percentile
	if len(pct) == 0 {
		pct = side.Lat.Percentile
	}
	res.P50us = pct["50.000000"] / 1e3
	res.P99us = pct["99.000000"] / 1e3
	return res, nil
}

type fioSideRep struct {
	IOBytes   int64   `json:"io_bytes"`
	BWBytes   int64   `json:"bw_bytes"`
	IOPS      float64 `json:"iops"`
	RuntimeMs int64   `json:"runtime"`
	TotalIOs  int64   `json:"total_ios"`
	Clat      struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
	Lat struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"lat_ns"`
}

func truncate(b []byte) []byte {
	if len(b) > 200 {
		return b[:200]
	}
	return b
}

// EnsureFio returns the path of fio, installing it with
// `apt-get install -y fio` (after `apt-get update` when the first try
// fails) when it is missing.
func EnsureFio(ctx context.Context, log *zap.Logger) (string, error) {
	if p, err := exec.LookPath("fio"); err == nil {
		return p, nil
	}
	if log == nil {
		log = zap.NewNop()
	}
	apt := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("apt-get %v: %w: %s", args, err, bytes.TrimSpace(truncateTail(out)))
		}
		return nil
	}
	log.Info("bench: fio not found; installing it with apt-get")
	err := apt("install", "-y", "fio")
	if err != nil {
		log.Info("bench: apt-get install failed; updating package lists", zap.Error(err))
		if err = apt("update"); err == nil {
			err = apt("install", "-y", "fio")
		}
	}
	if err != nil {
		return "", fmt.Errorf("bench: install fio: %w", err)
	}
	p, err := exec.LookPath("fio")
	if err != nil {
		return "", fmt.Errorf("bench: fio still missing after install: %w", err)
	}
	return p, nil
}

func truncateTail(b []byte) []byte {
	if len(b) > 500 {
		return b[len(b)-500:]
	}
	return b
}
