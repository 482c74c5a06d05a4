package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/internal/bytesize"
	"github.com/kvfs/kvfs/internal/logsink"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// Shared plumbing of the subcommands: the exit-status rule for errors cobra
// raises itself, flag reset between in-process runs, the global logging
// flags, the --engine flag, the group-key flags and opening a store.

// logOptions are the global logging flags.
type logOptions struct {
	level  string
	format string
}

var logOpts logOptions

func init() {
	pf := root.PersistentFlags()
	pf.StringVar(&logOpts.level, "log-level", "warn", "log level: debug, info, warn or error")
	pf.StringVar(&logOpts.format, "log-format", "console", "log format: console or json")
}

// newLogger builds the logger the global flags ask for, writing to the
// command's stderr (lines that cannot be written are dropped). A bad flag
// value is a usage error.
func newLogger(cmd *cobra.Command) (*zap.Logger, error) {
	return newLoggerTo(logsink.Stream(cmd.ErrOrStderr()))
}

// newLoggerTo is newLogger writing to ws.
func newLoggerTo(ws zapcore.WriteSyncer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(logOpts.level)
	if err != nil {
		return nil, usageErrorf("--log-level %q: want debug, info, warn or error", logOpts.level)
	}
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	switch strings.ToLower(logOpts.format) {
	case "console":
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(ec)
	case "json":
		enc = zapcore.NewJSONEncoder(ec)
	default:
		return nil, usageErrorf("--log-format %q: want console or json", logOpts.format)
	}
	return zap.New(zapcore.NewCore(enc, ws, lvl)), nil
}

// runStarted is set once a command's RunE begins; errors before that point
// come from cobra itself (unknown command, argument count, required or
// malformed flags) and are usage errors.
var (
	runStarted bool
	wrapped    = map[*cobra.Command]bool{}
)

// execute runs the command line args on root and returns its error, marked
// as a usage error when cobra raised it before any command ran.
func execute(args []string) error {
	runStarted = false
	prepare(root)
	root.SetArgs(args)
	err := root.Execute()
	var u usageError
	if err != nil && !runStarted && !errors.As(err, &u) {
		err = usageError{err}
	}
	return err
}

// prepare resets every flag of c and its subcommands to its default (so
// in-process runs do not see the flags of the previous one) and wraps each
// RunE once to record that it started.
func prepare(c *cobra.Command) {
	reset := func(f *pflag.Flag) {
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			_ = sv.Replace(nil)
		} else {
			_ = f.Value.Set(f.DefValue)
		}
		f.Changed = false
	}
	c.Flags().VisitAll(reset)
	c.PersistentFlags().VisitAll(reset)
	if c.RunE != nil && !wrapped[c] {
		wrapped[c] = true
		inner := c.RunE
		c.RunE = func(cmd *cobra.Command, args []string) error {
			runStarted = true
			return inner(cmd, args)
		}
	}
	for _, sub := range c.Commands() {
		prepare(sub)
	}
}

// storeArg accepts exactly one argument, the store path.
func storeArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageErrorf("%s takes exactly one STORE argument (a file or block device), got %d", cmd.Name(), len(args))
	}
	if args[0] == "" {
		return usageErrorf("%s: the STORE path is empty", cmd.Name())
	}
	return nil
}

// addEngineFlag registers --engine.
func addEngineFlag(c *cobra.Command, kind *string) {
	c.Flags().StringVar(kind, "engine", engine.KindAuto, "I/O engine: "+strings.Join(engine.Kinds, ", "))
}

// ringFlags are --rings and --pool-max of the commands that run an engine
// hard (bench, mount).
type ringFlags struct {
	rings       int
	poolMax     string
	asyncReads  string
	inlineReads string
}

func addRingFlags(c *cobra.Command, f *ringFlags) {
	c.Flags().IntVar(&f.rings, "rings", 0, fmt.Sprintf("io_uring instances of the uring/nvme engine, callers spread over them (0: one per 4 usable cores, at most %d)", engine.MaxRings))
	c.Flags().StringVar(&f.asyncReads, "async-reads", "auto", "uring engine: submit reads with IOSQE_ASYNC so io-wq copies page-cache/tmpfs reads on many cores (auto: for page-cache I/O), on, off")
	c.Flags().StringVar(&f.inlineReads, "inline-reads", "auto", "uring and posix engines: read the store with pread on the goroutine that checksums the bytes next, while they are in its cache (auto: for a store in memory, tmpfs or ramfs), on, off")
	c.Flags().StringVar(&f.poolMax, "pool-max", "", "cap of the engine's registered buffer pool, which grows by segments when callers need more (default 1GiB or RAM/8; 0: never grows)")
}

// apply puts the flags into o.
func (f ringFlags) apply(o *engine.Options) error {
	if f.rings < 0 || f.rings > engine.MaxRings {
		return usageErrorf("--rings %d: want 0 (auto) to %d", f.rings, engine.MaxRings)
	}
	o.Rings = f.rings
	switch f.asyncReads {
	case "", "auto", "on", "off":
		o.AsyncReads = f.asyncReads
	default:
		return usageErrorf("--async-reads %q: want auto, on or off", f.asyncReads)
	}
	switch f.inlineReads {
	case "", "auto", "on", "off":
		o.InlineReads = f.inlineReads
	default:
		return usageErrorf("--inline-reads %q: want auto, on or off", f.inlineReads)
	}
	if f.poolMax != "" {
		n, err := bytesize.Parse(f.poolMax)
		if err != nil || n < 0 {
			return usageErrorf("--pool-max %q: want a size like 512MiB, or 0", f.poolMax)
		}
		o.PoolMax = int(n)
		if n == 0 {
			o.PoolMax = -1
		}
	}
	return nil
}

// storeFlags are the flags of every command that opens a store.
type storeFlags struct {
	engine string
}

// openStore locks and opens the store at path. Errors in flag values are
// usage errors; the rest (locked, not a store, damaged) are failures.
func (f storeFlags) openStore(cmd *cobra.Command, path string, readOnly bool) (*store.Store, func() error, *zap.Logger, error) {
	return f.openStoreProgress(cmd, path, readOnly, nil)
}

// openStoreProgress is openStore that reports Open's header scan to
// progress (nil: none).
func (f storeFlags) openStoreProgress(cmd *cobra.Command, path string, readOnly bool, progress func(done, total int64)) (*store.Store, func() error, *zap.Logger, error) {
	log, err := newLogger(cmd)
	if err != nil {
		return nil, nil, nil, err
	}
	kind, err := engine.ParseKind(f.engine)
	if err != nil {
		return nil, nil, nil, usageErrorf("--engine: %v", err)
	}
	s, closeAll, err := engine.OpenStore(path, engine.Options{Kind: kind, ReadOnly: readOnly, Logger: log}, store.Options{Logger: log, OpenProgress: progress, Lease: writerLease(readOnly)})
	if err != nil {
		return nil, nil, nil, err
	}
	return s, closeAll, log, nil
}

// writerLease is the lease check of a writing command: a store another
// host's daemon owns (live lease) is refused with store.ErrLeaseHeld. It
// takes no lease itself (only kvfs mount does), so a command refused for
// bad input leaves the store byte for byte as it was. nil for read-only
// opens.
func writerLease(readOnly bool) *store.LeaseOptions {
	if readOnly {
		return nil
	}
	return &store.LeaseOptions{CheckOnly: true}
}

// closeInto runs closeAll and keeps its error when *err is nil; for defer.
func closeInto(err *error, closeAll func() error) {
	if cerr := closeAll(); cerr != nil && *err == nil {
		*err = cerr
	}
}

// keyFlags name one group: --block, --layer, --head, --kind.
type keyFlags struct {
	block string
	layer int
	head  int
	kind  string
}

func (k *keyFlags) register(c *cobra.Command) {
	f := c.Flags()
	f.StringVar(&k.block, "block", "", "block id: 1 to 16 hex digits, optional 0x prefix")
	f.IntVar(&k.layer, "layer", 0, "layer, from 0")
	f.IntVar(&k.head, "head", 0, "KV head, from 0")
	f.StringVar(&k.kind, "kind", "", "K or V")
	for _, n := range []string{"block", "layer", "head", "kind"} {
		_ = c.MarkFlagRequired(n)
	}
}

// parse parses the flags into a key; every fault is a usage error. Check
// the key against the store's geometry with checkKey.
func (k *keyFlags) parse() (layout.Key, error) {
	id, err := parseBlock(k.block)
	if err != nil {
		return layout.Key{}, err
	}
	kind, err := layout.ParseKind(k.kind)
	if err != nil {
		return layout.Key{}, usageErrorf("--kind %q: want K or V", k.kind)
	}
	if k.layer < 0 || k.head < 0 {
		return layout.Key{}, usageErrorf("--layer and --head count from 0")
	}
	return layout.Key{Block: id, Layer: k.layer, Head: k.head, Kind: kind}, nil
}

// checkKey reports a key outside the store's geometry as a usage error.
func checkKey(g layout.Geometry, key layout.Key) error {
	if err := g.CheckKey(key); err != nil {
		return usageErrorf("%v: the store has %d layers and %d KV heads", err, g.Layers, g.KVHeads)
	}
	return nil
}

// parseBlock parses a --block flag; a bad id is a usage error.
func parseBlock(s string) (uint64, error) {
	id, err := layout.ParseBlockID(s)
	if err != nil {
		return 0, usageErrorf("--block %q: %v", s, err)
	}
	return id, nil
}

// writeJSON writes v indented, with a final newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
