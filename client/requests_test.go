package client

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvfs/kvfs/layout"
)

func TestParseRequests(t *testing.T) {
	in := `# comment
abc 1 0 K
0xABC 0 1 v 64KiB
  
ff 1 1 V 4096 1024
{"block": "00ab", "layer": 0, "head": 1, "kind": "V", "offset": 8192, "pitch": 512}
{"block": 171, "layer": 1, "head": 0, "kind": "K"}
`
	reqs, err := ParseRequests(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		key     layout.Key
		off     uint64
		pitch   uint32
		autoOff bool
		line    int
	}{
		{layout.Key{Block: 0xabc, Layer: 1, Kind: layout.K}, 0, 0, true, 2},
		{layout.Key{Block: 0xabc, Head: 1, Kind: layout.V}, 64 << 10, 0, false, 3},
		{layout.Key{Block: 0xff, Layer: 1, Head: 1, Kind: layout.V}, 4096, 1024, false, 5},
		{layout.Key{Block: 0xab, Head: 1, Kind: layout.V}, 8192, 512, false, 6},
		{layout.Key{Block: 0xab, Layer: 1, Kind: layout.K}, 0, 0, true, 7},
	}
	if len(reqs) != len(want) {
		t.Fatalf("%d requests", len(reqs))
	}
	for i, w := range want {
		q := reqs[i]
		if q.Key != w.key || q.Offset != w.off || q.Pitch != w.pitch || q.AutoOffset != w.autoOff || q.Line != w.line {
			t.Errorf("request %d: %+v, want %+v", i, q, w)
		}
	}
	if q := reqs[2]; q.Block != "00000000000000ff" || q.Layer != 1 || q.Head != 1 || q.Kind != "V" {
		t.Errorf("printed fields %+v", q)
	}
	if e := reqs[3].Entry(7); e != (Entry{Key: reqs[3].Key, Buffer: 7, Offset: 8192, Pitch: 512}) {
		t.Errorf("entry %+v", e)
	}
	// Packed offsets for the ones without.
	geo := layout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, BlockTokens: 16, DType: layout.BF16, Align: 4096}
	info := Info{Geometry: geo, GroupBytes: 512, RowBytes: 32}
	size, err := PlaceRequests(reqs, info)
	if err != nil {
		t.Fatal(err)
	}
	// After the furthest end so far (64 KiB + 512).
	if reqs[0].Offset != 0 || reqs[4].Offset != 64<<10+512 || size != int64(reqs[4].Offset+512) {
		t.Fatalf("offsets %d %d, size %d", reqs[0].Offset, reqs[4].Offset, size)
	}
	for _, bad := range []string{
		"abc 1 0", "abc 1 0 X", "xyz 1 0 K", "abc -1 0 K", "abc 1 0 K 12 34 56", "abc 1 0 K 1q",
		"abc 1 0 K 0 99GiB", `{"block": "ab", "layer": 0}`, `{"block": "ab", "layer": 0, "head": 0, "kind": "K", "x": 1}`,
		`{"block": [1], "layer": 0, "head": 0, "kind": "K"}`, `{"block": "ab", "layer": -1, "head": 0, "kind": "K"}`, `{`,
	} {
		_, err := ParseRequests(strings.NewReader("# first\n" + bad))
		var re *RequestError
		if !errors.As(err, &re) || re.Line != 2 || !strings.Contains(err.Error(), "requests line 2") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	var re *RequestError
	if _, err := PlaceRequests([]Request{{Line: 1, Pitch: 8}}, info); !errors.As(err, &re) || re.Line != 1 {
		t.Errorf("pitch below a row: %v", err)
	}
	if _, err := PlaceRequests([]Request{{Line: 3, Offset: 1 << 46}}, info); !errors.As(err, &re) || re.Line != 3 {
		t.Errorf("offset past 64 TiB: %v", err)
	}
}

// FuzzParseRequests: any input parses or fails with a *RequestError (or a
// scanner error), never panics; what parses is consistent and re-parses to
// itself when printed back (as fields, or as JSON where fields cannot say
// it).
func FuzzParseRequests(f *testing.F) {
	f.Add("abc 1 0 K\n0xABC 0 1 v 64KiB\n")
	f.Add("ff 1 1 V 4096 1024\n# c\n\n")
	f.Add(`{"block": "00ab", "layer": 0, "head": 1, "kind": "V", "offset": 8192, "pitch": 512}`)
	f.Add(`{"block": 171, "layer": 1, "head": 0, "kind": "K"}`)
	f.Add("abc 1 0 K 0 99GiB\n{")
	f.Fuzz(func(t *testing.T, in string) {
		reqs, err := ParseRequests(strings.NewReader(in))
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) && !strings.HasPrefix(err.Error(), "kvfs client: requests: ") {
				t.Fatalf("undocumented error: %v", err)
			}
			if reqs != nil {
				t.Fatal("requests returned with an error")
			}
			return
		}
		line := 0
		var back strings.Builder
		for _, q := range reqs {
			if q.Line <= line {
				t.Fatalf("line %d after %d", q.Line, line)
			}
			line = q.Line
			if q.Block != fmt.Sprintf("%016x", q.Key.Block) || q.Layer != q.Key.Layer || q.Head != q.Key.Head ||
				q.Kind != q.Key.Kind.String() || q.Layer < 0 || q.Head < 0 || (q.AutoOffset && q.Offset != 0) {
				t.Fatalf("inconsistent %+v", q)
			}
			switch {
			case q.AutoOffset && q.Pitch == 0:
				fmt.Fprintf(&back, "%s %d %d %s\n", q.Block, q.Layer, q.Head, q.Kind)
			case q.AutoOffset:
				fmt.Fprintf(&back, `{"block": %q, "layer": %d, "head": %d, "kind": %q, "pitch": %d}`+"\n", q.Block, q.Layer, q.Head, q.Kind, q.Pitch)
			default:
				fmt.Fprintf(&back, `{"block": %q, "layer": %d, "head": %d, "kind": %q, "offset": %d, "pitch": %d}`+"\n", q.Block, q.Layer, q.Head, q.Kind, q.Offset, q.Pitch)
			}
		}
		again, err := ParseRequests(strings.NewReader(back.String()))
		if err != nil || len(again) != len(reqs) {
			t.Fatalf("printed back %q: %v", back.String(), err)
		}
		for i := range again {
			a, q := again[i], reqs[i]
			if a.Key != q.Key || a.Offset != q.Offset || a.Pitch != q.Pitch || a.AutoOffset != q.AutoOffset {
				t.Fatalf("round trip %+v → %+v", q, a)
			}
		}
	})
}
