package crc32c

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvfs/kvfs/gpu/cuda"
)

// newChecker returns a Checker on a new non-blocking stream of m.
func newChecker(t testing.TB, m *Module) (*Checker, cuda.Stream) {
	t.Helper()
	var s cuda.Stream
	if err := m.Context().Do(func() error {
		var err error
		s, err = cuda.StreamCreate(cuda.StreamNonBlocking)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c := m.NewChecker(s)
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
		_ = m.Context().Do(s.Destroy)
	})
	return c, s
}

// TestGPUCheckerVerifyAfterQueuedCopy queues the payload's host-to-device
// copy on the Checker's stream and verifies at once, without waiting: the
// kernel must see the copied bytes (stream order), find exactly the flipped
// groups, zero exactly them, and grow its buffers from a small batch to a
// large one.
func TestGPUCheckerVerifyAfterQueuedCopy(t *testing.T) {
	m := loadGPU(t)
	c, s := newChecker(t, m)
	r := rand.New(rand.NewPCG(17, 18))
	gs, size := layoutGroups()
	host := randMem(r, size)
	want := make([]uint32, len(gs))
	for i, g := range gs {
		want[i] = crc32.Checksum(gather(host, g), castagnoli)
	}
	fail := []int{3, 140, 300, len(gs) - 1}
	bad := slices.Clone(host)
	for _, i := range fail {
		g := gs[i]
		bad[g.Addr+uint64(g.Rows-1)*g.Pitch+uint64(g.RowBytes)-1] ^= 0x80
	}
	base := devMem(t, m, make([]byte, size)) // zeros until the queued copy
	var pinned []byte
	if err := m.Context().Do(func() error {
		var err error
		pinned, err = cuda.MemHostAlloc(size, cuda.MemHostAllocPortable)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Context().Do(func() error { return cuda.MemFreeHost(pinned) }) })
	copy(pinned, bad)
	if err := m.Context().Do(func() error { return cuda.MemcpyHtoDAsync(base, pinned, s) }); err != nil {
		t.Fatal(err)
	}
	dgs := at(base, gs)
	// A small batch first (the clean groups 0..2), then everything.
	idx, err := c.Verify(dgs[:3], want[:3], nil)
	if err != nil || len(idx) != 0 {
		t.Fatalf("first batch: %v, %v", idx, err)
	}
	got := make([]uint32, len(gs))
	idx, err = c.Verify(dgs, want, got)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(idx, fail) {
		t.Fatalf("Verify reported %v, flipped %v", idx, fail)
	}
	expect := slices.Clone(bad)
	for _, i := range fail {
		zeroGroup(expect, gs[i])
		if got[i] == want[i] {
			t.Fatalf("group %d: got equals want", i)
		}
	}
	if out := download(t, m, base, size); !bytes.Equal(out, expect) {
		t.Fatalf("after Verify the buffer differs from the expected one at %d bytes", diffCount(out, expect))
	}
	sums := make([]uint32, len(gs))
	if err := c.Sum(dgs, sums); err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		if w := crc32.Checksum(gather(expect, g), castagnoli); sums[i] != w {
			t.Fatalf("Sum group %d: %08x, want %08x", i, sums[i], w)
		}
	}
}

// BenchmarkGPUCheckerVerify is the cost of verifying one LOAD's worth of
// groups (511 groups of 4 KiB, a block of the default geometry less one)
// with a Checker: upload of descriptors and CRCs, the kernel, the download
// and the wait (ns/op is per batch).
func BenchmarkGPUCheckerVerify(b *testing.B) {
	m := loadGPU(b)
	c, _ := newChecker(b, m)
	const n, size = 511, 4096
	host := randMem(rand.New(rand.NewPCG(19, 20)), n*size)
	base := devMem(b, m, host)
	gs := make([]Group, n)
	want := make([]uint32, n)
	for i := range gs {
		gs[i] = Group{Addr: uint64(base) + uint64(i*size), Rows: 1, RowBytes: size}
		want[i] = crc32.Checksum(host[i*size:(i+1)*size], castagnoli)
	}
	got := make([]uint32, n)
	b.SetBytes(n * size)
	for b.Loop() {
		if bad, err := c.Verify(gs, want, got); err != nil || len(bad) != 0 {
			b.Fatal(bad, err)
		}
	}
}

// TestGPUCheckerLand: packed tiles in device scratch land in a token-major
// (NHD) cache, rows a pitch apart: every good tile's rows where they
// belong, a tile whose bytes differ from its checksum as zeros, reported,
// and every byte no tile names (the heads not landed, a guard after the
// cache) as it was. A 2 KiB geometry and an unaligned packed one too.
func TestGPUCheckerLand(t *testing.T) {
	m := loadGPU(t)
	c, _ := newChecker(t, m)
	for _, tc := range []struct{ rows, rb, heads int }{{16, 256, 8}, {16, 128, 8}, {4, 24, 3}} {
		r := rand.New(rand.NewPCG(uint64(tc.rb), 5))
		const blocks = 40
		gb := tc.rows * tc.rb
		n := blocks * tc.heads
		scratch := randMem(r, n*gb)
		want := make([]uint32, n)
		for i := range want {
			want[i] = crc32.Checksum(scratch[i*gb:(i+1)*gb], castagnoli)
		}
		fail := []int{0, 7, 100, n - 1}
		for _, i := range fail {
			scratch[i*gb+r.IntN(gb)] ^= 0x5a
		}
		pitch := tc.heads * tc.rb
		cacheSize := blocks*tc.rows*pitch + 64
		cache := bytes.Repeat([]byte{0xC3}, cacheSize)
		sp, dp := devMem(t, m, scratch), devMem(t, m, cache)
		// Every head but the last of each block, into cache block
		// blocks-1-b.
		var src, dst []Group
		var idx []int
		for i := range n {
			b, h := i/tc.heads, i%tc.heads
			if h == tc.heads-1 {
				continue
			}
			cb := blocks - 1 - b
			src = append(src, Group{Addr: uint64(sp) + uint64(i*gb), Rows: uint32(tc.rows), RowBytes: uint32(tc.rb), Pitch: uint64(tc.rb)})
			dst = append(dst, Group{Addr: uint64(dp) + uint64(cb*tc.rows*pitch+h*tc.rb), Rows: uint32(tc.rows), RowBytes: uint32(tc.rb), Pitch: uint64(pitch)})
			idx = append(idx, i)
		}
		w := make([]uint32, len(idx))
		for k, i := range idx {
			w[k] = want[i]
		}
		bad, err := c.Land(src, dst, w, nil)
		if err != nil {
			t.Fatal(err)
		}
		var wantBad []int
		for k, i := range idx {
			if slices.Contains(fail, i) {
				wantBad = append(wantBad, k)
			}
		}
		if !slices.Equal(bad, wantBad) {
			t.Fatalf("%v: Land reported %v, want %v", tc, bad, wantBad)
		}
		expect := slices.Clone(cache)
		for k, i := range idx {
			b, h := i/tc.heads, i%tc.heads
			cb := blocks - 1 - b
			for row := range tc.rows {
				o := cb*tc.rows*pitch + row*pitch + h*tc.rb
				if slices.Contains(bad, k) {
					clear(expect[o : o+tc.rb])
				} else {
					copy(expect[o:o+tc.rb], scratch[i*gb+row*tc.rb:i*gb+(row+1)*tc.rb])
				}
			}
		}
		if out := download(t, m, dp, cacheSize); !bytes.Equal(out, expect) {
			t.Fatalf("%v: the cache differs from the expected one at %d bytes", tc, diffCount(out, expect))
		}
	}
	if _, err := c.Land([]Group{{Addr: 4096, Rows: 2, RowBytes: 16, Pitch: 16}}, []Group{{Addr: 8192, Rows: 1, RowBytes: 32}}, []uint32{0}, nil); err == nil {
		t.Fatal("Land of a group into a tile of another shape: no error")
	}
}

// TestGPUCheckerConcurrent: batches of several goroutines at once (each
// its own pinned slot and event, the kernels back to back on the one
// stream) each find exactly their own flipped groups.
func TestGPUCheckerConcurrent(t *testing.T) {
	m := loadGPU(t)
	c, _ := newChecker(t, m)
	r := rand.New(rand.NewPCG(21, 22))
	const n, size, workers = 257, 4096, 8
	host := randMem(r, workers*n*size)
	want := make([]uint32, workers*n)
	for i := range want {
		want[i] = crc32.Checksum(host[i*size:(i+1)*size], castagnoli)
	}
	for w := range workers {
		host[(w*n+w*7+1)*size+5] ^= 0x40 // one flipped group per worker
	}
	base := devMem(t, m, host)
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			gs := make([]Group, n)
			for i := range gs {
				gs[i] = Group{Addr: uint64(base) + uint64((w*n+i)*size), Rows: 1, RowBytes: size}
			}
			for range 50 {
				bad, err := c.Verify(gs, want[w*n:(w+1)*n], nil)
				if err != nil {
					errs <- err
					return
				}
				if len(bad) != 1 || bad[0] != w*7+1 {
					errs <- fmt.Errorf("worker %d: bad %v", w, bad)
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
