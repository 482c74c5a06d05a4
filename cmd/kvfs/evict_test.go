package main

import (
	"testing"
)

func TestBenchEvict(t *testing.T) {
	r := kvfs(t, nil, "bench-evict", "--policy", "prefix", "--capacity-frac", "0.25", "--conversations", "10", "--requests", "200", "--json")
	r.want(t, 0)
	var one struct {
		Policy   string  `json:"policy"`
		HitRatio float64 `json:"hit_ratio"`
		Asked    uint64  `json:"blocks_asked"`
		Served   uint64  `json:"blocks_served"`
		Capacity int     `json:"capacity_blocks"`
	}
	decodeJSON(t, r.stdout, &one)
	if one.Policy != "prefix" || one.Asked == 0 || one.Served > one.Asked || one.HitRatio != float64(one.Served)/float64(one.Asked) || one.Capacity < 1 {
		t.Fatalf("bench-evict --json: %+v", one)
	}

	r = kvfs(t, nil, "bench-evict", "--capacity-frac", "0.1,0.5", "--conversations", "10", "--requests", "200", "--json")
	r.want(t, 0)
	var all []struct {
		Policy string  `json:"policy"`
		Frac   float64 `json:"capacity_frac"`
	}
	decodeJSON(t, r.stdout, &all)
	if len(all) != 4 || all[0].Policy != "lru" || all[1].Policy != "prefix" || all[2].Frac != 0.5 {
		t.Fatalf("bench-evict of two fractions and both policies: %+v", all)
	}

	kvfs(t, nil, "bench-evict", "--policy", "lfu").want(t, 2, "--policy")
	kvfs(t, nil, "bench-evict", "--capacity-frac", "1.5").want(t, 2, "--capacity-frac")
}
