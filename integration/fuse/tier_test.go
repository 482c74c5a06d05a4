package fuseint

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/layout"
)

// tierKey is the i-th group TestKill9WithTier stores: 4 blocks, so that
// a tier of 2 blocks evicts.
func tierKey(i int) layout.Key {
	return layout.Key{Block: 0x2000 + uint64(i%4), Layer: i % 32, Head: (i / 4) % 8, Kind: layout.Kind(i % 2)}
}

func tierData(i, version int) []byte { return groupBytes(uint64(i)<<20 | uint64(version)) }

func dramStats(t *testing.T, mnt string) map[string]float64 {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(mnt, ".kvfs", "stats"))
	if err != nil {
		t.Fatal(err)
	}
	var all map[string]any
	if err := json.Unmarshal(raw, &all); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for k, v := range all {
		if f, ok := v.(float64); ok {
			out[k] = f
		}
	}
	return out
}

// TestKill9WithTier: a daemon with a DRAM tier is killed while one client
// stores new versions of groups and another loads them; the remount
// starts with an empty tier and serves, for every group, the last version
// whose store was acknowledged (or the one in flight at the kill), never
// an older one.
func TestKill9WithTier(t *testing.T) {
	need(t)
	mnt := t.TempDir()
	st := newStore(t, "128MiB")
	d := startMount(t, st, mnt, "--dram", "4MiB")
	if s := dramStats(t, mnt); s["dram_bytes"] != 4<<20 {
		t.Fatalf("dram_bytes %v, want 4 MiB", s["dram_bytes"])
	}
	const n = 32
	gb := defaultGeo.GroupBytes()
	var mu sync.Mutex
	acked := make([]int, n) // last version acknowledged per group; 0: none
	stop := make(chan struct{})
	var wg sync.WaitGroup
	storer := func() {
		defer wg.Done()
		c, err := client.Open(mnt)
		if err != nil {
			t.Error(err)
			return
		}
		buf, err := c.NewHostBuffer("", int64(n*gb))
		if err != nil {
			t.Error(err)
			return
		}
		for v := 1; ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			es := make([]client.Entry, n)
			for i := range es {
				copy(buf.Mem[i*gb:], tierData(i, v))
				es[i] = client.Entry{Key: tierKey(i), Buffer: buf.ID, Offset: uint64(i * gb)}
			}
			sts, err := c.Store(es)
			if err != nil {
				return // the daemon is gone
			}
			mu.Lock()
			for i, s := range sts {
				if s == client.OK {
					acked[i] = v
				}
			}
			mu.Unlock()
		}
	}
	loader := func() {
		defer wg.Done()
		c, err := client.Open(mnt)
		if err != nil {
			t.Error(err)
			return
		}
		buf, err := c.NewHostBuffer("", int64(n*gb))
		if err != nil {
			t.Error(err)
			return
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			es := make([]client.Entry, n)
			for i := range es {
				es[i] = client.Entry{Key: tierKey(i), Buffer: buf.ID, Offset: uint64(i * gb)}
			}
			if _, err := c.Load(es); err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go storer()
	go loader()
	time.Sleep(300 * time.Millisecond)
	s := dramStats(t, mnt)
	if s["dram_promoted_bytes"] == 0 {
		t.Fatalf("nothing entered the tier before the kill: %v", s)
	}
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	close(stop)
	if err := d.stop(syscall.SIGKILL); err == nil {
		t.Fatal("daemon exited cleanly after kill -9?")
	}
	wg.Wait() // the clients' calls fail once the daemon is gone

	startMount(t, st, mnt, "--dram", "4MiB")
	if s := dramStats(t, mnt); s["dram_blocks"] != 0 || s["dram_hits"] != 0 {
		t.Fatalf("the remount's tier is not empty: %v", s)
	}
	c, err := client.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf, err := c.NewHostBuffer("", int64(n*gb))
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		es := make([]client.Entry, n)
		for i := range es {
			es[i] = client.Entry{Key: tierKey(i), Buffer: buf.ID, Offset: uint64(i * gb)}
		}
		sts, err := c.Load(es)
		if err != nil {
			t.Fatal(err)
		}
		for i := range es {
			got := buf.Mem[i*gb : (i+1)*gb]
			a := acked[i]
			switch {
			case a == 0 && sts[i] != client.OK:
			case sts[i] == client.OK && (bytes.Equal(got, tierData(i, a)) || bytes.Equal(got, tierData(i, a+1))):
			default:
				t.Fatalf("round %d: group %d (%v): status %v, not version %d (acknowledged) nor %d (in flight)", round, i, tierKey(i), sts[i], a, a+1)
			}
		}
	}
	if s := dramStats(t, mnt); s["dram_hits"] == 0 {
		t.Fatalf("the second load after the remount missed: %v", s)
	}
}
