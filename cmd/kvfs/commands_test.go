package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfs/kvfs/store"
)

func TestInfo(t *testing.T) {
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	r := kvfs(t, nil, "info", path, "--engine", "posix")
	r.want(t, 0)
	text := strings.Join(strings.Fields(string(r.stdout)), " ")
	for _, s := range []string{"uuid:", "format version: 2", "engine: posix", "layers=2 kv_heads=2 head_dim=16 block_tokens=16 dtype=bf16 align=4096",
		"group bytes: 512 (16x16 bf16)", "group stride: 4096", "slot bytes:", "slots:", "(1 used,"} {
		if !strings.Contains(text, s) {
			t.Errorf("info lacks %q:\n%s", s, r.stdout)
		}
	}

	r = kvfs(t, nil, "info", path, "--json")
	r.want(t, 0)
	var m map[string]any
	decodeJSON(t, r.stdout, &m)
	for _, k := range []string{"path", "uuid", "format_version", "engine", "geometry", "groups_per_block", "group_bytes",
		"group_stride", "header_bytes", "slot_bytes", "slots", "used_slots", "free_slots", "blocks", "size", "created"} {
		if _, ok := m[k]; !ok {
			t.Errorf("info --json lacks %q", k)
		}
	}
	var info infoReport
	decodeJSON(t, r.stdout, &info)
	g := info.Geometry
	if g.Layers != 2 || g.KVHeads != 2 || g.HeadDim != 16 || g.BlockTokens != 16 || g.DType != "bf16" || g.Align != 4096 ||
		info.GroupBytes != 512 || info.GroupStride != 4096 || info.UsedSlots != 1 || info.FreeSlots != info.Slots-1 ||
		info.FormatVersion != store.FormatVersion || info.Blocks != 1 || info.Engine == "" || len(info.UUID) != 36 {
		t.Errorf("info %+v", info)
	}
	// How much of the file was ever written, as the file system says.
	written, size, err := store.WrittenBytes(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.WrittenBytes == nil || *info.WrittenBytes != written {
		t.Errorf("written_bytes %v, want %d of %d", info.WrittenBytes, written, size)
	}
	if written < size && !strings.Contains(text, "format --zero writes it") {
		t.Errorf("info does not say the file is partly unwritten (%d of %d):\n%s", written, size, r.stdout)
	}
	kvfs(t, nil, append([]string{"format", path, "--force", "--zero"}, geoFlags...)...).want(t, 0)
	decodeJSON(t, kvfs(t, nil, "info", path, "--json").stdout, &info)
	if info.WrittenBytes == nil || *info.WrittenBytes != size {
		t.Errorf("after format --zero: written_bytes %v of %d", info.WrittenBytes, size)
	}
}

// put then get round-trips through stdin and stdout, and through --in and
// --out.
func TestPutGet(t *testing.T) {
	path := newStore(t)
	for i, k := range []struct {
		block        string
		layer, head  int
		kind         string
		canonicalHex string
	}{
		{"0", 0, 0, "K", "0000000000000000"},
		{"0xAB", 1, 1, "V", "00000000000000ab"},
		{"ffffffffffffffff", 1, 0, "k", "ffffffffffffffff"},
	} {
		data := group(uint64(i) + 10)
		put(t, path, k.block, k.layer, k.head, k.kind, data)
		r := get(t, path, k.canonicalHex, k.layer, k.head, strings.ToUpper(k.kind))
		r.want(t, 0)
		if !bytes.Equal(r.stdout, data) {
			t.Fatalf("%s: got %d bytes back, not what was put", k.block, len(r.stdout))
		}
	}

	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	data := group(99)
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	kvfs(t, nil, append([]string{"put", path, "--in", in}, keyArgs("5", 0, 1, "V")...)...).want(t, 0)
	r := kvfs(t, nil, append([]string{"get", path, "--out", out}, keyArgs("5", 0, 1, "V")...)...)
	r.want(t, 0)
	if len(r.stdout) != 0 {
		t.Errorf("get --out wrote %d bytes to stdout", len(r.stdout))
	}
	if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("--out: %v", err)
	}
	// A second put replaces the group.
	put(t, path, "5", 0, 1, "V", group(100))
	if r := get(t, path, "5", 0, 1, "V"); !bytes.Equal(r.stdout, group(100)) {
		t.Fatal("put did not replace the group")
	}
}

func TestPutWrongSize(t *testing.T) {
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	before := snapshot(t, path)
	n := testGeo.GroupBytes()
	for _, c := range []struct {
		name string
		data []byte
		msg  string
	}{
		{"empty", nil, "holds 0 bytes, a group is 512"},
		{"short", group(2)[:n-1], "holds 511 bytes, a group is 512"},
		{"one byte long", append(group(2), 0), "more than one group (512 bytes)"},
		{"much too long", bytes.Repeat(group(2), 100), "more than one group"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, block := range []string{"1", "2"} { // replacing and new
				kvfs(t, c.data, append([]string{"put", path}, keyArgs(block, 0, 0, "K")...)...).want(t, 1, c.msg, "nothing stored")
				unchanged(t, path, before)
			}
		})
	}
	if r := get(t, path, "1", 0, 0, "K"); !bytes.Equal(r.stdout, group(1)) {
		t.Fatal("group changed")
	}
	get(t, path, "2", 0, 0, "K").want(t, 1, "group not found")
	missing := filepath.Join(t.TempDir(), "missing")
	kvfs(t, nil, append([]string{"put", path, "--in", missing}, keyArgs("3", 0, 0, "K")...)...).want(t, 1, "no such file")
	unchanged(t, path, before)
}

func TestGetAbsent(t *testing.T) {
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	before := snapshot(t, path)
	for _, k := range [][]string{keyArgs("2", 0, 0, "K"), keyArgs("1", 0, 0, "V"), keyArgs("1", 1, 1, "K")} {
		r := kvfs(t, nil, append([]string{"get", path}, k...)...)
		r.want(t, 1, "group not found")
		if len(r.stdout) != 0 {
			t.Errorf("%v: wrote %d bytes", k, len(r.stdout))
		}
	}
	// --out: a missing file is not created, an existing one is left alone.
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	kvfs(t, nil, append([]string{"get", path, "--out", out}, keyArgs("2", 0, 0, "K")...)...).want(t, 1, "group not found")
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("--out created: %v", err)
	}
	os.WriteFile(out, []byte("keep"), 0o644)
	kvfs(t, nil, append([]string{"get", path, "--out", out}, keyArgs("2", 0, 0, "K")...)...).want(t, 1)
	if b, _ := os.ReadFile(out); string(b) != "keep" {
		t.Errorf("--out overwritten: %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
	unchanged(t, path, before)
}

// Bad group keys are usage errors and change nothing.
func TestBadKeys(t *testing.T) {
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	before := snapshot(t, path)
	for _, c := range []struct {
		name string
		args []string
		msg  string
	}{
		{"block not hex", keyArgs("xyz", 0, 0, "K"), `--block "xyz"`},
		{"block too long", keyArgs("10000000000000000", 0, 0, "K"), `--block "10000000000000000"`},
		{"block empty", keyArgs("", 0, 0, "K"), `--block ""`},
		{"layer out of range", keyArgs("1", 2, 0, "K"), "the store has 2 layers and 2 KV heads"},
		{"head out of range", keyArgs("1", 0, 7, "K"), "the store has 2 layers"},
		{"negative layer", []string{"--block", "1", "--layer", "-1", "--head", "0", "--kind", "K"}, "count from 0"},
		{"bad kind", keyArgs("1", 0, 0, "Q"), `--kind "Q"`},
		{"missing kind", keyArgs("1", 0, 0, "K")[:6], `required flag(s) "kind" not set`},
		{"missing everything", nil, `required flag(s) "block", "head", "kind", "layer" not set`},
	} {
		t.Run(c.name, func(t *testing.T) {
			kvfs(t, group(2), append([]string{"put", path}, c.args...)...).want(t, 2, c.msg)
			r := kvfs(t, nil, append([]string{"get", path}, c.args...)...)
			r.want(t, 2, c.msg)
			if len(r.stdout) != 0 {
				t.Errorf("get wrote %d bytes", len(r.stdout))
			}
			unchanged(t, path, before)
		})
	}
	kvfs(t, nil, "rm", path, "--block", "xyz").want(t, 2, `--block "xyz"`)
	kvfs(t, nil, "rm", path).want(t, 2, `required flag(s) "block" not set`)
	unchanged(t, path, before)
}

func TestLsRm(t *testing.T) {
	path := newStore(t)
	r := kvfs(t, nil, "ls", path)
	r.want(t, 0)
	if len(r.stdout) != 0 {
		t.Errorf("ls of an empty store: %q", r.stdout)
	}
	r = kvfs(t, nil, "ls", path, "--json")
	r.want(t, 0)
	if strings.TrimSpace(string(r.stdout)) != "[]" {
		t.Errorf("ls --json of an empty store: %q", r.stdout)
	}

	start := time.Now().Add(-time.Second)
	put(t, path, "ab", 0, 0, "K", group(1))
	put(t, path, "ab", 1, 1, "V", group(2))
	put(t, path, "3", 0, 1, "K", group(3))
	r = kvfs(t, nil, "ls", path)
	r.want(t, 0)
	lines := strings.Split(strings.TrimSpace(string(r.stdout)), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "BLOCK") ||
		!strings.HasPrefix(lines[1], "0000000000000003  1/8") || !strings.HasPrefix(lines[2], "00000000000000ab  2/8") {
		t.Errorf("ls:\n%s", r.stdout)
	}
	r = kvfs(t, nil, "ls", path, "--json")
	r.want(t, 0)
	var ents []map[string]any
	decodeJSON(t, r.stdout, &ents)
	if len(ents) != 2 || ents[0]["block"] != "0000000000000003" || ents[1]["block"] != "00000000000000ab" || ents[1]["groups"] != 2.0 {
		t.Fatalf("ls --json: %s", r.stdout)
	}
	var typed []lsEntry
	json.Unmarshal(r.stdout, &typed)
	if typed[1].MTime.Before(start) || typed[1].MTime.After(time.Now().Add(time.Second)) {
		t.Errorf("mtime %v", typed[1].MTime)
	}

	kvfs(t, nil, "rm", path, "--block", "0xAB").want(t, 0)
	get(t, path, "ab", 0, 0, "K").want(t, 1, "group not found")
	before := snapshot(t, path)
	kvfs(t, nil, "rm", path, "--block", "ab").want(t, 1, "block 00000000000000ab is not in the store")
	kvfs(t, nil, "rm", path, "--block", "4").want(t, 1, "not in the store")
	unchanged(t, path, before)
	if r := get(t, path, "3", 0, 1, "K"); !bytes.Equal(r.stdout, group(3)) {
		t.Fatal("rm took the wrong block")
	}
	r = kvfs(t, nil, "ls", path, "--json")
	decodeJSON(t, r.stdout, &ents)
	if len(ents) != 1 {
		t.Fatalf("after rm: %s", r.stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	path := newStore(t)
	before := snapshot(t, path)
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"frobnicate", path}, `unknown command "frobnicate"`},
		{[]string{"info"}, "info takes exactly one STORE argument"},
		{[]string{"info", path, path}, "got 2"},
		{[]string{"ls", ""}, "STORE path is empty"},
		{[]string{"fsck"}, "exactly one STORE"},
		{[]string{"info", path, "--bogus"}, "unknown flag: --bogus"},
		{[]string{"--bogus", "info", path}, ""},
		{[]string{"--log-level"}, "flag needs an argument"},
		{[]string{"info", path, "--json=maybe"}, "invalid argument"},
		{[]string{"info", path, "--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"info", path, "--log-format", "xml"}, `--log-format "xml"`},
		{[]string{"info", path, "--engine", "spdk"}, "unknown engine kind"},
		{[]string{"ls", path, "--engine", "spdk"}, "unknown engine kind"},
	} {
		r := kvfs(t, nil, c.args...)
		r.want(t, 2, c.msg, "run 'kvfs --help' for usage")
	}
	unchanged(t, path, before)

	r := kvfs(t, nil, "--help")
	r.want(t, 0)
	for _, cmd := range []string{"format", "info", "put", "get", "ls", "rm", "fsck"} {
		if !bytes.Contains(r.stdout, []byte("  "+cmd+" ")) {
			t.Errorf("help lacks %s:\n%s", cmd, r.stdout)
		}
	}
	kvfs(t, nil, "info", "--help").want(t, 0)
}

// The global logging flags reach the commands: JSON lines on stderr.
func TestLogFlags(t *testing.T) {
	path := newStore(t)
	r := kvfs(t, nil, "--log-level", "debug", "--log-format", "json", "info", path)
	r.want(t, 0)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if len(lines) == 0 || lines[0] == "" {
		t.Fatal("no log lines at debug")
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil || m["msg"] == nil || m["level"] == nil {
			t.Errorf("not a JSON log line: %q", l)
		}
	}
	if !strings.Contains(r.stderr, "not using nvme") {
		t.Errorf("no engine fallback line:\n%s", r.stderr)
	}
	// The default level keeps a healthy command quiet.
	if r := kvfs(t, nil, "info", path); r.stderr != "" {
		t.Errorf("stderr at the default level: %q", r.stderr)
	}
}

// Commands on something that is not a store fail with the reason.
func TestNotAStore(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk")
	os.WriteFile(junk, make([]byte, 1<<20), 0o644)
	for _, cmd := range []string{"info", "ls", "fsck"} {
		kvfs(t, nil, cmd, junk).want(t, 1, "not a kvfs store")
		kvfs(t, nil, cmd, filepath.Join(dir, "missing")).want(t, 1, "no such file")
	}
}
