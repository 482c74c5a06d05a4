package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
)

// picker draws the blocks of bench-load's calls: uniformly from all the
// mount's blocks (as without LoadConfig.WorkingSet and Zipf), or from a
// working set, the first WorkingSet of the blocks in id order, with
// Zipf(S) popularity: the block of rank k (0 the hottest, the working
// set's order) is drawn with probability proportional to 1/(k+1)^S, so
// that a DRAM tier smaller than the working set has hot blocks to keep.
type picker struct {
	blocks []uint64
	cdf    []float64 // cumulative probabilities of blocks; nil: uniform
}

// newPicker returns the picker of c over the mount's blocks. A working set
// larger than the blocks present wraps ErrFewBlocks; a negative or
// non-finite exponent, or a negative working set, ErrConfig.
func newPicker(c LoadConfig, blocks []uint64) (picker, error) {
	switch {
	case c.WorkingSet < 0:
		return picker{}, fmt.Errorf("%w: working set of %d blocks", ErrConfig, c.WorkingSet)
	case c.Zipf < 0 || math.IsNaN(c.Zipf) || math.IsInf(c.Zipf, 0):
		return picker{}, fmt.Errorf("%w: Zipf exponent %v (want 0, uniform, or above)", ErrConfig, c.Zipf)
	case c.WorkingSet > len(blocks):
		return picker{}, fmt.Errorf("%w: %s holds %d blocks, the working set is %d", ErrFewBlocks, c.Mountpoint, len(blocks), c.WorkingSet)
	case c.WorkingSet == 0 && c.Zipf == 0:
		return picker{blocks: blocks}, nil
	}
	ws := slices.Clone(blocks)
	slices.Sort(ws)
	if c.WorkingSet > 0 {
		ws = ws[:c.WorkingSet]
	}
	p := picker{blocks: ws}
	if c.Zipf == 0 || len(ws) == 0 {
		return p, nil
	}
	p.cdf = make([]float64, len(ws))
	sum := 0.0
	for k := range ws {
		sum += math.Pow(float64(k+1), -c.Zipf)
		p.cdf[k] = sum
	}
	for k := range p.cdf {
		p.cdf[k] /= sum
	}
	p.cdf[len(p.cdf)-1] = 1
	return p, nil
}

// pick draws one block.
func (p picker) pick(rng *rand.Rand) uint64 {
	if p.cdf == nil {
		return p.blocks[rng.IntN(len(p.blocks))]
	}
	return p.blocks[sort.SearchFloat64s(p.cdf, rng.Float64())]
}

// pickDistinct fills out with len(out) different blocks (as the blocks of
// one prefix are), each drawn as pick draws; out must not be longer than
// p.blocks.
func (p picker) pickDistinct(rng *rand.Rand, out []uint64) {
	if p.cdf == nil {
		for i, k := range rng.Perm(len(p.blocks))[:len(out)] {
			out[i] = p.blocks[k]
		}
		return
	}
	seen := make(map[uint64]bool, len(out))
	for i := range out {
		b := p.pick(rng)
		for seen[b] {
			b = p.pick(rng)
		}
		seen[b], out[i] = true, b
	}
}

// describeDraw is the report's line on how the blocks were drawn.
func describeDraw(r LoadResult) string {
	if r.StoredPrefixes > 0 {
		return fmt.Sprintf("each caller's %d prefixes, each stored with one STORE_BLOCKS first, in turn", r.StoredPrefixes)
	}
	how := "uniformly"
	if r.Zipf > 0 {
		how = fmt.Sprintf("with Zipf(%g) popularity", r.Zipf)
	}
	if r.LayersPerCall > 0 {
		how = "without repeats, " + how
	}
	return fmt.Sprintf("blocks drawn %s from a working set of %d of the %d blocks", how, r.WorkingSet, r.Blocks)
}
