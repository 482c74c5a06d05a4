package main

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/layout"
)

// lookupOptions are the flags of kvfs lookup.
type lookupOptions struct {
	json bool
}

func init() {
	var o lookupOptions
	c := &cobra.Command{
		Use:   "lookup MOUNTPOINT [ID[:TAG] ...]",
		Short: "Ask a mounted store which blocks of a sequence it holds (LOOKUP)",
		Long: `Ask the daemon serving MOUNTPOINT, in one LOOKUP call, whether each block is
stored whole (under the given tag, if any), and how many leading blocks are:
the prefix of the sequence a request could reuse. Nothing is read or pinned.

IDs are block ids of 1 to 16 hex digits (optional 0x), in sequence order;
each may carry ":TAG", the 32 hex digits of the tag the block must carry
(without one, any tag matches). With no ID arguments they are read from
standard input, separated by spaces or newlines ('#' starts a comment).

Prints one line per id (id, status: present, absent or tag-mismatch) and the
leading run; --json prints {"count", "run", "present", "absent",
"tag_mismatch", "blocks": [{"block", "tag", "status"}]}. Needs a daemon of
ABI minor 3.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || args[0] == "" {
				return usageErrorf("lookup takes a MOUNTPOINT and block ids")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0], args[1:]) },
	}
	c.Flags().BoolVar(&o.json, "json", false, "print the answer as JSON")
	addCommand(c)
}

// lookupReport is the --json output of kvfs lookup.
type lookupReport struct {
	Count       int           `json:"count"`
	Run         int           `json:"run"`
	Present     int           `json:"present"`
	Absent      int           `json:"absent"`
	TagMismatch int           `json:"tag_mismatch"`
	Blocks      []lookupBlock `json:"blocks"`
}

type lookupBlock struct {
	Block  string `json:"block"`
	Tag    string `json:"tag,omitempty"`
	Status string `json:"status"`
}

func (o *lookupOptions) run(cmd *cobra.Command, mountpoint string, ids []string) (err error) {
	var ps []client.LookupPair
	if len(ids) > 0 {
		ps, err = parseLookupPairs(ids)
	} else {
		ps, err = readLookupPairs(cmd.InOrStdin())
	}
	if err != nil {
		return err
	}
	if len(ps) == 0 {
		return usageErrorf("lookup: no block ids (give them as arguments or on standard input)")
	}
	c, err := client.Open(mountpoint)
	if err != nil {
		return err
	}
	defer closeInto(&err, c.Close)
	if i := c.Info(); !i.Has(abi.CapPrefix) {
		return fmt.Errorf("the daemon serving %s has no LOOKUP (ABI minor %d, without KVFS_CAP_PREFIX)", mountpoint, i.ABIMinor)
	}
	r, err := c.Lookup(ps)
	if err != nil {
		return err
	}
	rep := lookupReport{Count: len(ps), Run: r.Run, Present: r.Present, Absent: r.Absent, TagMismatch: r.Mismatch,
		Blocks: make([]lookupBlock, len(ps))}
	for i, p := range ps {
		b := lookupBlock{Block: fmt.Sprintf("%016x", p.Block), Status: r.Statuses[i].String()}
		if p.Tag != (client.Tag{}) {
			b.Tag = hex.EncodeToString(p.Tag[:])
		}
		rep.Blocks[i] = b
	}
	w := cmd.OutOrStdout()
	if o.json {
		return writeJSON(w, rep)
	}
	for _, b := range rep.Blocks {
		if _, err := fmt.Fprintf(w, "%s %s\n", b.Block, b.Status); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(w, "run %d of %d (present %d, absent %d, tag-mismatch %d)\n", rep.Run, rep.Count, rep.Present, rep.Absent, rep.TagMismatch)
	return err
}

// parseLookupPairs parses ID[:TAG] words.
func parseLookupPairs(words []string) ([]client.LookupPair, error) {
	ps := make([]client.LookupPair, 0, len(words))
	for _, w := range words {
		p, err := parseLookupPair(w)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// parseLookupPair parses one ID[:TAG].
func parseLookupPair(w string) (client.LookupPair, error) {
	var p client.LookupPair
	id, tag, hasTag := strings.Cut(w, ":")
	b, err := layout.ParseBlockID(strings.ToLower(id))
	if err != nil {
		return p, usageErrorf("lookup: %q: %v", w, err)
	}
	p.Block = b
	if hasTag {
		t := strings.TrimPrefix(strings.TrimPrefix(tag, "0x"), "0X")
		if len(t) != 2*len(p.Tag) {
			return p, usageErrorf("lookup: %q: a tag is %d hex digits", w, 2*len(p.Tag))
		}
		if _, err := hex.Decode(p.Tag[:], []byte(t)); err != nil {
			return p, usageErrorf("lookup: %q: tag: %v", w, err)
		}
	}
	return p, nil
}

// readLookupPairs reads ID[:TAG] words from r: separated by white space,
// '#' to the end of a line a comment.
func readLookupPairs(r io.Reader) ([]client.LookupPair, error) {
	var ps []client.LookupPair
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text, _, _ := strings.Cut(sc.Text(), "#")
		for _, w := range strings.Fields(text) {
			p, err := parseLookupPair(w)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			ps = append(ps, p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("lookup: reading block ids: %w", err)
	}
	return ps, nil
}
