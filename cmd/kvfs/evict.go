package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvfs/kvfs/bench"
	"github.com/kvfs/kvfs/store/index"
)

// benchEvictOptions are the flags of kvfs bench-evict.
type benchEvictOptions struct {
	policy        string
	capacityFrac  string
	conversations int
	alpha         float64
	systemBlocks  int
	turnBlocks    int
	maxTurns      int
	requests      int
	seed          uint64
	json          bool
}

func init() {
	var o benchEvictOptions
	d := bench.DefaultEvictOptions()
	c := &cobra.Command{
		Use:   "bench-evict [--policy lru|prefix|both] [--capacity-frac F[,F…]] [--conversations C] [--requests N] [--json]",
		Short: "Replay a multi-turn chat trace against the store's index and report the hit ratio",
		Long: `Replay a multi-turn chat trace against the store's own index and eviction
code (package store/index; no store and no I/O) and report the hit ratio.

--conversations C are open at once, each continued by a request with
probability following Zipf(--alpha) over their popularity ranks. Every
conversation starts with the same system prompt of --system-blocks blocks;
each request asks for its conversation's whole prefix (the system prompt and
every block its earlier turns appended), reads the leading run the store
holds, stores again what it had to recompute, and appends --turn-blocks new
blocks, each naming the block before it as its parent. --max-turns N ends a
conversation after N requests (a new one takes its rank; 0: never).

The store holds --capacity-frac of the trace's working set (the most blocks
its open conversations and the system prompt hold at once). The hit ratio is
the blocks served out of the blocks asked, counting only each request's
leading run: a block after a missing one is recomputed anyway.

--policy both runs lru and prefix on the same trace; several comma-separated
fractions run each. One line per run; --json prints one JSON object for a
single run, an array of them for several.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := c.Flags()
	f.StringVar(&o.policy, "policy", "both", "eviction policy: lru, prefix or both")
	f.StringVar(&o.capacityFrac, "capacity-frac", "0.1,0.25,0.5", "store capacity as fractions of the working set, comma-separated, each in (0, 1]")
	f.IntVar(&o.conversations, "conversations", d.Conversations, "conversations open at once")
	f.Float64Var(&o.alpha, "alpha", d.Alpha, "Zipf exponent of the conversations' popularity")
	f.IntVar(&o.systemBlocks, "system-blocks", d.SystemBlocks, "blocks of the shared system prompt")
	f.IntVar(&o.turnBlocks, "turn-blocks", d.TurnBlocks, "blocks each request appends")
	f.IntVar(&o.maxTurns, "max-turns", d.MaxTurns, "end a conversation after N requests (0: never)")
	f.IntVar(&o.requests, "requests", d.Requests, "requests in the trace")
	f.Uint64Var(&o.seed, "seed", d.Seed, "random seed of the trace")
	f.BoolVar(&o.json, "json", false, "print JSON (an object for one run, an array for several)")
	addCommand(c)
}

func (o *benchEvictOptions) run(cmd *cobra.Command) error {
	var policies []index.Policy
	if o.policy == "both" {
		policies = []index.Policy{index.LRU, index.Prefix}
	} else {
		p, err := index.ParsePolicy(o.policy)
		if err != nil {
			return usageErrorf("--policy %q: want lru, prefix or both", o.policy)
		}
		policies = []index.Policy{p}
	}
	var fracs []float64
	for _, s := range strings.Split(o.capacityFrac, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || !(v > 0 && v <= 1) {
			return usageErrorf("--capacity-frac %q: want fractions in (0, 1], comma-separated", o.capacityFrac)
		}
		fracs = append(fracs, v)
	}
	out := cmd.OutOrStdout()
	var results []bench.EvictResult
	for _, frac := range fracs {
		for _, p := range policies {
			opts := bench.EvictOptions{
				Policy: p, CapacityFrac: frac, Conversations: o.conversations, Alpha: o.alpha,
				SystemBlocks: o.systemBlocks, TurnBlocks: o.turnBlocks, MaxTurns: o.maxTurns,
				Requests: o.requests, Seed: o.seed,
			}
			r, err := bench.RunEvict(opts)
			if err != nil {
				return usageErrorf("%v", err)
			}
			if o.json {
				results = append(results, r)
				continue
			}
			fmt.Fprintf(out, "%-6s capacity %4.0f%% (%d of %d blocks): hit ratio %.3f (%d of %d blocks asked), %d evictions, %.0f ns per block\n",
				r.Policy, 100*r.CapacityFrac, r.Capacity, r.WorkingSet, r.HitRatio, r.Served, r.Asked, r.Evictions, r.NsPerBlock)
		}
	}
	switch {
	case !o.json:
		return nil
	case len(results) == 1:
		return writeJSON(out, results[0])
	}
	return writeJSON(out, results)
}
