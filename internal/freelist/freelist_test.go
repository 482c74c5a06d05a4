package freelist

import "testing"

// TestReuseAndBound: an item put back is the one the next Get returns (its
// memory kept, across collections), and no more than Max stay idle.
func TestReuseAndBound(t *testing.T) {
	type scratch struct{ buf []byte }
	l := List[scratch]{Max: 2}
	a := l.Get()
	a.buf = make([]byte, 0, 1<<20)
	l.Put(a)
	if b := l.Get(); b != a || cap(b.buf) != 1<<20 {
		t.Fatalf("Get after Put: %p (cap %d), want %p", b, cap(b.buf), a)
	}
	xs := []*scratch{l.Get(), l.Get(), l.Get()}
	for _, x := range xs {
		l.Put(x)
	}
	if n := len(l.free); n != 2 {
		t.Fatalf("%d idle, want Max 2", n)
	}
	if x := l.Get(); x != xs[1] {
		t.Fatal("not the last item kept")
	}
	var d List[scratch]
	for range DefaultMax + 5 {
		d.Put(new(scratch))
	}
	if n := len(d.free); n != DefaultMax {
		t.Fatalf("zero List keeps %d, want %d", n, DefaultMax)
	}
}
