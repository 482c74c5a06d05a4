package main

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu/cuda"
)

// TestMountGPUFlags: bad --gpu-* values are usage errors, caught before
// the store is opened.
func TestMountGPUFlags(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--gpu-staging-size", "1KiB"}, "--gpu-staging-size"},
		{[]string{"--gpu-staging-size", "lots"}, "--gpu-staging-size"},
		{[]string{"--gpu-staging-buffers", "0"}, "--gpu-staging-buffers"},
		{[]string{"--gpu-depth", "0"}, "--gpu-depth"},
		{[]string{"--gpu-verify", "both"}, "--gpu-verify"},
		{[]string{"--gpu-streams", "0"}, "--gpu-streams"},
		{[]string{"--gpu-wait", "poll"}, "--gpu-wait"},
		{[]string{"--gpu-direct-workers", "0"}, "--gpu-direct-workers"},
		{[]string{"--gpu-scratch", "1KiB"}, "--gpu-scratch"},
	} {
		kvfs(t, nil, append([]string{"mount", dir + "/none.kvfs", dir}, c.args...)...).want(t, 2, c.msg)
	}
}

// TestMountGPUOptions: the --gpu-* values that pass reach the GPU options
// the server is given.
func TestMountGPUOptions(t *testing.T) {
	o := mountOptions{gpu: true, gpuBufSize: "16MiB", gpuStaging: 32, gpuDepth: 16, gpuAhead: 4, gpuStreams: 2, gpuWait: "block",
		gpuVerify: "auto", gpuDirect: false, gpuDirectWorkers: 6, gpuScratch: "2GiB"}
	g, err := o.gpuOptions()
	if err != nil {
		t.Fatal(err)
	}
	if g.StagingSize != 16<<20 || g.StagingCount != 32 || g.Depth != 16 || g.ReadAhead != 4 || g.Streams != 2 ||
		!g.VerifyOnGPU || !g.VerifyFallback || !g.NoDirect || g.DirectWorkers != 6 || g.ScratchBudget != 2<<30 {
		t.Fatalf("GPU options %+v", g)
	}
}

// TestBenchLoadIntoFlags: --into is checked before the mount is touched.
func TestBenchLoadIntoFlags(t *testing.T) {
	dir := t.TempDir()
	kvfs(t, nil, "bench-load", dir, "--into", "gpu").want(t, 2, "--into")
	kvfs(t, nil, "bench-load", dir, "--into", "cuda:0").want(t, 2, "--blocks-per-call")
}

// TestRegisterCUDAThroughMount: a GPU request to a daemon without a usable
// GPU fails with ENODEV and a reason, INFO has no KVFS_CAP_CUDA, and the
// session goes on serving (on a machine with a GPU the bogus handle is
// refused with EINVAL instead).
func TestRegisterCUDAThroughMount(t *testing.T) {
	dir, _ := mountForLoad(t)
	c, err := client.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gpu := cuda.Available()
	if c.Info().Has(abi.CapCUDA) != gpu {
		t.Fatalf("KVFS_CAP_CUDA %v on a machine where the driver's device is %v", c.Info().Has(abi.CapCUDA), gpu)
	}
	_, err = c.RegisterCUDA([64]byte{1, 2, 3}, 0, 4096, 0)
	want := syscall.ENODEV
	if gpu {
		want = syscall.EINVAL
	}
	if !errors.Is(err, want) {
		t.Fatalf("register-cuda: %v, want %v", err, want)
	}
	if _, err := c.RegisterCUDA([64]byte{}, 0, 0, 0); !errors.Is(err, syscall.ERANGE) {
		t.Fatalf("zero length: %v", err)
	}
	b, err := c.NewHostBuffer("", 4096)
	if err != nil {
		t.Fatalf("host registration after a refused GPU one: %v", err)
	}
	b.Close()
}

// TestMountStoreOptions: --view-reads=false reaches the store (reads of a
// store file in memory go through the chunk buffers), the lease flags too.
func TestMountStoreOptions(t *testing.T) {
	o := mountOptions{viewReads: true, hostID: "h1", leaseTTL: time.Minute}
	if s := o.storeOptions(nil, nil, 1<<20); s.NoViewReads || s.MaxIO != 1<<20 || s.Lease == nil || s.Lease.Host != "h1" || s.Lease.TTL != time.Minute {
		t.Fatalf("store options %+v", s)
	}
	o.viewReads = false
	if s := o.storeOptions(nil, nil, 1<<20); !s.NoViewReads {
		t.Fatalf("--view-reads=false: store options %+v", s)
	}
}
