package fs

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"syscall"
)

// Block directories' extended attributes, read-only: user.kvfs.tag (32 hex
// digits, the tag the block was stored under; all zeros when untagged) and
// user.kvfs.parent (16 hex digits, only when the block names a parent).
// They are the block's, so every layer's directory of it shows the same.
// A pending directory (no group stored yet) has none.

// blockXattrs is the value of each attribute the stored block has, in
// listing order.
func (d *blockDir) blockXattrs() (names, values []string) {
	bi, ok := d.fs.st.Block(d.block)
	if !ok {
		return nil, nil
	}
	names = append(names, "user.kvfs.tag")
	values = append(values, hex.EncodeToString(bi.Meta.Tag[:]))
	if bi.Meta.HasParent {
		names = append(names, "user.kvfs.parent")
		values = append(values, fmt.Sprintf("%016x", bi.Meta.Parent))
	}
	return names, values
}

func (d *blockDir) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	names, values := d.blockXattrs()
	i := slices.Index(names, attr)
	if i < 0 {
		return 0, syscall.ENODATA
	}
	v := values[i]
	return xattrReply(dest, v)
}

func (d *blockDir) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	names, _ := d.blockXattrs()
	var b []byte
	for _, n := range names {
		b = append(b, n...)
		b = append(b, 0)
	}
	return xattrReply(dest, b)
}

// Setxattr accepts and ignores user.kvfs.* (computed, as on a group: a copy
// made with cp -a or rsync -X carries them back), like dirBase otherwise.
func (d *blockDir) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return setxattrErrno(attr, true)
}

func (d *blockDir) Removexattr(ctx context.Context, attr string) syscall.Errno {
	names, _ := d.blockXattrs()
	return removexattrErrno(attr, slices.Contains(names, attr))
}
