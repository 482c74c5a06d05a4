package store_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/tier"
)

// TestCrashAtEveryWriteTier is TestCrashAtEveryWrite with the workload's
// writes and deletes through a DRAM tier of 2 blocks in front of the
// store (package tier, as kvfs mount --dram puts it): the workload's 6
// blocks evict each other from the tier, and the store writes the whole
// blocks the tier keeps from the tier's memory. Until the device crashes,
// every group of every block reads through the tier as acknowledged; the
// device images after the crash recover as without a tier (the tier is a
// cache: a crash loses it and nothing acknowledged).
func TestCrashAtEveryWriteTier(t *testing.T) {
	for _, c := range []struct {
		name  string
		slots int
	}{{"roomy", 12}, {"evicting", 4}} {
		t.Run(c.name, func(t *testing.T) { crashAtEveryWriteTier(t, c.slots) })
	}
}

func crashAtEveryWriteTier(t *testing.T, slots int) {
	work := crashWorkload()
	evicting := slots < 7
	withTier := func(s *store.Store) *tier.Tier {
		tr, err := tier.New(s, tier.Options{Bytes: 2 * testGeo.PayloadBytes()})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	s, m := newMemStore(t, slots, testGeo)
	tr := withTier(s)
	before := m.Writes()
	runWorkload(t, tr, work, m.Crashed, "dry run")
	total := m.Writes() - before
	if tm := tr.Metrics(); tm.WrittenBytes == 0 || tm.Evictions+tm.Invalidations == 0 {
		t.Fatalf("the workload did not exercise the tier: %+v", tm)
	}
	tr.Close()
	images := 0
	for k := 1; k <= total+1; k++ {
		s, m := newMemStore(t, slots, testGeo)
		store.CheckMemoryOnly(s) // its device crashes under it
		tr := withTier(s)
		m.CrashAt(k)
		what := fmt.Sprintf("k=%d", k)
		acked, crashedOp := runWorkloadChecked(t, tr, work, m.Crashed, what, func(acked model) error {
			return checkModel(tr, acked, nil, evicting)
		})
		if !m.Crashed() {
			if err := checkModel(tr, acked, nil, evicting); err != nil {
				t.Fatalf("%s, no crash: %v", what, err)
			}
		}
		tr.Close()
		for seed := range uint64(4) {
			images++
			img := m.CrashImage(rand.New(rand.NewPCG(uint64(k), seed)), 512)
			checkRecovered(t, fmt.Sprintf("k=%d seed=%d", k, seed), storetest.NewMemFrom(img, 512), acked, work, crashedOp, evicting)
		}
	}
	t.Logf("%d crash points, %d device images checked", total+1, images)
}
