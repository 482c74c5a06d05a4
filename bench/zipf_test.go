package bench

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestPicker: the draws stay in the working set (the first N blocks in id
// order, whatever order the mount listed them in); under Zipf(S) the
// blocks come with the frequencies 1/(k+1)^S asks, and without a working
// set or an exponent the draw is today's uniform one.
func TestPicker(t *testing.T) {
	blocks := make([]uint64, 64)
	for i := range blocks {
		blocks[i] = uint64(1000 - 7*i) // listed in descending order
	}
	p, err := newPicker(LoadConfig{WorkingSet: 16, Zipf: 1}, blocks)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const draws = 200000
	count := map[uint64]int{}
	for range draws {
		count[p.pick(rng)]++
	}
	h := 0.0
	for k := range 16 {
		h += 1 / float64(k+1)
	}
	for k := range 16 {
		b := uint64(1000 - 7*63 + 7*k) // the k-th smallest id
		want := draws / float64(k+1) / h
		if got := float64(count[b]); math.Abs(got-want) > 5*math.Sqrt(want) {
			t.Errorf("rank %d (block %d): %v draws, want about %.0f", k, b, got, want)
		}
		delete(count, b)
	}
	if len(count) != 0 {
		t.Fatalf("draws outside the working set: %v", count)
	}

	u, err := newPicker(LoadConfig{}, blocks)
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := rand.New(rand.NewPCG(3, 4)), rand.New(rand.NewPCG(3, 4))
	for range 100 {
		if got, want := u.pick(r1), blocks[r2.IntN(len(blocks))]; got != want {
			t.Fatalf("uniform draw %d, want %d", got, want)
		}
	}

	if _, err := newPicker(LoadConfig{WorkingSet: 65}, blocks); !errors.Is(err, ErrFewBlocks) {
		t.Fatalf("a working set past the blocks: %v", err)
	}
	for _, s := range []float64{-1, math.NaN(), math.Inf(1)} {
		if _, err := newPicker(LoadConfig{Zipf: s}, blocks); !errors.Is(err, ErrConfig) {
			t.Fatalf("Zipf(%v): %v", s, err)
		}
	}
}

// TestPickDistinct: one prefix's blocks are different blocks of the working
// set, uniform or under Zipf, up to all of them.
func TestPickDistinct(t *testing.T) {
	blocks := make([]uint64, 40)
	for i := range blocks {
		blocks[i] = uint64(500 + 3*i)
	}
	for _, c := range []LoadConfig{{}, {WorkingSet: 20, Zipf: 1.2}} {
		p, err := newPicker(c, blocks)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(5, 6))
		for _, n := range []int{1, 7, len(p.blocks)} {
			out := make([]uint64, n)
			p.pickDistinct(rng, out)
			seen := map[uint64]bool{}
			for _, b := range out {
				if seen[b] || (b-500)%3 != 0 || b >= 500+3*uint64(len(p.blocks)) && c.WorkingSet > 0 {
					t.Fatalf("%+v, %d blocks: %d repeated or outside the working set: %v", c, n, b, out)
				}
				seen[b] = true
			}
		}
	}
}
