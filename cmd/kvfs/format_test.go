package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

func TestFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	r := kvfs(t, nil, formatArgs(path)...)
	r.want(t, 0)
	if !bytes.Contains(r.stdout, []byte("formatted "+path)) {
		t.Errorf("stdout: %s", r.stdout)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != 1<<20 {
		t.Fatalf("store file: %v, %v", st, err)
	}
	sb, _ := layoutOf(t, path, layout.Key{Block: 1})
	if sb.Geometry != testGeo || sb.Version != store.FormatVersion {
		t.Errorf("superblock %+v", sb)
	}

	// --force overwrites: a new store (new uuid), the old blocks gone.
	put(t, path, "1", 0, 0, "K", group(1))
	kvfs(t, nil, formatArgs(path, "--force")...).want(t, 0)
	sb2, slot := layoutOf(t, path, layout.Key{Block: 1})
	if sb2.UUID == sb.UUID || slot != -1 {
		t.Errorf("after --force: uuid %s (was %s), block 1 in slot %d", sb2.UUIDString(), sb.UUIDString(), slot)
	}

	// An existing file that is not a store is formatted without --force,
	// keeping its size when --size is left out.
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(junk, bytes.Repeat([]byte{0}, 512<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	kvfs(t, nil, append([]string{"format", junk, "--dtype", "fp16", "--align", "4096"}, geoFlags[:8]...)...).want(t, 0)
	if st, _ := os.Stat(junk); st.Size() != 512<<10 {
		t.Errorf("junk resized to %d", st.Size())
	}
}

// Every refusal of format exits with its status and leaves what was there:
// an existing store byte for byte, a missing file missing.
func TestFormatRefusals(t *testing.T) {
	minSize := store.MinSize(testGeo)
	cases := []struct {
		name string
		args []string // after "format PATH"
		code int
		msg  string
	}{
		{"store exists", append([]string{"--size", "1MiB"}, geoFlags...), 1, "already exists (use --force to overwrite)"},
		{"size too small", append([]string{"--size", "64KiB"}, geoFlags...), 1, "needs at least " + itoa64(minSize) + " bytes"},
		{"size too small with force", append([]string{"--size", "64KiB", "--force"}, geoFlags...), 1, "device too small"},
		{"missing layers", append([]string{"--size", "1MiB"}, geoFlags[2:]...), 2, `required flag(s) "layers" not set`},
		{"zero layers", append([]string{"--size", "1MiB", "--force"}, replace(geoFlags, "--layers", "0")...), 2, "layers = 0"},
		{"too many heads", append([]string{"--size", "1MiB", "--force"}, replace(geoFlags, "--kv-heads", "4096")...), 2, "invalid geometry"},
		{"bad dtype", append([]string{"--size", "1MiB", "--force"}, replace(geoFlags, "--dtype", "fp64")...), 2, `--dtype "fp64"`},
		{"bad align", append([]string{"--size", "1MiB", "--force", "--align", "1000"}, geoFlags...), 2, "invalid geometry"},
		{"bad size", append([]string{"--size", "lots", "--force"}, geoFlags...), 2, `--size "lots"`},
		{"negative size", append([]string{"--size", "-1", "--force"}, geoFlags...), 2, "--size"},
		{"non-numeric layers", append([]string{"--size", "1MiB", "--force"}, replace(geoFlags, "--layers", "two")...), 2, "invalid argument"},
		{"bad engine", append([]string{"--size", "1MiB", "--force", "--engine", "spdk"}, geoFlags...), 2, "unknown engine kind"},
		{"unknown flag", append([]string{"--size", "1MiB", "--forse"}, geoFlags...), 2, "unknown flag: --forse"},
		{"two paths", append([]string{"other", "--size", "1MiB", "--force"}, geoFlags...), 2, "exactly one STORE"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := newStore(t)
			put(t, path, "ab", 1, 1, "V", group(7))
			before := snapshot(t, path)
			kvfs(t, nil, append([]string{"format", path}, c.args...)...).want(t, c.code, c.msg)
			unchanged(t, path, before)
			if got := get(t, path, "ab", 1, 1, "V"); got.code != 0 || !bytes.Equal(got.stdout, group(7)) {
				t.Fatalf("group lost after refusal: %+v", got.code)
			}
			if c.name == "store exists" {
				return // needs the store
			}
			// The same flags on a path that does not exist create nothing.
			fresh := filepath.Join(t.TempDir(), "fresh")
			args := append([]string{"format", fresh}, c.args...)
			if c.name == "two paths" {
				args = append([]string{"format", fresh, filepath.Join(t.TempDir(), "other")}, c.args[1:]...)
			}
			kvfs(t, nil, args...).want(t, c.code)
			if _, err := os.Stat(fresh); !os.IsNotExist(err) {
				t.Fatalf("%s left behind: %v", fresh, err)
			}
		})
	}
}

// --zero leaves no never-written space in the file (reads of it would not
// reach the disk), and the store works as any other.
func TestFormatZero(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	r := kvfs(t, nil, append([]string{"format", path, "--size", "4MiB", "--zero"}, geoFlags...)...)
	r.want(t, 0)
	if !bytes.Contains(r.stdout, []byte("every byte written")) {
		t.Errorf("stdout: %s", r.stdout)
	}
	written, size, err := store.WrittenBytes(path)
	if err != nil || size != 4<<20 || written != size {
		t.Fatalf("after format --zero: %d of %d bytes written, %v", written, size, err)
	}
	put(t, path, "1", 0, 0, "K", group(3))
	if got := get(t, path, "1", 0, 0, "K"); got.code != 0 || !bytes.Equal(got.stdout, group(3)) {
		t.Fatalf("get after format --zero: %+v", got.code)
	}
}

func TestFormatNeedsSizeForNewFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	kvfs(t, nil, append([]string{"format", path}, geoFlags...)...).want(t, 2, "--size is required")
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("created %s: %v", path, err)
	}
}

// The smallest store holds exactly one slot; one byte less is refused.
func TestFormatMinimumSize(t *testing.T) {
	minSize := store.MinSize(testGeo)
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	kvfs(t, nil, append([]string{"format", small, "--size", itoa64(minSize - 1)}, geoFlags...)...).want(t, 1, "needs at least "+itoa64(minSize))
	exact := filepath.Join(dir, "exact")
	kvfs(t, nil, append([]string{"format", exact, "--size", itoa64(minSize)}, geoFlags...)...).want(t, 0)
	var info infoReport
	r := kvfs(t, nil, "info", exact, "--json")
	r.want(t, 0)
	decodeJSON(t, r.stdout, &info)
	if info.Slots != 1 {
		t.Errorf("slots = %d, want 1", info.Slots)
	}
}

// Flags do not leak from one in-process run into the next.
func TestFlagsReset(t *testing.T) {
	path := newStore(t)
	kvfs(t, nil, formatArgs(path, "--force")...).want(t, 0)
	kvfs(t, nil, formatArgs(path)...).want(t, 1, "already exists")
}

func replace(args []string, flag, value string) []string {
	out := append([]string(nil), args...)
	for i := range out {
		if out[i] == flag {
			out[i+1] = value
		}
	}
	return out
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }
