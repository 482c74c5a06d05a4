package storetest

import (
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// Formatted returns a Mem device with room for slots blocks of geo,
// needing align-byte alignment, formatted as an empty store; a failure
// ends tb's test.
func Formatted(tb testing.TB, geo layout.Geometry, slots int64, align int) *Mem {
	tb.Helper()
	m := NewMem(store.SizeFor(geo, slots), align)
	if _, err := store.Format(m, geo, store.FormatOptions{}); err != nil {
		tb.Fatal(err)
	}
	return m
}

// Open opens the store on e with o, and closes it when tb's test ends
// (closing twice is harmless); a failure ends the test.
func Open(tb testing.TB, e store.Engine, o store.Options) *store.Store {
	tb.Helper()
	s, err := store.Open(e, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}
