package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/internal/bytesize"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/progress"
	"github.com/kvfs/kvfs/store"
)

// kvfs format: flags and messages; engine.FormatPath does the work.

// formatOptions are the flags of kvfs format.
type formatOptions struct {
	storeFlags
	size        string
	layers      int
	kvHeads     int
	headDim     int
	blockTokens int
	dtype       string
	align       int
	force       bool
	zero        bool
}

func init() {
	var o formatOptions
	c := &cobra.Command{
		Use:   "format STORE --size SIZE --layers N --kv-heads N --head-dim N --block-tokens N --dtype DTYPE",
		Short: "Create an empty store in a file or on a block device",
		Long: `Create an empty store with the given geometry in STORE: a file (created or
resized to --size) or a block device (--size optional: the whole device).

Refusals change nothing on disk. Exit status 2 for bad or inconsistent
geometry flags; 1 when STORE already holds a store (pass --force to
overwrite it), when --size (or the device) is smaller than one slot of the
geometry (the message says the minimum), or when the store is in use.

A store file is allocated (fallocate) but not written: until a slot is
stored, the file system answers reads of it with zeros and no disk I/O, and
the first write into it converts the extent (a metadata change its sync
commits). --zero writes zeros over that space once, at format time, so
neither happens: use it for a benchmark's fio reference on the same file,
or to keep first writes as fast as later ones.`,
		Args: storeArg,
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	f := c.Flags()
	f.StringVar(&o.size, "size", "", "bytes to use: 256MiB, 4GiB, … (required for a file; default for a device: all of it)")
	f.IntVar(&o.layers, "layers", 0, "model layers")
	f.IntVar(&o.kvHeads, "kv-heads", 0, "KV heads per layer")
	f.IntVar(&o.headDim, "head-dim", 0, "head dimension")
	f.IntVar(&o.blockTokens, "block-tokens", 0, "tokens per KV-cache block")
	f.StringVar(&o.dtype, "dtype", "", "element type: bf16, fp16, fp32 or fp8")
	f.IntVar(&o.align, "align", layout.DefaultAlign, "alignment of every group in bytes (a power of two, 512 to 1MiB)")
	f.BoolVar(&o.force, "force", false, "overwrite an existing store")
	f.BoolVar(&o.zero, "zero", false, "write zeros over the file's never-written space (files only): every read then reaches the disk, as a benchmark's reference must, and first writes need no extent conversion")
	addEngineFlag(c, &o.engine)
	for _, n := range []string{"layers", "kv-heads", "head-dim", "block-tokens", "dtype"} {
		_ = c.MarkFlagRequired(n)
	}
	addCommand(c)
}

// geometry checks the geometry flags.
func (o *formatOptions) geometry() (layout.Geometry, error) {
	dt, err := layout.ParseDType(o.dtype)
	if err != nil {
		return layout.Geometry{}, usageErrorf("--dtype %q: want bf16, fp16, fp32 or fp8", o.dtype)
	}
	g := layout.Geometry{Layers: o.layers, KVHeads: o.kvHeads, HeadDim: o.headDim, BlockTokens: o.blockTokens, DType: dt, Align: o.align}
	if err := g.Validate(); err != nil {
		return layout.Geometry{}, usageErrorf("%v", err)
	}
	return g, nil
}

func (o *formatOptions) run(cmd *cobra.Command, path string) error {
	log, err := newLogger(cmd)
	if err != nil {
		return err
	}
	g, err := o.geometry()
	if err != nil {
		return err
	}
	kind, err := engine.ParseKind(o.engine)
	if err != nil {
		return usageErrorf("--engine: %v", err)
	}
	var size int64
	if o.size != "" {
		if size, err = bytesize.Parse(o.size); err != nil || size <= 0 {
			return usageErrorf("--size %q: want a positive size like 256MiB or 4GiB", o.size)
		}
	}
	fo := engine.FormatPathOptions{Geometry: g, Size: size, Force: o.force, Zero: o.zero, Engine: engine.Options{Kind: kind, Logger: log}}
	var m *progress.Meter // nil: draws nothing
	if o.zero {
		m = progress.New(cmd.ErrOrStderr(), "format: zero", "", progress.Bytes, 0)
		fo.ZeroProgress = m.Update
	}
	sb, err := engine.FormatPath(path, fo)
	if err != nil {
		m.Clear()
	} else {
		m.Done()
	}
	switch {
	case errors.Is(err, engine.ErrZeroDevice):
		return usageErrorf("--zero: %v", err)
	case errors.Is(err, engine.ErrNeedSize):
		return usageErrorf("--size is required to create %s", path)
	case errors.Is(err, layout.ErrGeometry):
		return usageErrorf("%v", err)
	case errors.Is(err, store.ErrTooSmall) && o.size != "":
		return fmt.Errorf("--size %s: %w", o.size, err)
	case err != nil:
		return err
	}
	zeroed := ""
	if o.zero {
		zeroed = ", every byte written (--zero)"
	}
	fmt.Fprintf(cmd.OutOrStdout(), "formatted %s: %v, %d slots of %s (%d groups of %d bytes each), %s used%s, uuid %s\n",
		path, g, sb.Slots, bytesize.Format(sb.SlotBytes), g.GroupsPerBlock(), g.GroupBytes(), bytesize.Format(sb.DataOffset+sb.Slots*sb.SlotBytes), zeroed, sb.UUIDString())
	return nil
}
