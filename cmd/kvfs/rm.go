package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kvfs/kvfs/store"
)

// rmOptions are the flags of kvfs rm.
type rmOptions struct {
	storeFlags
	block string
}

func init() {
	var o rmOptions
	c := &cobra.Command{
		Use:   "rm STORE --block ID",
		Short: "Remove a block (all its groups) from a store",
		Long:  "Remove every group of a block, durably. Exit 1 when the block is not in the store.",
		Args:  storeArg,
		RunE:  func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	c.Flags().StringVar(&o.block, "block", "", "block id: 1 to 16 hex digits, optional 0x prefix")
	_ = c.MarkFlagRequired("block")
	addEngineFlag(c, &o.engine)
	addCommand(c)
}

func (o *rmOptions) run(cmd *cobra.Command, path string) (err error) {
	id, err := parseBlock(o.block)
	if err != nil {
		return err
	}
	s, closeAll, _, err := o.openStore(cmd, path, false)
	if err != nil {
		return err
	}
	defer closeInto(&err, closeAll)
	if _, ok := s.Block(id); !ok {
		return fmt.Errorf("block %016x is not in the store (%w)", id, store.ErrNotFound)
	}
	return s.DeleteBlock(id)
}
