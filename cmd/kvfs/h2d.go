package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvfs/kvfs/bench"
	"github.com/kvfs/kvfs/internal/bytesize"
)

// benchH2DOptions are the flags of kvfs bench-h2d.
type benchH2DOptions struct {
	device  int
	sizes   string
	seconds float64
	json    bool
	from    string
}

// h2dResult is one line of kvfs bench-h2d.
type h2dResult struct {
	Device int     `json:"device"`
	Bytes  int64   `json:"bytes"`
	GBps   float64 `json:"gbps"`
}

func init() {
	var o benchH2DOptions
	c := &cobra.Command{
		Use:   "bench-h2d [--device N] [--sizes 256KiB,1MiB,4MiB,16MiB] [--seconds S] [--json]",
		Short: "Measure pinned host-to-device copies on a CUDA device (the reference for GPU loads)",
		Long: `Measure the rate of synchronous host-to-device copies from pinned host memory
(cuMemHostAlloc, portable) into device memory, one size at a time, each for
--seconds: the ceiling a load into GPU memory through pinned staging can
reach. kvfs bench-load --into cuda measures the same thing in its own run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.device < 0 || o.seconds <= 0 {
				return usageErrorf("--device %d, --seconds %g: want ≥ 0 and > 0", o.device, o.seconds)
			}
			var sizes []int64
			for _, f := range strings.Split(o.sizes, ",") {
				n, err := bytesize.Parse(f)
				if err != nil || n < 1 || n > 4<<30 {
					return usageErrorf("--sizes: %q is not a size up to 4GiB", f)
				}
				sizes = append(sizes, n)
			}
			if o.from != "" {
				for _, n := range sizes {
					r, err := bench.MappedH2D(o.device, o.from, int(n), time.Duration(o.seconds*float64(time.Second)))
					if err != nil {
						return err
					}
					fmt.Fprintf(cmd.OutOrStdout(), "mapped H2D cuda:%d %10d bytes per copy from %s: pageable %7.2f GB/s, registered %7.2f GB/s (registering took %v)\n",
						o.device, n, o.from, r.Pageable, r.Registered, r.Register.Round(time.Millisecond))
				}
				return nil
			}
			var out []h2dResult
			for _, n := range sizes {
				g, err := bench.PinnedH2D(o.device, int(n), time.Duration(o.seconds*float64(time.Second)))
				if err != nil {
					return err
				}
				r := h2dResult{Device: o.device, Bytes: n, GBps: g}
				out = append(out, r)
				if !o.json {
					fmt.Fprintf(cmd.OutOrStdout(), "pinned H2D cuda:%d %10d bytes per copy: %7.2f GB/s\n", o.device, n, g)
				}
			}
			if o.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			return nil
		},
	}
	f := c.Flags()
	f.IntVar(&o.device, "device", 0, "CUDA device ordinal")
	f.StringVar(&o.sizes, "sizes", "256KiB,1MiB,4MiB,16MiB", "bytes per copy, comma separated")
	f.Float64Var(&o.seconds, "seconds", 1, "seconds per size")
	f.BoolVar(&o.json, "json", false, "print JSON")
	f.StringVar(&o.from, "from", "", "copy from random places of this file, mapped (pageable, then registered with CUDA) instead of pinned memory")
	addCommand(c)
}
