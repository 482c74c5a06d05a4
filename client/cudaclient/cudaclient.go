// Package cudaclient holds the kvfs client calls that need the CUDA driver
// in the client's own process (through gpu/cuda, loaded at run time). It is
// apart from package client so that a program that only loads into host
// memory, or registers GPU memory it exported itself, does not link the CUDA
// binding.
//
// PinHost page-locks a HostBuffer for CUDA (cuMemHostRegister, portable), so
// the client's own host-to-device copies from it run at DMA speed: the
// simplest GPU path, where the daemon reads into the buffer and the client
// drives its copies. The HostBuffer's Close unpins it.
package cudaclient

import (
	"errors"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/gpu/cuda"
)

// PinHost page-locks b's memory for CUDA device ordinal; b.Close unpins it.
// A buffer already pinned is left as it is. It loads the CUDA driver in this
// process (an error wrapping cuda.ErrNoDriver without one).
func PinHost(b *client.HostBuffer, ordinal int) error {
	return b.Pin(func(mem []byte) (func() error, error) {
		d, ctx, err := cuda.RetainPrimary(ordinal)
		if err != nil {
			return nil, err
		}
		if err := ctx.Do(func() error { return cuda.MemHostRegister(mem, cuda.MemHostRegisterPortable) }); err != nil {
			_ = d.PrimaryCtxRelease()
			return nil, err
		}
		return func() error {
			err := ctx.Do(func() error { return cuda.MemHostUnregister(mem) })
			return errors.Join(err, d.PrimaryCtxRelease())
		}, nil
	})
}
