package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kvfs/kvfs/progress"
	"github.com/kvfs/kvfs/store"
)

// fsckOptions are the flags of kvfs fsck.
type fsckOptions struct {
	storeFlags
	repair bool
	json   bool
}

// fsckProblem is one problem of kvfs fsck's output. Layer, head and kind
// are set for a problem with one group.
type fsckProblem struct {
	Where  string  `json:"where"` // superblock, slot or group
	Slot   *int64  `json:"slot,omitempty"`
	Block  *string `json:"block,omitempty"`
	Layer  *int    `json:"layer,omitempty"`
	Head   *int    `json:"head,omitempty"`
	Kind   string  `json:"kind,omitempty"`
	Reason string  `json:"reason"`
	Fixed  bool    `json:"fixed"`
	Text   string  `json:"text"`
}

// fsckReport is kvfs fsck's output.
type fsckReport struct {
	Clean    bool `json:"clean"`
	Repaired bool `json:"repaired"` // every problem found was repaired
	// FormatVersion is the store's on-disk format version (docs/format.md).
	FormatVersion uint32        `json:"format_version"`
	Slots         int64         `json:"slots"`
	Blocks        int           `json:"blocks"`
	Groups        int           `json:"groups"`
	Problems      []fsckProblem `json:"problems"`
}

// errProblems is fsck's failure: problems found (and not all repaired).
var errProblems = errors.New("problems found")

func init() {
	var o fsckOptions
	c := &cobra.Command{
		Use:   "fsck STORE [--repair]",
		Short: "Check a store's superblocks, slot headers and group checksums",
		Long: `Check both superblock copies, both header copies of every slot and the
checksum of every present group, and list each problem (block, layer,
head, kind, reason). With --repair, rewrite damaged superblock and header
copies from the good ones and drop groups whose checksum fails.

Exit status: 0 clean (or, with --repair, every problem repaired),
1 problems remain.`,
		Args: storeArg,
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	c.Flags().BoolVar(&o.repair, "repair", false, "repair what can be repaired")
	c.Flags().BoolVar(&o.json, "json", false, "print JSON (snake_case keys)")
	addEngineFlag(c, &o.engine)
	addCommand(c)
}

func (o *fsckOptions) run(cmd *cobra.Command, path string) (err error) {
	scan := progress.New(cmd.ErrOrStderr(), "fsck: open", "", progress.Bytes, 0)
	s, closeAll, _, err := o.openStoreProgress(cmd, path, !o.repair, scan.Update)
	if err != nil {
		scan.Clear()
		return err
	}
	scan.Done()
	defer closeInto(&err, closeAll)
	m := progress.New(cmd.ErrOrStderr(), "fsck: check", "", progress.Bytes, 0)
	rep, err := s.FsckProgress(o.repair, m.Update)
	if err != nil {
		m.Clear()
		return err
	}
	m.Done()
	out := newFsckReport(rep)
	w := cmd.OutOrStdout()
	if o.json {
		if err := writeJSON(w, out); err != nil {
			return err
		}
	} else {
		for _, p := range out.Problems {
			fmt.Fprintln(w, p.Text)
		}
		state := "clean"
		switch {
		case out.Repaired:
			state = fmt.Sprintf("%d problems, all repaired", len(out.Problems))
		case !out.Clean:
			state = fmt.Sprintf("%d problems", len(out.Problems))
		}
		fmt.Fprintf(w, "%s: format version %d, %d slots, %d blocks, %d groups checked: %s\n", path, out.FormatVersion, out.Slots, out.Blocks, out.Groups, state)
	}
	if !out.Clean && !out.Repaired {
		return fmt.Errorf("%s: %w (%d)", path, errProblems, len(out.Problems))
	}
	return nil
}

func newFsckReport(r *store.FsckReport) fsckReport {
	out := fsckReport{Clean: r.Clean(), FormatVersion: r.FormatVersion, Slots: r.Slots, Blocks: r.Blocks, Groups: r.Groups, Problems: []fsckProblem{}}
	fixed := 0
	for _, p := range r.Problems {
		fp := fsckProblem{Reason: p.Reason, Fixed: p.Fixed, Text: p.String()}
		switch {
		case p.Key != nil:
			k := *p.Key
			fp.Where = "group"
			block := fmt.Sprintf("%016x", k.Block)
			fp.Block, fp.Layer, fp.Head, fp.Kind = &block, &k.Layer, &k.Head, k.Kind.String()
		case p.Slot < 0:
			fp.Where = "superblock"
		default:
			fp.Where = "slot"
			slot := p.Slot
			fp.Slot = &slot
		}
		if p.Fixed {
			fixed++
		}
		out.Problems = append(out.Problems, fp)
	}
	out.Repaired = !out.Clean && fixed == len(out.Problems)
	return out
}
