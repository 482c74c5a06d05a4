package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvfs/kvfs/store"
)

// putOptions are the flags of kvfs put.
type putOptions struct {
	storeFlags
	keyFlags
	in string
}

func init() {
	var o putOptions
	c := &cobra.Command{
		Use:   "put STORE --block ID --layer L --head H --kind K|V [--in FILE]",
		Short: "Store one group, read from stdin or --in",
		Long: `Store one group durably. The input (stdin, or --in FILE) must be exactly one
group: block_tokens × head_dim × dtype-size bytes (kvfs info shows it).
Input of any other length is refused and nothing is stored (exit 1).`,
		Args: storeArg,
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	o.keyFlags.register(c)
	c.Flags().StringVar(&o.in, "in", "", "read the group from FILE instead of stdin")
	addEngineFlag(c, &o.engine)
	addCommand(c)
}

func (o *putOptions) run(cmd *cobra.Command, path string) (err error) {
	key, err := o.parse()
	if err != nil {
		return err
	}
	s, closeAll, _, err := o.openStore(cmd, path, false)
	if err != nil {
		return err
	}
	defer closeInto(&err, closeAll)
	if err := checkKey(s.Geometry(), key); err != nil {
		return err
	}
	r := cmd.InOrStdin()
	src := "stdin"
	if o.in != "" {
		f, err := os.Open(o.in)
		if err != nil {
			return err
		}
		defer f.Close()
		r, src = f, o.in
	}
	n := s.Geometry().GroupBytes()
	// One byte more than a group tells too long from exact.
	data, err := io.ReadAll(io.LimitReader(r, int64(n)+1))
	if err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	switch {
	case len(data) > n:
		return fmt.Errorf("%w: %s holds more than one group (%d bytes); nothing stored", store.ErrSize, src, n)
	case len(data) < n:
		return fmt.Errorf("%w: %s holds %d bytes, a group is %d; nothing stored", store.ErrSize, src, len(data), n)
	}
	reqs := []store.WriteReq{{Key: key, Data: data}}
	if err := s.Write(reqs); err != nil {
		return err
	}
	if reqs[0].Err != nil {
		return reqs[0].Err // names the group
	}
	return nil
}
