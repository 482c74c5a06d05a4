package main

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/kvfs/kvfs/store"
)

// getOptions are the flags of kvfs get.
type getOptions struct {
	storeFlags
	keyFlags
	out string
}

func init() {
	var o getOptions
	c := &cobra.Command{
		Use:   "get STORE --block ID --layer L --head H --kind K|V [--out FILE]",
		Short: "Print one group to stdout or --out",
		Long: `Read one group, verify its checksum and write it to stdout (or --out FILE,
replaced atomically). Exit 1 when the group is absent or its checksum
fails; nothing is written then.`,
		Args: storeArg,
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	o.keyFlags.register(c)
	c.Flags().StringVarP(&o.out, "out", "o", "", "write the group to FILE instead of stdout")
	addEngineFlag(c, &o.engine)
	addCommand(c)
}

func (o *getOptions) run(cmd *cobra.Command, path string) (err error) {
	key, err := o.parse()
	if err != nil {
		return err
	}
	s, closeAll, _, err := o.openStore(cmd, path, true)
	if err != nil {
		return err
	}
	defer closeInto(&err, closeAll)
	if err := checkKey(s.Geometry(), key); err != nil {
		return err
	}
	reqs := []store.ReadReq{{Key: key, Buf: make([]byte, s.Geometry().GroupBytes())}}
	if err := s.Read(reqs); err != nil {
		return err
	}
	if reqs[0].Err != nil {
		return reqs[0].Err // names the group
	}
	if o.out == "" {
		_, err := cmd.OutOrStdout().Write(reqs[0].Buf)
		return err
	}
	return writeFileAtomic(o.out, reqs[0].Buf)
}

// writeFileAtomic replaces path with data: a temporary file in the same
// directory, synced, then renamed, so path is never left partial.
func writeFileAtomic(path string, data []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".kvfs-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
