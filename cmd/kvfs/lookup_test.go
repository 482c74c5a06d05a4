package main

import (
	"strings"
	"testing"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

func TestLookupParse(t *testing.T) {
	tag := client.Tag{0x01, 0x23, 15: 0xef}
	ps, err := parseLookupPairs([]string{"ab", "0xCD:0123" + strings.Repeat("00", 13) + "ef", "ffffffffffffffff"})
	if err != nil {
		t.Fatal(err)
	}
	want := []client.LookupPair{{Block: 0xab}, {Block: 0xcd, Tag: tag}, {Block: 1<<64 - 1}}
	if len(ps) != len(want) {
		t.Fatalf("pairs %+v", ps)
	}
	for i := range want {
		if ps[i] != want[i] {
			t.Fatalf("pair %d: %+v, want %+v", i, ps[i], want[i])
		}
	}
	in := "# a sequence\nab 0xcd:0x0123" + strings.Repeat("00", 13) + "EF  # tagged\n\n  ffffffffffffffff\n"
	got, err := readLookupPairs(strings.NewReader(in))
	if err != nil || len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("stdin pairs %+v, %v", got, err)
	}
	for _, bad := range []string{"", "xyz", "12345678901234567", "ab:12", "ab:" + strings.Repeat("zz", 16), "ab:" + strings.Repeat("00", 17)} {
		if _, err := parseLookupPairs([]string{bad}); err == nil || exitCode(err) != 2 {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := readLookupPairs(strings.NewReader("ab\nab:1\n")); err == nil || !strings.Contains(err.Error(), "line 2") || exitCode(err) != 2 {
		t.Errorf("bad stdin line: %v", err)
	}
	// Usage errors come before the mount point is touched.
	kvfs(t, nil, "lookup", "/nonexistent", "zz").want(t, 2, `"zz"`)
	kvfs(t, []byte("# nothing\n"), "lookup", "/nonexistent").want(t, 2, "no block ids")
	kvfs(t, nil, "lookup").want(t, 2)
}

// TestLookupCommand asks a real mount about whole, partial and missing
// blocks.
func TestLookupCommand(t *testing.T) {
	t.Skip("needs the daemon's LOOKUP handler (the ctl wiring of store.Lookup), not on this branch")
	mnt, st := mountForLoad(t)
	var reqs []store.WriteReq
	for l := range testGeo.Layers {
		for h := range testGeo.KVHeads {
			for _, k := range []layout.Kind{layout.K, layout.V} {
				reqs = append(reqs, store.WriteReq{Key: layout.Key{Block: 0xa1, Layer: l, Head: h, Kind: k}, Data: group(uint64(l + 1))})
			}
		}
	}
	reqs = append(reqs, store.WriteReq{Key: layout.Key{Block: 0xa2}, Data: group(9)})
	if err := st.Write(reqs); err != nil {
		t.Fatal(err)
	}
	r := kvfs(t, nil, "lookup", mnt, "a1", "a2", "a3")
	r.want(t, 0)
	out := string(r.stdout)
	for _, s := range []string{"00000000000000a1 present\n", "00000000000000a2 absent\n", "00000000000000a3 absent\n",
		"run 1 of 3 (present 1, absent 2, tag-mismatch 0)"} {
		if !strings.Contains(out, s) {
			t.Fatalf("output lacks %q:\n%s", s, out)
		}
	}
	r = kvfs(t, []byte("a1\na1:"+strings.Repeat("11", 16)+"\na2\n"), "lookup", mnt, "--json")
	r.want(t, 0)
	var rep lookupReport
	decodeJSON(t, r.stdout, &rep)
	if rep.Count != 3 || rep.Run != 1 || rep.Present != 1 || rep.TagMismatch != 1 || rep.Absent != 1 ||
		rep.Blocks[1].Status != "tag-mismatch" || rep.Blocks[1].Tag != strings.Repeat("11", 16) || rep.Blocks[2].Status != "absent" {
		t.Fatalf("json %+v", rep)
	}
}
