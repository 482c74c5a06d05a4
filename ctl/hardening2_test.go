package ctl

import (
	"encoding/binary"
	"syscall"
	"testing"

	"github.com/kvfs/kvfs/ctl/abi"
)

// TestTargetLimitAfterChecks: the per-file target limit is the last check
// of REGISTER_TARGET, as docs/abi.md lists them: on a file that holds
// MaxTargets targets a malformed target still gets the errno of what is
// wrong with it (EINVAL, ENOENT, ERANGE), and only a valid one EMFILE.
func TestTargetLimitAfterChecks(t *testing.T) {
	geo := blocksGeo
	f := newBlocksFixture(t, geo, 1, 2, false)
	rb, T, H := geo.RowBytes(), geo.BlockTokens, geo.KVHeads
	tensor := 2 * T * H * rb
	s := newShm(t, 2*geo.Layers*tensor, 0)
	id := mustRegister(t, f.ss, s)
	valid := func() *abi.Target {
		tg := &abi.Target{ABI: abi.Version, NumBlocks: 2, RowBytes: uint32(rb), LayerCount: uint16(geo.Layers), HeadCount: uint16(H),
			BlockStride: uint64(H * T * rb), HeadStride: uint64(T * rb), RowPitch: uint32(rb)}
		for i := range 2 * geo.Layers {
			tg.Regions[i] = abi.TargetRegion{Buffer: id, Offset: uint64(i * tensor)}
		}
		return tg
	}
	reg := func(tg *abi.Target) (uint32, syscall.Errno) {
		in, out := make([]byte, abi.TargetSize), make([]byte, abi.TargetSize)
		tg.Marshal(in)
		_, errno := f.ss.Ioctl(abi.CmdRegisterTarget, in, out)
		return binary.LittleEndian.Uint32(out[abi.TargetOutOff:]), errno
	}
	// The fixture registered one target; fill the file up.
	for range MaxTargets - 1 {
		if _, errno := reg(valid()); errno != 0 {
			t.Fatalf("register target: %v", errno)
		}
	}
	cases := []struct {
		name  string
		bad   func(*abi.Target)
		errno syscall.Errno
	}{
		{"row_bytes", func(tg *abi.Target) { tg.RowBytes++ }, syscall.EINVAL},
		{"reserved", func(tg *abi.Target) { tg.Reserved[0] = 1 }, syscall.EINVAL},
		{"no layers", func(tg *abi.Target) { tg.LayerCount = 0 }, syscall.EINVAL},
		{"strides do not nest", func(tg *abi.Target) { tg.HeadStride = uint64(rb) }, syscall.EINVAL},
		{"regions overlap", func(tg *abi.Target) { tg.Regions[1].Offset = tg.Regions[0].Offset }, syscall.EINVAL},
		{"unknown buffer", func(tg *abi.Target) { tg.Regions[0].Buffer = id + 1000 }, syscall.ENOENT},
		{"past the buffer", func(tg *abi.Target) { tg.NumBlocks = 3 }, syscall.ERANGE},
		{"valid", func(*abi.Target) {}, syscall.EMFILE},
	}
	for _, c := range cases {
		tg := valid()
		c.bad(tg)
		if _, errno := reg(tg); errno != c.errno {
			t.Errorf("%s on a full file: %v, want %v", c.name, errno, c.errno)
		}
	}
}
