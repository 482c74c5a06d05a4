package crc32c

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// gather returns the bytes of g in mem, row after row.
func gather(mem []byte, g Group) []byte {
	var b []byte
	if g.RowBytes == 0 {
		return nil
	}
	for r := range uint64(g.Rows) {
		a := g.Addr + r*g.Pitch
		b = append(b, mem[a:a+uint64(g.RowBytes)]...)
	}
	return b
}

func checkRef(t testing.TB, mem []byte, g Group) {
	t.Helper()
	got, err := Reference(mem, g)
	if err != nil {
		t.Fatalf("%+v: %v", g, err)
	}
	if want := crc32.Checksum(gather(mem, g), castagnoli); got != want {
		t.Fatalf("%+v (fast %v): reference %08x, hash/crc32 %08x", g, g.fast(), got, want)
	}
}

func randMem(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestReferenceContiguous(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	mem := randMem(r, 1<<20)
	// Every length around the lane and round boundaries, at aligned and
	// unaligned addresses.
	for n := 0; n <= 2200; n++ {
		for _, addr := range []uint64{0, 16, 3} {
			checkRef(t, mem, Group{Addr: addr, Rows: 1, RowBytes: uint32(n)})
		}
	}
	for _, n := range []uint32{4096, 8192, 4096 + 16, 65536, 65536 - 16, 1 << 19, 1<<19 + 7} {
		checkRef(t, mem, Group{Addr: 4096, Rows: 1, RowBytes: n})
		checkRef(t, mem, Group{Addr: 4097, Rows: 1, RowBytes: n})
	}
	for range 300 {
		n := r.Uint32N(70000)
		a := r.Uint64N(uint64(len(mem)) - uint64(n))
		checkRef(t, mem, Group{Addr: a, Rows: 1, RowBytes: n})
		checkRef(t, mem, Group{Addr: a &^ 15, Rows: 1, RowBytes: n &^ 15})
	}
}

func TestReferencePitched(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	mem := randMem(r, 1<<21)
	// The NHD tiles of a paged cache: 16 tokens × head_dim 128 × bf16 at a
	// pitch of kv_heads × 256 bytes, and the 2 KiB tiles of head_dim 64.
	for _, g := range []Group{
		{Addr: 256 * 3, Pitch: 8 * 256, Rows: 16, RowBytes: 256},
		{Addr: 128 * 5, Pitch: 8 * 128, Rows: 16, RowBytes: 128},
		{Addr: 0, Pitch: 512, Rows: 32, RowBytes: 512},
		{Addr: 16, Pitch: 48, Rows: 100, RowBytes: 32},
		{Addr: 16, Pitch: 16, Rows: 300, RowBytes: 16},
		{Addr: 0, Pitch: 4096, Rows: 1, RowBytes: 4096},
		{Addr: 0, Pitch: 0, Rows: 0, RowBytes: 4096},
		{Addr: 0, Pitch: 100, Rows: 7, RowBytes: 0},
		{Addr: 1, Pitch: 8 * 256, Rows: 16, RowBytes: 256},
		{Addr: 0, Pitch: 1000, Rows: 16, RowBytes: 256},
		{Addr: 0, Pitch: 257, Rows: 16, RowBytes: 255},
	} {
		checkRef(t, mem, g)
	}
	for range 500 {
		rows := 1 + r.Uint32N(64)
		rb := r.Uint32N(1200)
		if r.IntN(2) == 0 {
			rb &^= 15
		}
		pitch := uint64(rb) + r.Uint64N(600)
		if r.IntN(2) == 0 {
			pitch &^= 15
			if pitch < uint64(rb) {
				pitch += 16
			}
		}
		g := Group{Rows: rows, RowBytes: rb, Pitch: pitch}
		span := g.End()
		g.Addr = r.Uint64N(uint64(len(mem)) - span)
		if r.IntN(2) == 0 {
			g.Addr &^= 15
		}
		checkRef(t, mem, g)
	}
}

func TestReferenceErrors(t *testing.T) {
	mem := make([]byte, 4096)
	for _, g := range []Group{
		{Addr: 1, Rows: 1, RowBytes: 4096},            // past the end
		{Addr: 0, Pitch: 100, Rows: 2, RowBytes: 200}, // rows overlap
		{Addr: ^uint64(0) - 10, Rows: 1, RowBytes: 100},
		{Addr: 0, Pitch: 1 << 40, Rows: 1 << 30, RowBytes: 16},
		{Addr: 0, Pitch: 1 << 20, Rows: 1 << 20, RowBytes: 1 << 20},
	} {
		if _, err := Reference(mem, g); !errors.Is(err, ErrGroup) {
			t.Errorf("%+v: err %v, want ErrGroup", g, err)
		}
	}
}

// TestKernelConstants checks that crc32c.cu defines the constants this file
// mirrors with the same values.
func TestKernelConstants(t *testing.T) {
	src, err := os.ReadFile("crc32c.cu")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"POLY": poly, "LANES": lanes, "UNIT": unit, "WARPS_PER_BLOCK": warpsPerBlock}
	re := regexp.MustCompile(`(?m)^#define (\w+) (0x[0-9A-Fa-f]+|\d+)u?\b`)
	seen := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		w, ok := want[m[1]]
		if !ok {
			continue
		}
		v, err := strconv.ParseInt(m[2], 0, 64)
		if err != nil {
			t.Fatal(err)
		}
		if v != w {
			t.Errorf("crc32c.cu: %s = %d, reference.go has %d", m[1], v, w)
		}
		seen[m[1]] = true
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("crc32c.cu does not define %s", k)
		}
	}
	if len(tab) != tabWords || tabShared%4 != 0 {
		t.Fatalf("table layout: %d words, shared %d", len(tab), tabShared)
	}
}

func TestAppendGroups(t *testing.T) {
	b := AppendGroups(nil, []Group{{Addr: 0x1122334455667788, Pitch: 0x99, Rows: 3, RowBytes: 0xabcd}, {}})
	if len(b) != 2*GroupSize || b[0] != 0x88 || b[7] != 0x11 || b[8] != 0x99 || b[16] != 3 || b[20] != 0xcd || b[21] != 0xab {
		t.Fatalf("encoding % x", b)
	}
}

// FuzzReference checks the lane split against hash/crc32 for any geometry.
func FuzzReference(f *testing.F) {
	f.Add([]byte("hello, world"), uint64(0), uint32(1), uint32(12), uint64(0))
	f.Add(make([]byte, 4096), uint64(0), uint32(16), uint32(256), uint64(256))
	f.Fuzz(func(t *testing.T, mem []byte, addr uint64, rows, rowBytes uint32, pitch uint64) {
		g := Group{Addr: addr, Rows: rows % 64, RowBytes: rowBytes % 4096, Pitch: pitch % 8192}
		got, err := Reference(mem, g)
		if err != nil {
			if !errors.Is(err, ErrGroup) {
				t.Fatalf("%+v: %v", g, err)
			}
			return
		}
		if want := crc32.Checksum(gather(mem, g), castagnoli); got != want {
			t.Fatalf("%+v: reference %08x, hash/crc32 %08x", g, got, want)
		}
	})
}

func BenchmarkReference4K(b *testing.B) {
	mem := randMem(rand.New(rand.NewPCG(5, 6)), 4096)
	b.SetBytes(4096)
	for b.Loop() {
		Reference(mem, Group{Rows: 1, RowBytes: 4096})
	}
}

// BenchmarkCPUCastagnoli is the CPU's rate for the same work: hash/crc32
// (SSE4.2 CRC32 instructions on amd64) over 4 KiB groups, one core.
func BenchmarkCPUCastagnoli(b *testing.B) {
	mem := randMem(rand.New(rand.NewPCG(5, 6)), 1<<26)
	b.SetBytes(4096)
	i := 0
	for b.Loop() {
		crc32.Checksum(mem[i:i+4096], castagnoli)
		i = (i + 4096) % len(mem)
	}
}

// BenchmarkCPUCastagnoliParallel is the same on every core (GOMAXPROCS).
func BenchmarkCPUCastagnoliParallel(b *testing.B) {
	mem := randMem(rand.New(rand.NewPCG(5, 6)), 1<<26)
	b.SetBytes(4096)
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(len(mem)/4096) * 4096
		for pb.Next() {
			crc32.Checksum(mem[i:i+4096], castagnoli)
			i = (i + 4096) % len(mem)
		}
	})
}

// TestPTXMatchesSource fails when crc32c.cu changed after crc32c.ptx was
// generated (run scripts/gen-ptx.py where NVRTC is), and checks that the
// PTX defines every kernel Load looks up.
func TestPTXMatchesSource(t *testing.T) {
	src, err := os.ReadFile("crc32c.cu")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src)
	m := regexp.MustCompile(`(?m)^// source-sha256: ([0-9a-f]{64})$`).FindSubmatch(PTX)
	if m == nil {
		t.Fatal("crc32c.ptx has no source-sha256 line")
	}
	if got := hex.EncodeToString(sum[:]); string(m[1]) != got {
		t.Fatalf("crc32c.ptx was generated from source %s, crc32c.cu is now %s: run scripts/gen-ptx.py", m[1], got)
	}
	for _, k := range []string{kernelInit, kernelSum, kernelVerify, kernelZero} {
		if !bytes.Contains(PTX, []byte(".entry "+k+"(")) {
			t.Errorf("crc32c.ptx has no kernel %s", k)
		}
	}
	if !bytes.Contains(PTX, []byte("\n.target sm_75")) {
		t.Errorf("crc32c.ptx is not for compute_75")
	}
}

// TestPutGroups: the descriptors, checksums and results a checker moves
// as whole slices (putGroups, putUint32s, getUint32s) are byte for byte
// the kernel's encoding, AppendGroups and little-endian words.
func TestPutGroups(t *testing.T) {
	gs := []Group{
		{Addr: 0x7f00_1234_5000, Pitch: 4096, Rows: 16, RowBytes: 256},
		{Addr: 1<<63 | 0x10, Pitch: 1, Rows: 1, RowBytes: 4096},
		{Addr: 0xdead_beef, Pitch: 0xffff_ffff_ffff, Rows: 0xffff_ffff, RowBytes: 7},
	}
	want := AppendGroups(nil, gs)
	b := make([]byte, len(want)+16)
	if n := putGroups(b, gs); n != len(want) || !bytes.Equal(b[:n], want) {
		t.Fatalf("putGroups wrote %d bytes %x, want %x", n, b[:n], want)
	}
	vs := []uint32{0, 1, 0xdeadbeef, 0xffffffff}
	putUint32s(b, vs)
	for i, v := range vs {
		if got := binary.LittleEndian.Uint32(b[4*i:]); got != v {
			t.Fatalf("putUint32s: word %d is %#x, want %#x", i, got, v)
		}
	}
	back := make([]uint32, len(vs))
	getUint32s(back, b)
	if !slices.Equal(back, vs) {
		t.Fatalf("getUint32s: %x, want %x", back, vs)
	}
}
