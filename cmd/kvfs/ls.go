package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// lsOptions are the flags of kvfs ls.
type lsOptions struct {
	storeFlags
	json bool
}

// lsEntry is one block of kvfs ls's output.
type lsEntry struct {
	Block  string    `json:"block"`
	Groups int       `json:"groups"`
	MTime  time.Time `json:"mtime"`
}

func init() {
	var o lsOptions
	c := &cobra.Command{
		Use:   "ls STORE",
		Short: "List the blocks in a store",
		Long: `List the blocks in a store, by id: the 16-hex-digit block id, the number of
its groups present (of layers × kv_heads × 2) and the time of its latest
group write.`,
		Args: storeArg,
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	c.Flags().BoolVar(&o.json, "json", false, "print a JSON array of {block, groups, mtime}")
	addEngineFlag(c, &o.engine)
	addCommand(c)
}

func (o *lsOptions) run(cmd *cobra.Command, path string) (err error) {
	s, closeAll, _, err := o.openStore(cmd, path, true)
	if err != nil {
		return err
	}
	defer closeInto(&err, closeAll)
	blocks := s.Blocks()
	entries := make([]lsEntry, 0, len(blocks))
	for _, b := range blocks {
		entries = append(entries, lsEntry{Block: fmt.Sprintf("%016x", b.ID), Groups: b.Groups, MTime: b.MTime.UTC()})
	}
	w := cmd.OutOrStdout()
	if o.json {
		return writeJSON(w, entries)
	}
	if len(entries) == 0 {
		return nil
	}
	per := s.Geometry().GroupsPerBlock()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BLOCK\tGROUPS\tMTIME")
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\n", e.Block, e.Groups, per, e.MTime.Format(time.RFC3339Nano))
	}
	return tw.Flush()
}
