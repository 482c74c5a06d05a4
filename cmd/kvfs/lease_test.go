package main

import (
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvfs/kvfs/store"
)

// plantLease writes an ownership record for host, live until expiry, into
// the store file at path, as a daemon on another host attached to the same
// namespace would have.
func plantLease(t *testing.T, path, host string, expiry time.Time) {
	t.Helper()
	r := kvfs(t, nil, "info", path, "--json")
	r.want(t, 0)
	var info infoReport
	decodeJSON(t, r.stdout, &info)
	u, err := hex.DecodeString(strings.ReplaceAll(info.UUID, "-", ""))
	if err != nil || len(u) != 16 {
		t.Fatalf("uuid %q: %v", info.UUID, err)
	}
	rec := store.LeaseRecord{Host: host, Token: [16]byte{7}, Acquired: time.Now(), Expiry: expiry}
	copy(rec.UUID[:], u)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(store.MarshalLease(&rec), store.LeaseOffset); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseRefusesSecondWriter: a store whose lease another host holds is
// refused to writing commands (with the owner named), still readable, and
// shown by info; once the lease expired, writes go through (one-shot
// commands check the lease but do not take it).
func TestLeaseRefusesSecondWriter(t *testing.T) {
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	plantLease(t, path, "other-host", time.Now().Add(time.Hour))
	kvfs(t, group(2), append([]string{"put", path}, keyArgs("2", 0, 0, "K")...)...).want(t, 1, "owned by a daemon on another host", `"other-host"`)
	r := get(t, path, "1", 0, 0, "K")
	r.want(t, 0)
	r = kvfs(t, nil, "info", path)
	r.want(t, 0)
	if !strings.Contains(string(r.stdout), "owner: other-host, lease live until") {
		t.Errorf("info does not show the live lease:\n%s", r.stdout)
	}
	plantLease(t, path, "other-host", time.Now().Add(-time.Second))
	put(t, path, "2", 0, 0, "K", group(2))
	r = kvfs(t, nil, "info", path)
	if !strings.Contains(string(r.stdout), "owner: none (lease of other-host expired at") {
		t.Errorf("info after the lease expired:\n%s", r.stdout)
	}
}
