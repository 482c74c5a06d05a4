package main

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// superblockCopy1 is the offset of the second superblock copy.
const superblockCopy1 = 64 << 10

// A store of another format version: every command refuses it with the
// reason, format refuses it without --force, and nothing changes.
func TestOtherVersion(t *testing.T) {
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	sb, _ := layoutOf(t, path, layout.Key{Block: 1})
	for c, off := range []int64{0, superblockCopy1} {
		v := sb
		v.Version = store.FormatVersion + 1
		v.Copy = uint32(c)
		patch(t, path, off, store.MarshalSuperblock(&v))
	}
	before := snapshot(t, path)
	for _, args := range [][]string{
		{"info", path}, {"ls", path}, {"fsck", path}, {"fsck", path, "--repair"}, {"rm", path, "--block", "1"},
		append([]string{"get", path}, keyArgs("1", 0, 0, "K")...),
	} {
		kvfs(t, nil, args...).want(t, 1, "unsupported format version", fmt.Sprintf("version %d", store.FormatVersion+1))
	}
	kvfs(t, group(2), append([]string{"put", path}, keyArgs("1", 0, 0, "K")...)...).want(t, 1, "unsupported format version")
	kvfs(t, nil, formatArgs(path)...).want(t, 1, "already exists")
	unchanged(t, path, before)
	kvfs(t, nil, formatArgs(path, "--force")...).want(t, 0)
	kvfs(t, nil, "info", path).want(t, 0)
}

// Superblock copy 0 damaged: the store opens from copy 1, fsck reports it
// and exits 1, fsck --repair rewrites it, and the data survives.
func TestDamagedSuperblock(t *testing.T) {
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	good := snapshot(t, path)[:store.SuperblockSize]
	flip(t, path, 100)
	before := snapshot(t, path)

	r := kvfs(t, nil, "info", path)
	r.want(t, 0, "superblock copy 0 damaged")
	if !bytes.Contains(r.stdout, []byte("(1 used,")) {
		t.Errorf("info:\n%s", r.stdout)
	}
	if r := get(t, path, "1", 0, 0, "K"); r.code != 0 || !bytes.Equal(r.stdout, group(1)) {
		t.Fatalf("get from copy 1: %d %s", r.code, r.stderr)
	}
	r = kvfs(t, nil, "fsck", path)
	r.want(t, 1, "problems found")
	if !bytes.Contains(r.stdout, []byte("superblock: superblock copy 0 damaged")) {
		t.Errorf("fsck:\n%s", r.stdout)
	}
	r = kvfs(t, nil, "fsck", path, "--json")
	r.want(t, 1)
	var rep fsckReport
	decodeJSON(t, r.stdout, &rep)
	if rep.Clean || rep.Repaired || len(rep.Problems) != 1 || rep.Problems[0].Where != "superblock" || rep.Problems[0].Fixed {
		t.Errorf("fsck --json: %s", r.stdout)
	}
	unchanged(t, path, before) // checking writes nothing

	r = kvfs(t, nil, "fsck", path, "--repair")
	r.want(t, 0)
	if !bytes.Contains(r.stdout, []byte("(repaired)")) || !bytes.Contains(r.stdout, []byte("all repaired")) {
		t.Errorf("fsck --repair:\n%s", r.stdout)
	}
	if got := snapshot(t, path)[:store.SuperblockSize]; !bytes.Equal(got, good) {
		t.Error("superblock copy 0 not restored")
	}
	r = kvfs(t, nil, "fsck", path)
	r.want(t, 0)
	if r.stderr != "" || !bytes.Contains(r.stdout, []byte("1 groups checked: clean")) {
		t.Errorf("fsck after repair: %s %s", r.stdout, r.stderr)
	}
	if r := get(t, path, "1", 0, 0, "K"); !bytes.Equal(r.stdout, group(1)) {
		t.Fatal("group lost")
	}
}

// A damaged header copy: fsck lists the slot and exits 1, the groups still
// read, --repair rewrites the copy.
func TestDamagedHeader(t *testing.T) {
	path := newStore(t)
	// Two writes into absent positions of one block: both header copies
	// valid, the second newer.
	put(t, path, "7", 0, 0, "K", group(1))
	put(t, path, "7", 1, 1, "V", group(2))
	sb, slot := layoutOf(t, path, layout.Key{Block: 7})
	img := snapshot(t, path)
	older, oldest := -1, uint64(1<<63)
	for c := range 2 {
		off := sb.DataOffset + slot*sb.SlotBytes + int64(c)*sb.HeaderBytes
		h, err := store.UnmarshalHeader(img[off:off+sb.HeaderBytes], sb.UUID, slot, testGeo.GroupsPerBlock())
		if err != nil {
			t.Fatalf("header copy %d: %v", c, err)
		}
		if h.Gen < oldest {
			older, oldest = c, h.Gen
		}
	}
	flip(t, path, sb.DataOffset+slot*sb.SlotBytes+int64(older)*sb.HeaderBytes+40)
	before := snapshot(t, path)

	kvfs(t, nil, "info", path).want(t, 0)
	for i, k := range []struct {
		layer, head int
		kind        string
	}{{0, 0, "K"}, {1, 1, "V"}} {
		if r := get(t, path, "7", k.layer, k.head, k.kind); r.code != 0 || !bytes.Equal(r.stdout, group(uint64(i+1))) {
			t.Fatalf("get %v: %d %s", k, r.code, r.stderr)
		}
	}
	r := kvfs(t, nil, "fsck", path)
	r.want(t, 1)
	want := "slot " + itoa64(slot) + ": header copy " + itoa64(int64(older))
	if !bytes.Contains(r.stdout, []byte(want)) {
		t.Errorf("fsck lacks %q:\n%s", want, r.stdout)
	}
	unchanged(t, path, before)
	kvfs(t, nil, "fsck", path, "--repair").want(t, 0)
	kvfs(t, nil, "fsck", path).want(t, 0)
	if r := get(t, path, "7", 1, 1, "V"); !bytes.Equal(r.stdout, group(2)) {
		t.Fatal("group lost by the repair")
	}
}

// A flipped payload byte: get exits 1 and writes nothing, fsck lists the
// group, --repair drops it, the other groups stay.
func TestCorruptPayload(t *testing.T) {
	path := newStore(t)
	put(t, path, "c0ffee", 1, 0, "V", group(1))
	put(t, path, "c0ffee", 0, 1, "K", group(2))
	bad := layout.Key{Block: 0xc0ffee, Layer: 1, Head: 0, Kind: layout.V}
	sb, slot := layoutOf(t, path, bad)
	flip(t, path, sb.DataOffset+slot*sb.SlotBytes+2*sb.HeaderBytes+testGeo.Offset(testGeo.Index(bad))+77)
	before := snapshot(t, path)

	r := get(t, path, "c0ffee", 1, 0, "V")
	r.want(t, 1, "checksum mismatch")
	if len(r.stdout) != 0 {
		t.Fatalf("get wrote %d bytes of a corrupt group", len(r.stdout))
	}
	out := t.TempDir() + "/out"
	kvfs(t, nil, append([]string{"get", path, "--out", out}, keyArgs("c0ffee", 1, 0, "V")...)...).want(t, 1, "checksum mismatch")
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatal("get --out left a file for a corrupt group")
	}
	if r := get(t, path, "c0ffee", 0, 1, "K"); !bytes.Equal(r.stdout, group(2)) {
		t.Fatal("the intact group of the block does not read")
	}

	r = kvfs(t, nil, "fsck", path)
	r.want(t, 1)
	if !bytes.Contains(r.stdout, []byte("block 0000000000c0ffee layer 1 head 0 kind V: checksum mismatch")) {
		t.Errorf("fsck:\n%s", r.stdout)
	}
	r = kvfs(t, nil, "fsck", path, "--json")
	r.want(t, 1)
	var rep map[string]any
	decodeJSON(t, r.stdout, &rep)
	probs, _ := rep["problems"].([]any)
	if len(probs) != 1 {
		t.Fatalf("fsck --json: %s", r.stdout)
	}
	p := probs[0].(map[string]any)
	if p["where"] != "group" || p["block"] != "0000000000c0ffee" || p["layer"] != 1.0 || p["head"] != 0.0 || p["kind"] != "V" ||
		p["reason"] != "checksum mismatch" || p["fixed"] != false {
		t.Errorf("problem %v", p)
	}
	unchanged(t, path, before)

	kvfs(t, nil, "fsck", path, "--repair").want(t, 0)
	kvfs(t, nil, "fsck", path).want(t, 0)
	get(t, path, "c0ffee", 1, 0, "V").want(t, 1, "group not found")
	if r := get(t, path, "c0ffee", 0, 1, "K"); !bytes.Equal(r.stdout, group(2)) {
		t.Fatal("repair dropped an intact group")
	}
}

// A store locked by another process (a mount): every command says so,
// exits 1 and changes nothing.
func TestLocked(t *testing.T) {
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	lock, err := store.Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, path)
	for _, args := range [][]string{
		{"info", path}, {"ls", path}, {"fsck", path}, {"fsck", path, "--repair"}, {"rm", path, "--block", "1"},
		append([]string{"get", path}, keyArgs("1", 0, 0, "K")...),
		append([]string{"put", path}, keyArgs("1", 0, 0, "K")...),
		formatArgs(path, "--force"),
		formatArgs(path),
	} {
		r := kvfs(t, group(2), args...)
		r.want(t, 1, "store "+path+" is in use by another process (is it mounted?)")
		if len(r.stdout) != 0 {
			t.Errorf("%v wrote %q", args, r.stdout)
		}
	}
	unchanged(t, path, before)
	lock.Close()
	if r := get(t, path, "1", 0, 0, "K"); !bytes.Equal(r.stdout, group(1)) {
		t.Fatal("group changed")
	}
}
