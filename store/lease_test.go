package store_test

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// fakeClock is a settable clock shared by the "hosts" of a test.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// leased opens the store on m as host with a 30 s lease that the test
// renews by hand.
func leased(m *storetest.Mem, c *fakeClock, host string, force bool) (*store.Store, error) {
	return store.Open(m, store.Options{Now: c.now, Lease: &store.LeaseOptions{Host: host, TTL: 30 * time.Second, RenewEvery: -1, Force: force}})
}

func writeOne(s *store.Store, block uint64) error {
	d := make([]byte, testGeo.GroupBytes())
	reqs := []store.WriteReq{{Key: testGeo.KeyAt(block, 0), Data: d}}
	if err := s.Write(reqs); err != nil {
		return err
	}
	return reqs[0].Err
}

// TestLeaseTwoHosts: two opens of one store stand for daemons on two hosts
// attached to the same namespace. The second is refused while the first's
// lease is live, takes over with Force (the first then refuses to write),
// and gets the store without Force once the lease expired or was released.
func TestLeaseTwoHosts(t *testing.T) {
	m := storetest.Formatted(t, testGeo, 16, 512)
	c := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	a, err := leased(m, c, "host-a", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeOne(a, 1); err != nil {
		t.Fatalf("owner's write: %v", err)
	}
	// Host b is refused while a's lease is live, and told who holds it.
	c.add(20 * time.Second)
	if _, err := leased(m, c, "host-b", false); !errors.Is(err, store.ErrLeaseHeld) || !strings.Contains(err.Error(), `"host-a"`) {
		t.Fatalf("second host while the lease is live: %v, want ErrLeaseHeld naming host-a", err)
	}
	// a renews: 30 s more from now; b still refused after the first expiry.
	if err := a.RenewLease(); err != nil {
		t.Fatal(err)
	}
	c.add(20 * time.Second)
	if _, err := leased(m, c, "host-b", false); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("after renewal: %v, want ErrLeaseHeld", err)
	}
	// A check-only open (a one-shot writer) is refused too, and writes
	// nothing when it is not.
	if _, err := store.Open(m, store.Options{Now: c.now, Lease: &store.LeaseOptions{Host: "host-b", CheckOnly: true}}); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("check-only open while the lease is live: %v, want ErrLeaseHeld", err)
	}
	// A read-only open takes no lease and is not refused.
	ro, err := store.Open(m, store.Options{ReadOnly: true, Lease: &store.LeaseOptions{Host: "host-b"}})
	if err != nil {
		t.Fatalf("read-only open: %v", err)
	}
	ro.Close()

	// b forces a takeover; a finds the lease lost and refuses writes.
	b, err := leased(m, c, "host-b", true)
	if err != nil {
		t.Fatalf("forced takeover: %v", err)
	}
	if err := a.RenewLease(); !errors.Is(err, store.ErrLeaseLost) || !strings.Contains(err.Error(), `"host-b"`) {
		t.Fatalf("old owner's renewal after the takeover: %v, want ErrLeaseLost naming host-b", err)
	}
	if err := writeOne(a, 2); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("old owner's write after the takeover: %v, want ErrLeaseLost", err)
	}
	if err := writeOne(b, 3); err != nil {
		t.Fatalf("new owner's write: %v", err)
	}
	a.Close() // must not release b's lease
	if r, err := store.ReadLease(m); err != nil || r.Host != "host-b" || !r.Live(b.Superblock().UUID, c.now()) {
		t.Fatalf("after the old owner closed: %+v, %v; want host-b's live lease", r, err)
	}

	// b stops renewing (a dead host): its own writes stop at expiry, and
	// host c gets the store without force.
	c.add(31 * time.Second)
	if err := writeOne(b, 4); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("write after the own lease expired: %v, want ErrLeaseLost", err)
	}
	cs, err := leased(m, c, "host-c", false)
	if err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	b.Close()
	// c releases on Close: a takes it back at once.
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	if r, err := store.ReadLease(m); err != nil || r.Host != "host-c" || !r.Expiry.IsZero() {
		t.Fatalf("after close: %+v, %v; want host-c's record released", r, err)
	}
	a2, err := leased(m, c, "host-a", false)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	// The same host reopens its own live lease (a restarted daemon; the
	// flock keeps two daemons of one host apart).
	a3, err := leased(m, c, "host-a", false)
	if err != nil {
		t.Fatalf("same host: %v", err)
	}
	a3.Close()
	a2.Close()
}

// TestLeaseOfFormerStore: a live record of a store since reformatted
// (another UUID) holds nothing.
func TestLeaseOfFormerStore(t *testing.T) {
	m := storetest.Formatted(t, testGeo, 16, 512)
	c := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	a, err := leased(m, c, "host-a", false)
	if err != nil {
		t.Fatal(err)
	}
	_ = a // left open: a host that died holding the lease
	if _, err := store.Format(m, testGeo, store.FormatOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	b, err := leased(m, c, "host-b", false)
	if err != nil {
		t.Fatalf("lease of the former store blocked the new one: %v", err)
	}
	b.Close()
}

func TestLeaseRecordEncoding(t *testing.T) {
	r := &store.LeaseRecord{UUID: [16]byte{1, 2, 3}, Host: "node-17.rack-3", Token: [16]byte{9, 9},
		Acquired: time.Unix(1_800_000_000, 5), Expiry: time.Unix(1_800_000_030, 7)}
	b := store.MarshalLease(r)
	got, err := store.UnmarshalLease(b)
	if err != nil || got.Host != r.Host || got.UUID != r.UUID || got.Token != r.Token || !got.Acquired.Equal(r.Acquired) || !got.Expiry.Equal(r.Expiry) {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, r)
	}
	if got, err := store.UnmarshalLease(make([]byte, store.SuperblockSize)); got != nil || err != nil {
		t.Fatalf("zeros (a version 1 store that never had an owner): %+v, %v; want no record", got, err)
	}
	bad := bytes.Clone(b)
	bad[40] ^= 1
	if _, err := store.UnmarshalLease(bad); !errors.Is(err, store.ErrSuperblock) {
		t.Fatalf("damaged record: %v, want ErrSuperblock", err)
	}
	if _, err := store.Open(storetest.NewMem(store.SizeFor(testGeo, 4), 512), store.Options{Lease: &store.LeaseOptions{Host: strings.Repeat("h", 65)}}); err == nil {
		t.Fatal("open of an unformatted device succeeded")
	}
}
