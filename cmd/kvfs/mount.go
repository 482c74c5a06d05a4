package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/ctl"
	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/internal/bytesize"
	"github.com/kvfs/kvfs/internal/logsink"
	"github.com/kvfs/kvfs/internal/sdnotify"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/index"
	"github.com/kvfs/kvfs/tier"
)

// mountOptions are the flags of kvfs mount.
type mountOptions struct {
	storeFlags
	ringFlags
	evict                    string
	daemon                   bool
	cpuProfile, mutexProfile string
	allowOther               bool
	metricsAddr              string
	ctlMode                  string
	ctlGroup                 string
	logFile                  string
	wait                     time.Duration
	debugFUSE                bool
	readAhead                string
	maxIO                    string
	maxPinned                string
	gpu                      bool
	gpuStaging               int
	gpuBufSize               string
	gpuDepth                 int
	gpuVerify                string
	gpuDirect                bool
	gpuDirectWorkers         int
	gpuScratch               string
	gpuAhead                 int
	gpuBatch                 bool
	gpuStreams               int
	gpuWait                  string
	hostID                   string
	leaseTTL                 time.Duration
	forceTakeover            bool
	viewReads                bool
	dram                     string
}

// daemonEnv marks the detached child of kvfs mount --daemon.
const daemonEnv = "KVFS_MOUNT_DAEMON_CHILD"

func init() {
	var o mountOptions
	c := &cobra.Command{
		Use:   "mount STORE MOUNTPOINT",
		Short: "Mount a store as a FUSE file system",
		Long: `Mount STORE on MOUNTPOINT: layer-<L>/block-<id>/head-<H>/K|V are the groups,
.kvfs/ctl takes the control ioctls, .kvfs/stats and .kvfs/geometry describe the
store. See the fs package documentation for what each file operation does.

Runs in the foreground until SIGINT or SIGTERM (or kvfs umount), then
unmounts, closes the store durably and exits 0, within 10 s of the signal
whatever the clients do: files still open 2 s after it are detached lazily
(the mount disappears), and at 8 s the FUSE connection is aborted (their
calls fail with ENOTCONN; every call answered before stays done). Where
fusectl is not mounted, a root daemon mounts it on a temporary directory to
abort; a daemon that cannot abort exits without closing the store, which
recovers on the next mount. A second signal aborts at once.

A stale mount left on MOUNTPOINT by a daemon that died ("transport endpoint
is not connected") is detached first.

--daemon starts the same command detached (new session, stdin /dev/null,
output to --log-file) and returns once the mount answers, or fails after
--wait with the end of the log. The default log file is
/var/log/kvfs/<store name>.log as root, else <STORE>.log next to the store.
In the foreground the log goes to stderr, or to --log-file when given.
SIGHUP reopens the log file (after logrotate moved it). A log reader that
goes away (kvfs mount … | head, a closed ssh session) never stops the mount:
SIGPIPE is ignored and lines that cannot be written are dropped.

Under systemd (Type=notify, $NOTIFY_SOCKET set) the mount reports READY=1
once it answers and STOPPING=1 when it unmounts; see dist/kvfs@.service.

As root the mount is made with mount(2); other users need fusermount3
(Debian: apt-get install fuse3) and, for --allow-other, user_allow_other in
/etc/fuse.conf.

The daemon runs its Go scheduler with two Ps (GOMAXPROCS) more than the
usable cores, for the goroutines that wait in system calls (a FUSE reader
always does); the GOMAXPROCS environment variable sets it instead.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 || args[0] == "" || args[1] == "" {
				return usageErrorf("mount takes STORE and MOUNTPOINT, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0], args[1]) },
	}
	f := c.Flags()
	addEngineFlag(c, &o.engine)
	addRingFlags(c, &o.ringFlags)
	f.BoolVar(&o.daemon, "daemon", false, "run detached; return once the mount answers")
	f.BoolVar(&o.allowOther, "allow-other", false, "let other users use the mount (the kernel then checks permissions)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on ADDR (host:port) at /metrics")
	f.StringVar(&o.ctlMode, "ctl-mode", "0600", "permission bits of .kvfs/ctl (octal)")
	f.StringVar(&o.ctlGroup, "ctl-group", "", "group owning .kvfs/ctl (name or gid; default: the mounting user's group)")
	f.StringVar(&o.logFile, "log-file", "", "append the log to this file (reopened on SIGHUP); default: stderr, or for --daemon see above")
	f.DurationVar(&o.wait, "wait", time.Minute, "how long --daemon waits for the mount to answer")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a Go CPU profile of the daemon, from mount to unmount, to FILE (go tool pprof)")
	f.StringVar(&o.mutexProfile, "mutexprofile", "", "write the daemon's mutex contention and blocking profiles, at unmount, to FILE and FILE.block (go tool pprof)")
	f.BoolVar(&o.debugFUSE, "debug-fuse", false, "log every FUSE request (very verbose)")
	f.StringVar(&o.maxIO, "max-io", "2MiB", "largest read or write the store coalesces adjacent groups into (4KiB to 64MiB): one I/O of the engine; 2 MiB, a whole block of a Llama-3-8B-class model, measured faster than 1 MiB on disk (docs/performance.md)")
	f.StringVar(&o.readAhead, "read-ahead", "1MiB", "largest layer extent read with one group file's read, with a 32 MiB cache (0: neither)")
	f.StringVar(&o.maxPinned, "max-pinned", "", "cap on client memory the engine pins for zero-copy I/O, all callers (default half the RAM; one uid gets half of it; see docs/abi.md)")
	f.BoolVar(&o.gpu, "gpu", true, "serve REGISTER_CUDA and loads into GPU memory when the CUDA driver has a device (false: GPU requests fail with ENODEV)")
	f.IntVar(&o.gpuStaging, "gpu-staging-buffers", 32, "pinned staging buffers per GPU (created on the GPU's first registration; shared by all callers, and more let more callers' copies overlap: docs/performance.md)")
	f.StringVar(&o.gpuBufSize, "gpu-staging-size", "16MiB", "bytes of each GPU staging buffer (the default pool pins 512 MiB per GPU)")
	f.IntVar(&o.gpuDepth, "gpu-depth", 16, "staging buffers one GPU load keeps in flight (at most --gpu-staging-buffers)")
	f.StringVar(&o.hostID, "host-id", "", "this host's id in the store's ownership lease (default: the host name; unique per host)")
	f.DurationVar(&o.leaseTTL, "lease-ttl", store.DefaultLeaseTTL, "ownership lease lifetime; the daemon renews it every third of it (docs/scale-out.md)")
	f.BoolVar(&o.forceTakeover, "force-takeover", false, "take the store over from a daemon on another host whose lease is still live (it stops writing at its next renewal)")
	f.IntVar(&o.gpuAhead, "gpu-read-ahead", 4, "staging buffers one store read of a GPU load fills (the storage's I/O in flight per call; at most --gpu-depth)")
	f.IntVar(&o.gpuStreams, "gpu-streams", 1, "copy streams per GPU; concurrent loads and stores take them round robin (1..64)")
	f.StringVar(&o.gpuWait, "gpu-wait", "block", "how a GPU load waits for a staging buffer's copies: block (sleep until the GPU's interrupt) or spin (hold a core until they complete)")
	f.BoolVar(&o.gpuBatch, "gpu-batch-copies", true, "queue the copies of a GPU load that no 2D copy takes (tiles of scattered cache blocks) with one cuMemcpyBatchAsync per staging buffer, where the driver has it (CUDA ≥ 12.8)")
	f.StringVar(&o.gpuVerify, "gpu-verify", "auto", "where loads into GPU memory are checksummed: gpu (the CRC32C kernel, where the groups land; STOREs summed over staging by it too), cpu (the store, in staging), or auto: gpu where the kernel loads, else cpu")
	f.BoolVar(&o.gpuDirect, "gpu-direct", true, "with the checksums on the GPU and a store file in memory (tmpfs, ramfs): register the file with the GPUs (page-locking it) and copy packed tiles straight from it, with no staging")
	f.IntVar(&o.gpuDirectWorkers, "gpu-direct-workers", 4, "goroutines that queue the copies of one direct GPU load (1..64)")
	f.BoolVar(&o.viewReads, "view-reads", true, "with a store file in memory (tmpfs, ramfs) on the uring engine: check and land host reads straight from the daemon's mapping of the file instead of reading them into a chunk buffer first")
	f.StringVar(&o.evict, "evict", "prefix", "eviction order: prefix (leaves of the prefix forest the blocks' parents form, those never read back first, least recently used first, so a shared prefix stays while a continuation of it is stored) or lru (least recently used block)")
	f.StringVar(&o.dram, "dram", "0", "DRAM tier: host memory for whole blocks in front of the store, shared by every client of the mount (e.g. 64GiB; 0: none): host loads and group file reads of a block land from it once one read brought the block in; mapped and faulted in at mount, so more than the machine can give fails the mount")
	f.StringVar(&o.gpuScratch, "gpu-scratch", "512MiB", "GPU memory per device that direct loads of token-major (NHD) and Hugging Face tiles keep as scratch (past it each load reuses its own; more lets HF loads keep more chunks in flight: docs/performance.md)")
	addCommand(c)
}

// storeOptions is the store's options from the mount's flags.
func (o *mountOptions) storeOptions(log *zap.Logger, observe func(store.Op, int, time.Duration), maxIO int) store.Options {
	evict, _ := index.ParsePolicy(o.evict) // checked by run
	return store.Options{Logger: log, Observe: observe, MaxIO: maxIO, NoViewReads: !o.viewReads, Evict: evict,
		Lease: &store.LeaseOptions{Host: o.hostID, TTL: o.leaseTTL, Force: o.forceTakeover}}
}

// gpuOptions checks the --gpu flags.
func (o *mountOptions) gpuOptions() (ctl.GPUOptions, error) {
	n, err := bytesize.Parse(o.gpuBufSize)
	if err != nil || n < 4096 || n > 1<<30 {
		return ctl.GPUOptions{}, usageErrorf("--gpu-staging-size %q: want a size from 4KiB to 1GiB", o.gpuBufSize)
	}
	if o.gpuStaging < 1 || o.gpuStaging > 4096 || o.gpuDepth < 1 || o.gpuAhead < 1 {
		return ctl.GPUOptions{}, usageErrorf("--gpu-staging-buffers %d, --gpu-depth %d, --gpu-read-ahead %d: want 1..4096, ≥ 1, ≥ 1", o.gpuStaging, o.gpuDepth, o.gpuAhead)
	}
	if o.gpuStreams < 1 || o.gpuStreams > 64 {
		return ctl.GPUOptions{}, usageErrorf("--gpu-streams %d: want 1..64", o.gpuStreams)
	}
	if o.gpuWait != "block" && o.gpuWait != "spin" {
		return ctl.GPUOptions{}, usageErrorf("--gpu-wait %q: want block or spin", o.gpuWait)
	}
	scratch, err := bytesize.Parse(o.gpuScratch)
	if err != nil || scratch < 1<<20 || scratch > 1<<40 {
		return ctl.GPUOptions{}, usageErrorf("--gpu-scratch %q: want a size from 1MiB to 1TiB", o.gpuScratch)
	}
	if o.gpuDirectWorkers < 1 || o.gpuDirectWorkers > 64 {
		return ctl.GPUOptions{}, usageErrorf("--gpu-direct-workers %d: want 1..64", o.gpuDirectWorkers)
	}
	if o.gpuVerify != "cpu" && o.gpuVerify != "gpu" && o.gpuVerify != "auto" {
		return ctl.GPUOptions{}, usageErrorf("--gpu-verify %q: want auto, gpu or cpu", o.gpuVerify)
	}
	return ctl.GPUOptions{Disable: !o.gpu, StagingCount: o.gpuStaging, StagingSize: int(n), Depth: min(o.gpuDepth, o.gpuStaging),
		ReadAhead: o.gpuAhead, NoBatch: !o.gpuBatch, Streams: o.gpuStreams, SpinWait: o.gpuWait == "spin", VerifyOnGPU: o.gpuVerify != "cpu",
		VerifyFallback: o.gpuVerify == "auto",
		NoDirect:       !o.gpuDirect, DirectWorkers: o.gpuDirectWorkers, ScratchBudget: int(scratch)}, nil
}

// parseCtl checks --ctl-mode and --ctl-group.
func (o *mountOptions) parseCtl() (os.FileMode, *uint32, error) {
	m, err := strconv.ParseUint(o.ctlMode, 8, 32)
	if err != nil || m > 0o777 {
		return 0, nil, usageErrorf("--ctl-mode %q: want octal permission bits such as 0600 or 0660", o.ctlMode)
	}
	if m == 0 {
		return 0, nil, usageErrorf("--ctl-mode 0 would let nobody but root open .kvfs/ctl")
	}
	if o.ctlGroup == "" {
		return os.FileMode(m), nil, nil
	}
	gid, err := strconv.ParseUint(o.ctlGroup, 10, 32)
	if err != nil {
		g, lerr := user.LookupGroup(o.ctlGroup)
		if lerr != nil {
			return 0, nil, usageErrorf("--ctl-group %q: %v", o.ctlGroup, lerr)
		}
		if gid, err = strconv.ParseUint(g.Gid, 10, 32); err != nil {
			return 0, nil, usageErrorf("--ctl-group %q: gid %q", o.ctlGroup, g.Gid)
		}
	}
	g := uint32(gid)
	return os.FileMode(m), &g, nil
}

// parseMaxPinned checks --max-pinned: ctl.Options.MaxPinnedBytes (0: default).
func (o *mountOptions) parseMaxPinned() (int64, error) {
	if o.maxPinned == "" {
		return 0, nil
	}
	n, err := bytesize.Parse(o.maxPinned)
	if err != nil || n <= 0 {
		return 0, usageErrorf("--max-pinned %q: want a size such as 16GiB", o.maxPinned)
	}
	return n, nil
}

// parseDRAM checks --dram: the tier's bytes, 0 for none.
func (o *mountOptions) parseDRAM() (int64, error) {
	n, err := bytesize.Parse(o.dram)
	if err != nil {
		return 0, usageErrorf("--dram %q: want a size such as 64GiB, or 0", o.dram)
	}
	return n, nil
}

// newTier makes the DRAM tier of --dram in front of s, or returns nil for
// --dram 0.
func newTier(log *zap.Logger, s *store.Store, bytes int64, evict index.Policy) (*tier.Tier, error) {
	if bytes == 0 {
		return nil, nil
	}
	tr, err := tier.New(s, tier.Options{Bytes: bytes, Logger: log, Evict: evict})
	if err != nil {
		return nil, fmt.Errorf("--dram %s: %w", bytesize.Format(bytes), err)
	}
	return tr, nil
}

// parseReadAhead checks --read-ahead: fs.Options.ReadAhead and CacheBytes.
func (o *mountOptions) parseReadAhead() (readAhead, cache int, err error) {
	n, err := bytesize.Parse(o.readAhead)
	if err != nil || n > 1<<30 {
		return 0, 0, usageErrorf("--read-ahead %q: want a size such as 1MiB, at most 1GiB, or 0", o.readAhead)
	}
	if n == 0 {
		return -1, -1, nil
	}
	return int(n), 0, nil
}

func (o *mountOptions) run(cmd *cobra.Command, storePath, mountpoint string) error {
	// A reader of stdout/stderr that goes away must not kill the mount (or
	// --daemon's parent once the daemon runs): with SIGPIPE ignored a write
	// to the closed pipe fails with EPIPE, which the log sink drops.
	signal.Ignore(syscall.SIGPIPE)
	if _, _, err := o.parseCtl(); err != nil {
		return err
	}
	if _, _, err := o.parseReadAhead(); err != nil {
		return err
	}
	if _, err := o.parseMaxPinned(); err != nil {
		return err
	}
	if _, err := o.gpuOptions(); err != nil {
		return err
	}
	if _, err := index.ParsePolicy(o.evict); err != nil {
		return usageErrorf("--evict %q: want prefix or lru", o.evict)
	}
	if o.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(o.metricsAddr); err != nil {
			return usageErrorf("--metrics-addr %q: want host:port (e.g. :9400)", o.metricsAddr)
		}
	}
	if _, err := newLogger(cmd); err != nil {
		return err
	}
	if _, err := engine.ParseKind(o.engine); err != nil {
		return usageErrorf("--engine: %v", err)
	}
	if err := o.ringFlags.apply(&engine.Options{}); err != nil {
		return err
	}
	// The daemon runs in /: profile paths are made absolute here.
	for _, name := range []string{"cpuprofile", "mutexprofile"} {
		if v := cmd.Flags().Lookup(name).Value.String(); v != "" {
			abs, err := filepath.Abs(v)
			if err != nil {
				return err
			}
			if err := cmd.Flags().Set(name, abs); err != nil {
				return err
			}
		}
	}
	if o.daemon && os.Getenv(daemonEnv) == "" {
		return o.startDaemon(cmd, storePath, mountpoint)
	}
	return o.serve(cmd, storePath, mountpoint)
}

// defaultLogFile is where --daemon writes its log.
func defaultLogFile(storePath string) string {
	if os.Geteuid() == 0 {
		name := strings.TrimSuffix(filepath.Base(storePath), filepath.Ext(storePath))
		if name == "" || name == "." || name == "/" {
			name = "kvfs"
		}
		return filepath.Join("/var/log/kvfs", name+".log")
	}
	abs, err := filepath.Abs(storePath)
	if err != nil {
		abs = storePath
	}
	return abs + ".log"
}

// startDaemon re-executes this command detached and waits until the mount
// answers (a stat of MOUNTPOINT/.kvfs/geometry), the child exits, or --wait
// passes.
func (o *mountOptions) startDaemon(cmd *cobra.Command, storePath, mountpoint string) error {
	if stale, err := checkMountpoint(mountpoint); err != nil {
		return err
	} else if stale {
		fmt.Fprintf(cmd.ErrOrStderr(), "kvfs: detached a stale mount on %s (its daemon had died)\n", mountpoint)
	}
	logPath := o.logFile
	if logPath == "" {
		logPath = defaultLogFile(storePath)
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return fmt.Errorf("log directory: %w", err)
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	defer logf.Close()
	start, _ := logf.Seek(0, io.SeekEnd)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	// The daemon runs in / so that it pins no directory: give it absolute
	// paths and the flags this command was given.
	absStore, err := filepath.Abs(storePath)
	if err != nil {
		return err
	}
	absMount, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	args := []string{cmd.Name(), absStore, absMount}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if f.Name != "log-file" {
			args = append(args, "--"+f.Name+"="+f.Value.String())
		}
	})
	// The daemon opens the log itself, to reopen it on SIGHUP; its stderr
	// goes there too (a panic's trace).
	absLog, err := filepath.Abs(logPath)
	if err != nil {
		return err
	}
	args = append(args, "--log-file="+absLog)
	child := exec.Command(exe, args...)
	child.Env = append(os.Environ(), daemonEnv+"=1")
	child.Stdin, child.Stdout, child.Stderr = devnull, logf, logf
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	child.Dir = "/"
	if err := child.Start(); err != nil {
		return fmt.Errorf("start daemon: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	probe := filepath.Join(mountpoint, ".kvfs", "geometry")
	deadline := time.Now().Add(o.wait)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("daemon exited before the mount was ready (%v); log %s:\n%s", err, logPath, logTail(logPath, start))
		case <-time.After(50 * time.Millisecond):
		}
		if mi, ok, _ := fs.FindMount(mountpoint); ok && mi.FSType == "fuse.kvfs" {
			if _, err := os.Stat(probe); err == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "kvfs: mounted %s on %s (pid %d, log %s)\n", storePath, mountpoint, child.Process.Pid, logPath)
				return nil
			}
		}
		if time.Now().After(deadline) {
			_ = child.Process.Signal(syscall.SIGTERM)
			return fmt.Errorf("mount not ready after %v (daemon pid %d stopped); log %s:\n%s", o.wait, child.Process.Pid, logPath, logTail(logPath, start))
		}
	}
}

// logTail returns the last lines a daemon wrote to its log since offset.
func logTail(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || offset > int64(len(b)) {
		return ""
	}
	b = b[offset:]
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return strings.TrimRight(string(b), "\n")
}

// checkMountpoint detaches a stale mount on mountpoint (reporting whether
// there was one) and refuses a mountpoint serving a live kvfs mount.
func checkMountpoint(mountpoint string) (stale bool, err error) {
	if stale, err = fs.CleanStale(mountpoint); err != nil {
		return stale, err
	}
	st, err := os.Stat(mountpoint)
	if err != nil {
		return stale, fmt.Errorf("mountpoint: %w", err)
	}
	if !st.IsDir() {
		return stale, fmt.Errorf("mountpoint %s is not a directory", mountpoint)
	}
	if mi, ok, err := fs.FindMount(mountpoint); err == nil && ok && mi.FSType == "fuse.kvfs" {
		return stale, fmt.Errorf("%s is already a kvfs mount (of %s); kvfs umount it first", mountpoint, mi.Source)
	}
	return stale, nil
}

// syscallProcs is how many Ps (GOMAXPROCS) the daemon runs above the
// runtime's default, the usable cores. A goroutine blocked in a system
// call keeps its P until the runtime's monitor takes it back, 20 µs to
// 10 ms later, and the daemon always has one: go-fuse keeps a reader
// waiting in read(2) on /dev/fuse while others handle requests. With
// GOMAXPROCS at the core count, cores sit idle during a many-caller load
// while calls wait to run; two Ps more remove nearly all of that idle time
// (docs/performance.md, "LOAD_BLOCKS into host memory").
const syscallProcs = 2

// raiseProcs sets GOMAXPROCS to the runtime's default plus syscallProcs,
// unless the GOMAXPROCS environment variable sets it, and returns it.
// A second mount in the same process (the tests) sets the same value.
func raiseProcs() int {
	if os.Getenv("GOMAXPROCS") != "" {
		return runtime.GOMAXPROCS(0)
	}
	n := defaultProcs() + syscallProcs
	runtime.GOMAXPROCS(n)
	return n
}

// defaultProcs is the runtime's GOMAXPROCS before raiseProcs changed it.
var defaultProcs = sync.OnceValue(func() int { return runtime.GOMAXPROCS(0) })

// serve mounts in this process and serves until a signal or an unmount.
func (o *mountOptions) serve(cmd *cobra.Command, storePath, mountpoint string) (err error) {
	sink := logsink.Stream(cmd.ErrOrStderr())
	if o.logFile != "" {
		if sink, err = logsink.Open(o.logFile); err != nil {
			return err
		}
		defer sink.Close()
	}
	log, err := newLoggerTo(sink)
	if err != nil {
		return err
	}
	ctlMode, ctlGID, err := o.parseCtl()
	if err != nil {
		return err
	}
	readAhead, cacheBytes, err := o.parseReadAhead()
	if err != nil {
		return err
	}
	kind, err := engine.ParseKind(o.engine)
	if err != nil {
		return usageErrorf("--engine: %v", err)
	}
	if stale, err := checkMountpoint(mountpoint); err != nil {
		return err
	} else if stale {
		log.Warn("mount: detached a stale mount left by a dead daemon", zap.String("mountpoint", mountpoint))
	}
	abs, err := filepath.Abs(storePath)
	if err != nil {
		return err
	}
	procs := raiseProcs()
	stopProfiles, err := o.startProfiles()
	if err != nil {
		return err
	}
	defer func() {
		if perr := stopProfiles(); perr != nil && err == nil {
			err = perr
		}
	}()

	// Signals are ours from here to the end, store close included: a
	// second one during shutdown aborts the FUSE connection rather than
	// killing the process in the middle of closing the store.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)

	pm := newPromMetrics()
	eo := engine.Options{Kind: kind, Logger: log}
	if err := o.ringFlags.apply(&eo); err != nil {
		return err
	}
	maxIO, err := bytesize.Parse(o.maxIO)
	if err != nil || maxIO < 4<<10 || maxIO > 64<<20 {
		return usageErrorf("--max-io %q: want a size from 4KiB to 64MiB", o.maxIO)
	}
	dram, err := o.parseDRAM()
	if err != nil {
		return err
	}
	so := o.storeOptions(log, pm.observe, int(maxIO))
	s, closeAll, err := engine.OpenStore(storePath, eo, so)
	if err != nil {
		return err
	}
	defer closeInto(&err, closeAll)
	tr, err := newTier(log, s, dram, so.Evict)
	if err != nil {
		return err
	}
	if tr != nil {
		defer tr.Close()
	}

	maxPinned, err := o.parseMaxPinned()
	if err != nil {
		return err
	}
	gpuOpts, err := o.gpuOptions()
	if err != nil {
		return err
	}
	ctlSrv := ctl.NewServer(s, ctl.Options{Logger: log, MaxPinnedBytes: maxPinned, GPU: gpuOpts, Tier: tr})
	defer ctlSrv.Close()
	srv, err := fs.Mount(mountpoint, s, fs.Options{
		Logger: log, Ctl: fs.Handler(ctlSrv.Open), CtlMode: ctlMode, CtlGID: ctlGID,
		AllowOther: o.allowOther, FsName: abs, Debug: o.debugFUSE,
		ReadAhead: readAhead, CacheBytes: cacheBytes, Tier: tr,
	})
	if err != nil {
		return err
	}
	var fuseConn uint32
	var st unix.Stat_t
	if unix.Stat(mountpoint, &st) == nil {
		fuseConn = unix.Minor(st.Dev)
	}
	log.Info("mount: serving", zap.String("store", abs), zap.String("mountpoint", mountpoint),
		zap.String("engine", s.Engine().Name()), zap.Int("pid", os.Getpid()), zap.Int("procs", procs))

	var httpSrv *http.Server
	if o.metricsAddr != "" {
		pm.register(s, srv.FS, ctlSrv, tr)
		if httpSrv, err = serveMetrics(log, o.metricsAddr, pm); err != nil {
			_ = fs.Detach(mountpoint)
			srv.Wait()
			return err
		}
	}

	if sent, err := sdnotify.Notify("READY=1\nMAINPID=" + strconv.Itoa(os.Getpid())); err != nil {
		log.Warn("mount: telling systemd the mount is ready", zap.Error(err))
	} else if sent {
		log.Info("mount: told systemd READY=1")
	}

	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { handleSignals(log, sink, mountpoint, fuseConn, sigs, hups, done) })
	srv.Wait()
	close(done)
	wg.Wait()
	if httpSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = httpSrv.Shutdown(ctx)
		cancel()
	}
	log.Info("mount: unmounted; closing the store", zap.String("mountpoint", mountpoint))
	return nil
}

// startProfiles starts the profiles --cpuprofile and --mutexprofile ask
// for; the function it returns stops them and writes them out.
func (o *mountOptions) startProfiles() (func() error, error) {
	stopCPU := func() {}
	if o.cpuProfile != "" {
		stop, err := startCPUProfile(o.cpuProfile)
		if err != nil {
			return nil, err
		}
		stopCPU = stop
	}
	if o.mutexProfile != "" {
		runtime.SetMutexProfileFraction(1)
		runtime.SetBlockProfileRate(int(time.Microsecond))
	}
	return func() error {
		stopCPU()
		if o.mutexProfile != "" {
			return writeProfiles(o.mutexProfile, "mutex", "block")
		}
		return nil
	}, nil
}

// serveMetrics serves pm's Prometheus text at addr's /metrics until the
// returned server is shut down.
func serveMetrics(log *zap.Logger, addr string, pm *promMetrics) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(pm.reg, promhttp.HandlerOpts{}))
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("mount: metrics server", zap.Error(err))
		}
	}()
	log.Info("mount: metrics", zap.String("addr", ln.Addr().String()))
	return httpSrv, nil
}

// handleSignals runs while the mount serves: SIGINT or SIGTERM unmounts
// (shutdown), SIGHUP reopens the log file; it returns after the unmount it
// started, or when done closes (an unmount from outside).
func handleSignals(log *zap.Logger, sink *logsink.Sink, mountpoint string, fuseConn uint32, sigs, hups <-chan os.Signal, done <-chan struct{}) {
	for {
		select {
		case sig := <-sigs:
			log.Info("mount: signal, unmounting", zap.String("signal", sig.String()))
			_, _ = sdnotify.Notify("STOPPING=1")
			shutdown(log, mountpoint, fuseConn, sigs, done)
			return
		case <-hups:
			if err := sink.Reopen(); err != nil {
				log.Error("mount: SIGHUP: reopening the log file", zap.Error(err))
			} else {
				log.Info("mount: SIGHUP: log file reopened", zap.String("path", sink.Path()))
			}
		case <-done:
			return
		}
	}
}

// promMetrics is what --metrics-addr exports.
type promMetrics struct {
	reg     *prometheus.Registry
	latency *prometheus.HistogramVec
	groups  *prometheus.HistogramVec
}

func newPromMetrics() *promMetrics {
	pm := &promMetrics{reg: prometheus.NewRegistry()}
	pm.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvfs_store_batch_seconds",
		Help:    "Latency of store Read and Write batches.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 20), // 10 µs … 5 s
	}, []string{"op"})
	pm.groups = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvfs_store_batch_groups",
		Help:    "Groups per store Read and Write batch.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14), // 1 … 8192
	}, []string{"op"})
	pm.reg.MustRegister(pm.latency, pm.groups,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return pm
}

// observe is store.Options.Observe.
func (pm *promMetrics) observe(op store.Op, groups int, d time.Duration) {
	name := "read"
	if op == store.OpWrite {
		name = "write"
	}
	pm.latency.WithLabelValues(name).Observe(d.Seconds())
	pm.groups.WithLabelValues(name).Observe(float64(groups))
}

// register exports the store's, the DRAM tier's (zeros without one) and
// the file system's counters, read at scrape time.
func (pm *promMetrics) register(s *store.Store, f *fs.FS, c *ctl.Server, tr *tier.Tier) {
	counter := func(name, help string, v func() uint64) {
		pm.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(v()) }))
	}
	gauge := func(name, help string, v func() float64) {
		pm.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, v))
	}
	sm := s.Metrics
	counter("kvfs_store_reads_total", "Groups read from the store.", func() uint64 { return sm().Reads })
	counter("kvfs_store_writes_total", "Groups written to the store.", func() uint64 { return sm().Writes })
	counter("kvfs_store_read_bytes_total", "Bytes of groups read.", func() uint64 { return sm().BytesRead })
	counter("kvfs_store_written_bytes_total", "Bytes of groups written.", func() uint64 { return sm().BytesWritten })
	counter("kvfs_store_hits_total", "Groups asked for and found.", func() uint64 { return sm().Hits })
	counter("kvfs_store_misses_total", "Groups asked for and absent.", func() uint64 { return sm().Misses })
	counter("kvfs_store_evictions_total", "Blocks evicted to make room.", func() uint64 { return sm().Evictions })
	counter("kvfs_store_corrupt_total", "Groups whose checksum failed on read.", func() uint64 { return sm().Corrupt })
	counter("kvfs_store_tag_mismatch_total", "Reads of a block stored under another tag than the one expected (never served).", func() uint64 { return sm().TagMismatch })
	counter("kvfs_store_io_errors_total", "I/O errors of the store's engine.", func() uint64 { return sm().IOErrors })
	gauge("kvfs_store_slots_used", "Slots holding a block.", func() float64 { return float64(s.Info().UsedSlots) })
	gauge("kvfs_store_slots_free", "Slots free.", func() float64 { return float64(s.Info().FreeSlots) })
	tm := tr.Metrics
	gauge("kvfs_dram_bytes", "Bytes of the DRAM tier (--dram).", func() float64 { return float64(tm().Bytes) })
	gauge("kvfs_dram_blocks", "Blocks the DRAM tier holds.", func() float64 { return float64(tm().Blocks) })
	counter("kvfs_dram_hits_total", "Groups read that landed from the DRAM tier.", func() uint64 { return tm().Hits })
	counter("kvfs_dram_misses_total", "Groups read through the DRAM tier that the store served.", func() uint64 { return tm().Misses })
	counter("kvfs_dram_evictions_total", "Blocks the DRAM tier dropped to make room.", func() uint64 { return tm().Evictions })
	counter("kvfs_dram_invalidations_total", "Copies the DRAM tier dropped because the store's version changed.", func() uint64 { return tm().Invalidations })
	counter("kvfs_dram_promoted_bytes_total", "Bytes read from the store into the DRAM tier.", func() uint64 { return tm().PromotedBytes })
	counter("kvfs_dram_written_bytes_total", "Bytes of whole blocks written through the DRAM tier that it kept.", func() uint64 { return tm().WrittenBytes })
	gauge("kvfs_dram_huge_pages", "1 when the DRAM tier's memory is reserved huge pages.", func() float64 { return b2f(tm().HugePages) })
	gauge("kvfs_dram_registered", "1 when the DRAM tier's memory is registered with the store's io_uring engine.", func() float64 { return b2f(tm().Registered) })
	counter("kvfs_dram_corrupt_total", "Groups whose copy in the DRAM tier failed its checksum (dropped, read from the store).", func() uint64 { return tm().Corrupt })
	fm := f.Metrics
	counter("kvfs_fs_lookups_total", "FUSE lookups.", func() uint64 { return fm().Lookups })
	counter("kvfs_fs_opens_total", "Group files opened.", func() uint64 { return fm().Opens })
	counter("kvfs_fs_reads_total", "FUSE reads of group files.", func() uint64 { return fm().Reads })
	counter("kvfs_fs_read_bytes_total", "Bytes returned by reads of group files.", func() uint64 { return fm().ReadBytes })
	counter("kvfs_fs_stored_total", "Groups stored through files.", func() uint64 { return fm().Stored })
	counter("kvfs_fs_stored_bytes_total", "Bytes of groups stored through files.", func() uint64 { return fm().StoredBytes })
	counter("kvfs_fs_deletes_total", "Groups removed through unlink.", func() uint64 { return fm().Deletes })
	counter("kvfs_fs_rejected_total", "Closes refused for a wrong size.", func() uint64 { return fm().Rejected })
	counter("kvfs_fs_errors_total", "Unexpected errors answered with EIO.", func() uint64 { return fm().Errors })
	counter("kvfs_fs_panics_total", "Requests that panicked (answered EIO).", func() uint64 { return fm().Panics })
	counter("kvfs_fs_cache_hits_total", "Group reads served by the read-ahead cache.", func() uint64 { return fm().CacheHits })
	counter("kvfs_fs_cache_misses_total", "Group reads that went to the store.", func() uint64 { return fm().CacheMisses })
	counter("kvfs_ctl_ioctls_total", "Ioctls on .kvfs/ctl.", func() uint64 { return fm().Ioctls })
	gauge("kvfs_ctl_sessions_open", "Open handles of .kvfs/ctl.", func() float64 { return float64(fm().CtlOpen) })
	cm := c.Metrics
	counter("kvfs_ctl_loads_total", "LOAD ioctls served.", func() uint64 { return cm().Loads })
	counter("kvfs_ctl_stores_total", "STORE ioctls served.", func() uint64 { return cm().Stores })
	counter("kvfs_ctl_groups_loaded_total", "Groups loaded into client memory.", func() uint64 { return cm().GroupsLoaded })
	counter("kvfs_ctl_groups_stored_total", "Groups stored from client memory.", func() uint64 { return cm().GroupsStored })
	counter("kvfs_ctl_bad_entries_total", "Batch entries refused as bad requests.", func() uint64 { return cm().BadEntries })
	counter("kvfs_ctl_lookups_total", "LOOKUP ioctls served.", func() uint64 { return cm().Lookups })
	counter("kvfs_ctl_lookup_pairs_total", "Block ids LOOKUP answered.", func() uint64 { return cm().LookedUp })
	counter("kvfs_ctl_lookup_present_total", "Block ids LOOKUP answered present.", func() uint64 { return cm().LookupHits })
	counter("kvfs_gpu_store_summed_total", "Groups stored from GPU memory whose CRC32C the GPU computed over staging (--gpu-verify gpu or auto).", func() uint64 { return cm().GPUSummed })
	counter("kvfs_gpu_store_sum_failed_total", "Groups stored from GPU memory whose GPU checksum failed, so the CPU computed it.", func() uint64 { return cm().GPUSumFailed })
	counter("kvfs_gpu_direct_groups_total", "Groups loaded into GPU memory straight from the store file in memory, with no staging (--gpu-direct).", func() uint64 { return cm().GPUDirect })
	gauge("kvfs_gpu_host_registered", "1 when the store file in memory is registered with the GPUs for direct loads.", func() float64 {
		if cm().GPUHostRegistered {
			return 1
		}
		return 0
	})
	counter("kvfs_gpu_dram_direct_groups_total", "Groups loaded into GPU memory straight from the DRAM tier's memory (hits), with no staging.", func() uint64 { return cm().GPUTierDirect })
	gauge("kvfs_gpu_dram_registered", "1 when the DRAM tier's memory is registered with the GPUs for direct loads.", func() float64 { return b2f(cm().GPUTierRegistered) })
	counter("kvfs_ctl_rejected_total", "Ioctls refused as a whole.", func() uint64 { return cm().Rejected })
	counter("kvfs_ctl_faults_total", "Faulting accesses to registered memory.", func() uint64 { return cm().Faults })
	gauge("kvfs_ctl_buffers", "Client buffers registered now.", func() float64 { return float64(cm().Buffers) })
	gauge("kvfs_ctl_registered_bytes", "Bytes of client memory registered now.", func() float64 { return float64(cm().RegisteredBytes) })
}

// b2f is 1 for true, 0 for false: a Prometheus gauge of a yes/no state.
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
