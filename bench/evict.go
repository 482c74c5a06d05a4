package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/kvfs/kvfs/store/index"
)

// EvictOptions describe the multi-turn chat trace of RunEvict.
type EvictOptions struct {
	// Policy is the eviction policy under test.
	Policy index.Policy
	// CapacityFrac is the store's capacity in blocks as a fraction of the
	// trace's working set, in (0, 1]: the most blocks its open
	// conversations and the system prompt ever hold at once (what a store
	// that dropped each ended conversation at once would need).
	CapacityFrac float64
	// Conversations is how many conversations are open at once; each
	// request continues one, drawn by popularity rank from Zipf(Alpha).
	Conversations int
	// Alpha is the Zipf exponent of the conversations' popularity.
	Alpha float64
	// SystemBlocks is the length in blocks of the system prompt every
	// conversation starts with.
	SystemBlocks int
	// TurnBlocks is the blocks each request appends to its conversation.
	TurnBlocks int
	// MaxTurns, when positive, ends a conversation after that many
	// requests; a new one takes its popularity rank (the ended one's
	// blocks are never asked for again). 0: conversations never end.
	MaxTurns int
	// Requests is the trace's length.
	Requests int
	// Seed fixes the trace: the same seed gives the same requests under
	// every policy and capacity.
	Seed uint64
}

// DefaultEvictOptions is the trace of docs/performance.md, "Prefix-aware
// eviction".
func DefaultEvictOptions() EvictOptions {
	return EvictOptions{
		Policy: index.Prefix, CapacityFrac: 0.25, Conversations: 100, Alpha: 1.0,
		SystemBlocks: 8, TurnBlocks: 4, Requests: 10000, Seed: 1,
	}
}

// EvictResult is what RunEvict measured.
type EvictResult struct {
	Policy       string  `json:"policy"`
	CapacityFrac float64 `json:"capacity_frac"`
	Capacity     int     `json:"capacity_blocks"`
	WorkingSet   int     `json:"working_set_blocks"`
	Requests     int     `json:"requests"`
	// Asked is the blocks of the prefixes the requests asked for; Served
	// the blocks of each prefix's leading run that the store held (what
	// an engine can use: a block after a missing one is recomputed
	// anyway).
	Asked     uint64  `json:"blocks_asked"`
	Served    uint64  `json:"blocks_served"`
	HitRatio  float64 `json:"hit_ratio"`
	Evictions uint64  `json:"evictions"`
	// NsPerBlock is the index's work per block asked, stored or evicted.
	NsPerBlock float64 `json:"ns_per_block"`
}

func (o EvictOptions) validate() error {
	switch {
	case !(o.CapacityFrac > 0 && o.CapacityFrac <= 1):
		return fmt.Errorf("bench: capacity fraction %v: want (0, 1]", o.CapacityFrac)
	case o.Conversations < 1 || o.Requests < 1 || o.TurnBlocks < 1 || o.MaxTurns < 0 || o.SystemBlocks < 0:
		return fmt.Errorf("bench: conversations, requests and turn blocks must be positive, max turns and system blocks not negative")
	case !(o.Alpha >= 0) || math.IsInf(o.Alpha, 0):
		return fmt.Errorf("bench: zipf alpha %v: want a finite value ≥ 0", o.Alpha)
	}
	return nil
}

// zipf draws ranks 0..n-1 with probability proportional to 1/(rank+1)^alpha
// (math/rand's Zipf needs an exponent above 1; chat popularity is often 1).
type zipf struct {
	cdf []float64
	r   *rand.Rand
}

func newZipf(r *rand.Rand, n int, alpha float64) *zipf {
	z := &zipf{cdf: make([]float64, n), r: r}
	sum := 0.0
	for i := range n {
		sum += 1 / math.Pow(float64(i+1), alpha)
		z.cdf[i] = sum
	}
	for i := range z.cdf {
		z.cdf[i] /= sum
	}
	return z
}

func (z *zipf) next() int {
	u := z.r.Float64()
	i := sort.SearchFloat64s(z.cdf, u)
	return min(i, len(z.cdf)-1)
}

// trace is the requests of one seed: which popularity rank each continues.
func (o EvictOptions) trace() (ranks []int32, workingSet int) {
	r := rand.New(rand.NewPCG(o.Seed, 0x6b766673))
	z := newZipf(r, o.Conversations, o.Alpha)
	ranks = make([]int32, o.Requests)
	turns := make([]int, o.Conversations)
	live := o.SystemBlocks
	for i := range ranks {
		c := z.next()
		ranks[i] = int32(c)
		if o.MaxTurns > 0 && turns[c] == o.MaxTurns {
			live -= turns[c] * o.TurnBlocks
			turns[c] = 0
		}
		turns[c]++
		live += o.TurnBlocks
		workingSet = max(workingSet, live)
	}
	return ranks, workingSet
}

// RunEvict replays a multi-turn chat trace against package store/index, the
// store's own index and victim choice, with no I/O: each request looks up
// its conversation's whole prefix (the system prompt, then every block its
// earlier turns appended), reads the leading run the store holds, stores
// again what it had to recompute and appends TurnBlocks new blocks, each
// naming the block before it as parent. The blocks it stores are one
// write: none of them is evicted to make room for another.
func RunEvict(o EvictOptions) (EvictResult, error) {
	if err := o.validate(); err != nil {
		return EvictResult{}, err
	}
	ranks, ws := o.trace()
	capacity := max(1, int(math.Round(o.CapacityFrac*float64(ws))))
	x := index.New(int64(capacity), o.Policy)
	free := make([]int64, capacity)
	for i := range free {
		free[i] = int64(capacity - 1 - i)
	}
	res := EvictResult{Policy: o.Policy.String(), CapacityFrac: o.CapacityFrac, Capacity: capacity, WorkingSet: ws, Requests: o.Requests}

	// Block ids: the system prompt's are 1..P; a conversation's are drawn
	// from a counter, so no two blocks share an id.
	next := uint64(o.SystemBlocks) + 1
	convs := make([][]uint64, o.Conversations)
	turns := make([]int, o.Conversations)
	var chain []uint64
	inReq := map[int64]bool{}
	skip := func(s int64) bool { return inReq[s] }
	var ops uint64
	start := time.Now()
	for _, rank := range ranks {
		c := int(rank)
		if o.MaxTurns > 0 && turns[c] == o.MaxTurns {
			convs[c], turns[c] = convs[c][:0], 0
		}
		chain = chain[:0]
		for b := range uint64(o.SystemBlocks) {
			chain = append(chain, b+1)
		}
		chain = append(chain, convs[c]...)
		asked := len(chain)
		for range o.TurnBlocks {
			convs[c] = append(convs[c], next)
			chain = append(chain, next)
			next++
		}
		turns[c]++

		// The leading run the store holds, read (touched) in order.
		run := 0
		for run < asked && x.Lookup(chain[run], index.Tag{}) == index.Present {
			run++
		}
		clear(inReq)
		for _, b := range chain[:run] {
			s, _ := x.Slot(b)
			x.Touch(s)
		}
		res.Asked += uint64(asked)
		res.Served += uint64(run)
		ops += uint64(asked)

		// Recomputed and new blocks are stored, each after its parent.
		for i := run; i < len(chain); i++ {
			m := index.Meta{}
			if i > 0 {
				m.HasParent, m.Parent = true, chain[i-1]
			}
			ops++
			if s, ok := x.Slot(chain[i]); ok {
				x.Update(s, m, true)
				inReq[s] = true
				continue
			}
			if len(free) == 0 {
				v := x.Victim(skip)
				if v < 0 {
					break // the write alone fills the store
				}
				x.Remove(v)
				free = append(free, v)
				res.Evictions++
				ops++
			}
			s := free[len(free)-1]
			free = free[:len(free)-1]
			x.Insert(s, chain[i], m, true)
			inReq[s] = true
		}
	}
	if ops > 0 {
		res.NsPerBlock = float64(time.Since(start).Nanoseconds()) / float64(ops)
	}
	if res.Asked > 0 {
		res.HitRatio = float64(res.Served) / float64(res.Asked)
	}
	return res, nil
}
