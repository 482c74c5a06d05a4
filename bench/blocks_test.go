package bench

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

func memStore(t *testing.T, slots int64) *store.Store {
	t.Helper()
	g := layout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, BlockTokens: 16, DType: layout.BF16, Align: 512}
	m := storetest.Formatted(t, g, slots, 512)
	s := storetest.Open(t, m, store.Options{})
	return s
}

func TestRunBlocks(t *testing.T) {
	s := memStore(t, 4)
	ctx := context.Background()
	if _, err := RunBlocks(ctx, BlocksConfig{Store: s, Duration: time.Millisecond}); !errors.Is(err, ErrFewBlocks) {
		t.Fatalf("empty store: %v", err)
	}
	// FillBlocks stops at a full store rather than evicting.
	var calls []int64
	if err := FillBlocks(s, 9, func(done, total int64) {
		if total != 9 {
			t.Errorf("fill progress total %d, want 9", total)
		}
		calls = append(calls, done)
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(calls, []int64{1, 2, 3, 4}) {
		t.Fatalf("fill progress %v, want each block present counted: 1 2 3 4", calls)
	}
	if n := len(s.Blocks()); n != 4 {
		t.Fatalf("FillBlocks left %d blocks in 4 slots", n)
	}
	if m := s.Metrics(); m.Evictions != 0 {
		t.Fatalf("FillBlocks evicted %d blocks", m.Evictions)
	}
	before := s.Metrics()
	r, err := RunBlocks(ctx, BlocksConfig{Store: s, Blocks: 3, QD: 2, Duration: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	after := s.Metrics()
	gpb := s.Geometry().GroupsPerBlock()
	if r.Engine != "mem" || r.BlocksPerCall != 3 || r.GroupsPerCall != 3*gpb || r.CallBytes != 3*gpb*512 || r.QD != 2 ||
		r.Calls == 0 || r.Bytes != r.Calls*int64(r.CallBytes) || r.GBps <= 0 || r.CallsPerSec <= 0 || r.P99us < r.P50us {
		t.Fatalf("%+v", r)
	}
	// Every call read every group of three distinct blocks.
	if got := int64(after.Reads - before.Reads); got != r.Calls*int64(r.GroupsPerCall) {
		t.Fatalf("the store served %d groups for %d calls of %d", got, r.Calls, r.GroupsPerCall)
	}
	if _, err := RunBlocks(ctx, BlocksConfig{Store: s, Blocks: 5, Duration: time.Millisecond}); !errors.Is(err, ErrConfig) {
		t.Fatalf("more blocks per call than the store holds: %v", err)
	}
	if _, err := RunBlocks(ctx, BlocksConfig{Duration: time.Millisecond}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no store: %v", err)
	}
}

func TestSweepDepths(t *testing.T) {
	for _, c := range []struct {
		max  int
		want []int
	}{{1, []int{1}}, {4, []int{1, 2, 4}}, {6, []int{1, 2, 4, 6}}, {64, []int{1, 2, 4, 8, 16, 32, 64}}} {
		if got := SweepDepths(c.max); !slices.Equal(got, c.want) {
			t.Errorf("SweepDepths(%d) = %v, want %v", c.max, got, c.want)
		}
	}
}
