package gpu

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/gpu/cuda"
	"testing"
)

// TestMain runs a helper process instead of the tests when KVFS_GPU_HELPER
// is set.
func TestMain(m *testing.M) {
	switch os.Getenv("KVFS_GPU_HELPER") {
	case "":
		os.Exit(m.Run())
	case "export":
		os.Exit(exporter())
	case "loader":
		os.Exit(loader())
	default:
		fmt.Println("unknown helper")
		os.Exit(2)
	}
}

// alloc allocates n bytes on device 0 of this process.
func alloc(n int) (cuda.Context, cuda.DevicePtr, error) {
	d, err := cuda.GetDevice(0)
	if err != nil {
		return 0, 0, err
	}
	ctx, err := d.PrimaryCtxRetain()
	if err != nil {
		return 0, 0, err
	}
	var p cuda.DevicePtr
	err = ctx.Do(func() error {
		var err error
		if p, err = cuda.MemAlloc(n); err != nil {
			return err
		}
		return cuda.MemsetD8(p, 0x5a, n)
	})
	return ctx, p, err
}

// exporter allocates KVFS_GPU_SIZE bytes on device 0 (filled with 0x5a),
// prints "handle HEX", then serves commands on stdin, answering "ok" or
// "error ...":
//
//	dump PATH   write the whole allocation to PATH
//	exit        free it and exit
func exporter() int {
	n, _ := strconv.Atoi(os.Getenv("KVFS_GPU_SIZE"))
	ctx, p, err := alloc(n)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	var h cuda.IpcMemHandle
	if err := ctx.Do(func() error {
		var err error
		h, err = cuda.IpcGetMemHandle(p)
		return err
	}); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("handle", hex.EncodeToString(h.Reserved[:]))
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "dump":
			buf := make([]byte, n)
			err := ctx.Do(func() error { return cuda.MemcpyDtoH(buf, p) })
			if err == nil {
				err = os.WriteFile(f[1], buf, 0o600)
			}
			if err != nil {
				fmt.Println("error", err)
				continue
			}
			fmt.Println("ok")
		case len(f) == 1 && f[0] == "exit":
			_ = ctx.Do(func() error { return cuda.MemFree(p) })
			fmt.Println("ok")
			return 0
		default:
			fmt.Println("error unknown command")
		}
	}
	return 0
}

// loader opens the mount KVFS_GPU_MOUNT, registers an NHD target of
// KVFS_GPU_BLOCKS cache blocks in its own GPU memory and loads blocks
// 0..KVFS_GPU_BLOCKS-1 into it until killed, printing "loading" after the
// first call.
func loader() int {
	c, err := client.Open(os.Getenv("KVFS_GPU_MOUNT"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	nb, _ := strconv.Atoi(os.Getenv("KVFS_GPU_BLOCKS"))
	info := c.Info()
	t := info.NHD(nb, 0, info.Geometry.KVHeads)
	tensor := t.RegionBytes(info)
	size := 2 * int64(info.Geometry.Layers) * tensor
	ctx, p, err := alloc(int(size))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	var h cuda.IpcMemHandle
	if err := ctx.Do(func() error {
		var err error
		h, err = cuda.IpcGetMemHandle(p)
		return err
	}); err != nil {
		fmt.Println("error", err)
		return 1
	}
	id, err := c.RegisterCUDA(h.Reserved, 0, uint64(size), 0)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	for i := range 2 * info.Geometry.Layers {
		t.Regions = append(t.Regions, client.Region{Buffer: id, Offset: uint64(int64(i) * tensor)})
	}
	tid, err := c.RegisterTarget(t)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	es := make([]client.BlockEntry, nb)
	for first := true; ; first = false {
		for i := range es {
			es[i] = t.WholeBlock(uint64(i), i)
		}
		if _, err := c.LoadBlocks(tid, es); err != nil {
			fmt.Println("error", err)
			return 1
		}
		if first {
			fmt.Println("loading")
		}
	}
}
