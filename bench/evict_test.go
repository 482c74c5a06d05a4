package bench

import (
	"math"
	"testing"

	"github.com/kvfs/kvfs/store/index"
)

func smallTrace(p index.Policy, frac float64) EvictOptions {
	o := DefaultEvictOptions()
	o.Policy, o.CapacityFrac = p, frac
	o.Conversations, o.Requests = 20, 400
	return o
}

func TestRunEvictAccounts(t *testing.T) {
	for _, p := range []index.Policy{index.LRU, index.Prefix} {
		o := smallTrace(p, 0.25)
		a, err := RunEvict(o)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := RunEvict(o)
		if a.Asked != b.Asked || a.Served != b.Served || a.Evictions != b.Evictions {
			t.Fatalf("%v: one seed gave two traces: %+v, %+v", p, a, b)
		}
		if a.Served > a.Asked || a.Asked == 0 || math.Abs(a.HitRatio-float64(a.Served)/float64(a.Asked)) > 1e-12 {
			t.Fatalf("%v: served %d of %d, hit ratio %v", p, a.Served, a.Asked, a.HitRatio)
		}
		if want := int(math.Round(0.25 * float64(a.WorkingSet))); a.Capacity != want || a.Evictions == 0 {
			t.Fatalf("%v: capacity %d of working set %d (want %d), %d evictions", p, a.Capacity, a.WorkingSet, want, a.Evictions)
		}
		// The working set is every block stored when no conversation ends.
		if a.WorkingSet != o.SystemBlocks+o.Requests*o.TurnBlocks {
			t.Fatalf("working set %d", a.WorkingSet)
		}
		// With room for everything only the first asking of each block misses.
		o.CapacityFrac = 1
		full, _ := RunEvict(o)
		if full.Evictions != 0 || full.Served != full.Asked-uint64(o.SystemBlocks) {
			t.Fatalf("%v at full capacity: %+v", p, full)
		}
	}
	if _, err := RunEvict(EvictOptions{CapacityFrac: 2, Conversations: 1, Requests: 1, TurnBlocks: 1}); err == nil {
		t.Fatal("capacity fraction 2 accepted")
	}
}

// Long conversations re-read whole, in a store that holds a quarter of
// them: LRU evicts the least recently used conversation head first, and a
// request that comes back to it can use nothing past the missing head;
// prefix eviction takes its tail and leaves the head usable.
func TestRunEvictPrefixKeepsHeads(t *testing.T) {
	var hit [2]float64
	for i, p := range []index.Policy{index.LRU, index.Prefix} {
		o := EvictOptions{Policy: p, CapacityFrac: 0.25, Conversations: 10, Alpha: 1,
			SystemBlocks: 4, TurnBlocks: 2, Requests: 300, Seed: 3}
		r, err := RunEvict(o)
		if err != nil {
			t.Fatal(err)
		}
		hit[i] = r.HitRatio
	}
	if hit[1] < hit[0]+0.05 {
		t.Fatalf("hit ratio lru %.3f, prefix %.3f: prefix eviction should keep the heads", hit[0], hit[1])
	}
}

// With conversations that end, the working set is the most blocks open
// conversations hold at once.
func TestRunEvictEndedConversations(t *testing.T) {
	o := smallTrace(index.Prefix, 0.5)
	o.MaxTurns = 3
	r, err := RunEvict(o)
	if err != nil {
		t.Fatal(err)
	}
	if max := o.SystemBlocks + o.Conversations*o.MaxTurns*o.TurnBlocks; r.WorkingSet > max || r.WorkingSet < o.SystemBlocks+o.TurnBlocks {
		t.Fatalf("working set %d, at most %d", r.WorkingSet, max)
	}
}

func BenchmarkEvictTrace(b *testing.B) {
	for _, p := range []index.Policy{index.LRU, index.Prefix} {
		b.Run(p.String(), func(b *testing.B) {
			o := smallTrace(p, 0.25)
			o.Requests = 2000
			for range b.N {
				if _, err := RunEvict(o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
