package main

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// The tests run the commands in-process through run, as main does, with
// stdin, stdout and stderr captured. They share root, so none is parallel.

// result is the outcome of one kvfs invocation.
type result struct {
	code   int
	stdout []byte
	stderr string
}

// kvfs runs the command line args with stdin and returns its outcome.
func kvfs(t *testing.T, stdin []byte, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	root.SetIn(bytes.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errb)
	defer func() {
		root.SetIn(nil)
		root.SetOut(nil)
		root.SetErr(nil)
	}()
	code := run(args)
	return result{code, out.Bytes(), errb.String()}
}

// want fails the test unless r exited with code and its stderr holds every
// one of msgs.
func (r result) want(t *testing.T, code int, msgs ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status %d, want %d; stderr:\n%s", r.code, code, r.stderr)
	}
	for _, m := range msgs {
		if !strings.Contains(r.stderr, m) {
			t.Fatalf("stderr lacks %q:\n%s", m, r.stderr)
		}
	}
}

// testGeo: 2 layers × 2 heads × K,V = 8 groups of 16×16 bf16 = 512 bytes.
var testGeo = layout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, BlockTokens: 16, DType: layout.BF16, Align: 4096}

var geoFlags = []string{"--layers", "2", "--kv-heads", "2", "--head-dim", "16", "--block-tokens", "16", "--dtype", "bf16"}

func formatArgs(path string, extra ...string) []string {
	return append(append([]string{"format", path, "--size", "1MiB"}, geoFlags...), extra...)
}

// newStore formats a fresh 1 MiB store file.
func newStore(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store")
	kvfs(t, nil, formatArgs(path)...).want(t, 0)
	return path
}

func keyArgs(block string, layer, head int, kind string) []string {
	return []string{"--block", block, "--layer", strconv.Itoa(layer), "--head", strconv.Itoa(head), "--kind", kind}
}

// group is deterministic content for one group.
func group(seed uint64) []byte {
	b := make([]byte, testGeo.GroupBytes())
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func put(t *testing.T, path, block string, layer, head int, kind string, data []byte) {
	t.Helper()
	kvfs(t, data, append([]string{"put", path}, keyArgs(block, layer, head, kind)...)...).want(t, 0)
}

func get(t *testing.T, path, block string, layer, head int, kind string) result {
	t.Helper()
	return kvfs(t, nil, append([]string{"get", path}, keyArgs(block, layer, head, kind)...)...)
}

// snapshot is the whole store file, to show a refusal changed nothing.
func snapshot(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func unchanged(t *testing.T, path string, before []byte) {
	t.Helper()
	if !bytes.Equal(snapshot(t, path), before) {
		t.Fatalf("%s changed", path)
	}
}

// layoutOf returns the superblock of the store at path and the slot of
// block id (-1 when absent).
func layoutOf(t *testing.T, path string, key layout.Key) (store.Superblock, int64) {
	t.Helper()
	s, closeAll, err := engine.OpenStore(path, engine.Options{Kind: engine.KindPosix, ReadOnly: true}, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	slot := int64(-1)
	if gi, err := s.Stat(key); err == nil {
		slot = gi.Slot
	}
	return s.Superblock(), slot
}

// patch overwrites bytes of the file at off.
func patch(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// flip inverts one byte of the file at off.
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	b := snapshot(t, path)
	patch(t, path, off, []byte{^b[off]})
}

func decodeJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v in:\n%s", err, b)
	}
}

// TestMountMaxIOFlag: --max-io outside 4KiB..64MiB, or not a size, is a
// usage error, caught before the store is opened.
func TestMountMaxIOFlag(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"1KiB", "128MiB", "lots"} {
		kvfs(t, nil, "mount", dir+"/none.kvfs", dir, "--max-io", v).want(t, 2, "--max-io")
	}
}
