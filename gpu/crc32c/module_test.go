package crc32c

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvfs/kvfs/gpu/cuda"
)

// loadGPU loads the module on device 0, or skips when this machine has no
// CUDA driver or device.
func loadGPU(t testing.TB) *Module {
	t.Helper()
	m, err := Load(0)
	if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("no GPU here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

// devMem is n bytes of device memory holding host (uploaded), freed at the
// end of the test.
func devMem(t testing.TB, m *Module, host []byte) cuda.DevicePtr {
	t.Helper()
	var p cuda.DevicePtr
	err := m.Context().Do(func() error {
		var err error
		if p, err = cuda.MemAlloc(len(host)); err != nil {
			return err
		}
		return cuda.MemcpyHtoD(p, host)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Context().Do(func() error { return cuda.MemFree(p) }) })
	return p
}

func download(t testing.TB, m *Module, p cuda.DevicePtr, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if err := m.Context().Do(func() error { return cuda.MemcpyDtoH(b, p) }); err != nil {
		t.Fatal(err)
	}
	return b
}

func upload(t testing.TB, m *Module, p cuda.DevicePtr, b []byte) {
	t.Helper()
	if err := m.Context().Do(func() error { return cuda.MemcpyHtoD(p, b) }); err != nil {
		t.Fatal(err)
	}
}

// at returns groups moved from offsets to device addresses at base.
func at(base cuda.DevicePtr, gs []Group) []Group {
	out := slices.Clone(gs)
	for i := range out {
		out[i].Addr += uint64(base)
	}
	return out
}

// layoutGroups returns disjoint groups of the sizes the store uses, in a
// buffer of the returned size: 4 KiB and 2 KiB contiguous groups, each
// followed by a 16-byte guard that belongs to no group, and NHD blocks (16
// tokens × 8 heads, head_dim 128 and 64 in bf16), one pitched group a head,
// whose neighbours are the other heads' groups.
func layoutGroups() ([]Group, int) {
	var gs []Group
	o := uint64(0)
	for _, size := range []uint32{4096, 2048} {
		for range 128 {
			gs = append(gs, Group{Addr: o, Rows: 1, RowBytes: size})
			o += uint64(size) + 16
		}
	}
	for _, rb := range []uint64{256, 128} {
		for range 16 {
			for h := range uint64(8) {
				gs = append(gs, Group{Addr: o + h*rb, Pitch: 8 * rb, Rows: 16, RowBytes: uint32(rb)})
			}
			o += 16 * 8 * rb
		}
	}
	return gs, int(o)
}

func TestGPUMatchesReference(t *testing.T) {
	m := loadGPU(t)
	r := rand.New(rand.NewPCG(11, 12))
	gs, size := layoutGroups()
	// Odd geometries too: unaligned addresses, lengths that are no multiple
	// of 16 and pitched rows of any length, overlapping freely.
	for range 400 {
		rows := uint32(1)
		if r.IntN(2) == 0 {
			rows = 1 + r.Uint32N(40)
		}
		rb := r.Uint32N(9000/rows + 1)
		pitch := uint64(rb) + r.Uint64N(300)
		if r.IntN(2) == 0 {
			rb &^= 15
			pitch = (pitch + 15) &^ 15
		}
		g := Group{Rows: rows, RowBytes: rb, Pitch: pitch}
		g.Addr = r.Uint64N(uint64(size) - g.End())
		if r.IntN(2) == 0 {
			g.Addr &^= 15
		}
		gs = append(gs, g)
	}
	host := randMem(r, size)
	base := devMem(t, m, host)
	got, err := m.Sum(at(base, gs))
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		ref, err := Reference(host, g)
		if err != nil {
			t.Fatal(err)
		}
		if want := crc32.Checksum(gather(host, g), castagnoli); got[i] != want || ref != want {
			t.Errorf("group %d %+v (fast %v): gpu %08x, reference %08x, hash/crc32 %08x", i, g, g.fast(), got[i], ref, want)
		}
	}
	t.Logf("%d groups, GPU CRCs equal hash/crc32 and Reference", len(gs))
}

// TestGPUVerifyZeroesExactlyFailed flips one byte in some groups and checks
// that Verify names exactly those, zeroes exactly their bytes and leaves
// every other byte of the buffer (the other groups, the guard bytes between
// groups and the other heads between a pitched group's rows) as it was.
func TestGPUVerifyZeroesExactlyFailed(t *testing.T) {
	m := loadGPU(t)
	r := rand.New(rand.NewPCG(13, 14))
	gs, size := layoutGroups()
	host := randMem(r, size)
	want := make([]uint32, len(gs))
	for i, g := range gs {
		want[i] = crc32.Checksum(gather(host, g), castagnoli)
	}
	// One group of each kind, the first and last, and random others.
	fail := []int{0, 5, 128, 200, 256, 256 + 8*16 + 3, 256 + 8*16 + 7, len(gs) - 1}
	for range 10 {
		fail = append(fail, r.IntN(len(gs)))
	}
	slices.Sort(fail)
	fail = slices.Compact(fail)
	bad := slices.Clone(host)
	for _, i := range fail {
		g := gs[i]
		row := uint64(r.Uint32N(g.Rows))
		bad[g.Addr+row*g.Pitch+uint64(r.Uint32N(g.RowBytes))] ^= byte(1 + r.Uint32N(255))
	}
	base := devMem(t, m, bad)

	idx, got, err := m.Verify(at(base, gs), want)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(idx, fail) {
		t.Fatalf("Verify reported %v, flipped %v", idx, fail)
	}
	for i := range gs {
		if !slices.Contains(fail, i) && got[i] != want[i] {
			t.Fatalf("group %d: got %08x want %08x", i, got[i], want[i])
		}
	}
	expect := slices.Clone(bad)
	for _, i := range fail {
		zeroGroup(expect, gs[i])
	}
	if out := download(t, m, base, size); !bytes.Equal(out, expect) {
		t.Fatalf("after Verify the buffer differs from the expected one at %d bytes", diffCount(out, expect))
	}
	// A second Verify of the repaired buffer against the CRCs of what is
	// now there reports nothing and changes nothing.
	for _, i := range fail {
		want[i] = crc32.Checksum(gather(expect, gs[i]), castagnoli)
	}
	if idx, _, err = m.Verify(at(base, gs), want); err != nil || len(idx) != 0 {
		t.Fatalf("second Verify: %v, %v", idx, err)
	}
	if out := download(t, m, base, size); !bytes.Equal(out, expect) {
		t.Fatal("a clean Verify changed the buffer")
	}
}

func TestGPUZeroExactlyNamedGroups(t *testing.T) {
	m := loadGPU(t)
	r := rand.New(rand.NewPCG(15, 16))
	gs, size := layoutGroups()
	host := randMem(r, size)
	base := devMem(t, m, host)
	pick := []int{1, 130, 256, 256 + 9, 256 + 8*16 + 1, len(gs) - 2}
	var sel []Group
	expect := slices.Clone(host)
	for _, i := range pick {
		sel = append(sel, gs[i])
		zeroGroup(expect, gs[i])
	}
	// Unaligned groups take the kernel's byte path.
	odd := Group{Addr: 4096 + 3, Rows: 1, RowBytes: 100}
	sel = append(sel, odd)
	zeroGroup(expect, odd)
	if err := m.Zero(at(base, sel)); err != nil {
		t.Fatal(err)
	}
	if out := download(t, m, base, size); !bytes.Equal(out, expect) {
		t.Fatalf("after Zero the buffer differs from the expected one at %d bytes", diffCount(out, expect))
	}
}

func TestGPUBadGroupLaunchesNothing(t *testing.T) {
	m := loadGPU(t)
	_, err := m.Sum([]Group{{Addr: 0x1000, Rows: 2, RowBytes: 4096, Pitch: 16}})
	if !errors.Is(err, ErrGroup) {
		t.Fatalf("overlapping rows: %v, want ErrGroup", err)
	}
	if _, _, err := m.Verify([]Group{{Rows: 1, RowBytes: 16}}, nil); err == nil {
		t.Fatal("Verify with no checksums succeeded")
	}
}

func zeroGroup(b []byte, g Group) {
	for r := range uint64(g.Rows) {
		clear(b[g.Addr+r*g.Pitch : g.Addr+r*g.Pitch+uint64(g.RowBytes)])
	}
}

func diffCount(a, b []byte) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

// BenchmarkGPUSum checksums 1 GiB of groups in device memory per operation
// (b.SetBytes), kernel only: the descriptors are already on the GPU.
// Compare with BenchmarkCPUCastagnoli (one core) and
// BenchmarkCPUCastagnoliParallel (every core) in the same run.
func BenchmarkGPUSum(b *testing.B) {
	m := loadGPU(b)
	const total = 1 << 30
	var mem cuda.DevicePtr
	err := m.Context().Do(func() error {
		var err error
		if mem, err = cuda.MemAlloc(total); err != nil {
			return err
		}
		return cuda.MemsetD8(mem, 0x5a, total)
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.Context().Do(func() error { return cuda.MemFree(mem) }) })
	for _, c := range []struct {
		name          string
		size          int
		rows, rb, pit int
	}{
		{"4KiB", 4096, 1, 4096, 0},
		{"2KiB", 2048, 1, 2048, 0},
		{"4KiB-NHD-16x256-pitch2048", 4096, 16, 256, 2048},
		{"2KiB-NHD-16x128-pitch1024", 2048, 16, 128, 1024},
		{"64KiB", 65536, 1, 65536, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			n := total / c.size
			gs := make([]Group, n)
			for i := range gs {
				if c.rows == 1 {
					gs[i] = Group{Addr: uint64(mem) + uint64(i*c.size), Rows: 1, RowBytes: uint32(c.size)}
				} else {
					heads := c.pit / c.rb
					blk, h := i/heads, i%heads
					gs[i] = Group{Addr: uint64(mem) + uint64(blk*c.rows*c.pit+h*c.rb), Pitch: uint64(c.pit), Rows: uint32(c.rows), RowBytes: uint32(c.rb)}
				}
			}
			var desc, got cuda.DevicePtr
			var start, stop cuda.Event
			err := m.Context().Do(func() error {
				var err error
				if desc, err = cuda.MemAlloc(n*GroupSize + 4*n); err != nil {
					return err
				}
				got = desc + cuda.DevicePtr(n*GroupSize)
				if start, err = cuda.EventCreate(0); err != nil {
					return err
				}
				if stop, err = cuda.EventCreate(0); err != nil {
					return err
				}
				return cuda.MemcpyHtoD(desc, AppendGroups(nil, gs))
			})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Context().Do(func() error {
				return errors.Join(cuda.MemFree(desc), start.Destroy(), stop.Destroy())
			})
			b.SetBytes(total)
			var gpuMs float64
			ops := 0
			err = m.Context().Do(func() error {
				if err := m.SumAsync(0, desc, n, got); err != nil { // warm-up
					return err
				}
				if err := cuda.CtxSynchronize(); err != nil {
					return err
				}
				b.ResetTimer()
				for b.Loop() {
					if err := start.Record(0); err != nil {
						return err
					}
					if err := m.SumAsync(0, desc, n, got); err != nil {
						return err
					}
					if err := stop.Record(0); err != nil {
						return err
					}
					if err := stop.Synchronize(); err != nil {
						return err
					}
					ms, err := cuda.ElapsedMs(start, stop)
					if err != nil {
						return err
					}
					gpuMs += float64(ms)
					ops++
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			// The kernel's own time (CUDA events), without launch and wait.
			kernel := time.Duration(gpuMs / float64(ops) * float64(time.Millisecond))
			b.ReportMetric(float64(total)/kernel.Seconds()/1e9, "kernel-GB/s")
			b.ReportMetric(float64(n), "groups")
			// Every group is 0x5a bytes: check one result against the CPU.
			c4 := make([]byte, 4)
			if err := m.Context().Do(func() error { return cuda.MemcpyDtoH(c4, got) }); err != nil {
				b.Fatal(err)
			}
			if w := crc32.Checksum(bytes.Repeat([]byte{0x5a}, c.size), castagnoli); uint32(c4[0])|uint32(c4[1])<<8|uint32(c4[2])<<16|uint32(c4[3])<<24 != w {
				b.Fatalf("group 0: GPU CRC % x, CPU %08x", c4, w)
			}
		})
	}
}
