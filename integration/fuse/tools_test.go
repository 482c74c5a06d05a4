package fuseint

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// TestStandardTools drives a mounted store with the tools a person would use.
func TestStandardTools(t *testing.T) {
	need(t)
	mnt := t.TempDir()
	startMount(t, newStore(t, "64MiB"), mnt)
	src := t.TempDir()
	g := groupBytes(1)
	if err := os.WriteFile(filepath.Join(src, "g"), g, 0o644); err != nil {
		t.Fatal(err)
	}
	crc := fmt.Sprintf("%08x", store.CRC32C(g))
	const B = "layer-00/block-00000000000000ab"
	run := func(script string) string { t.Helper(); return mustSh(t, mnt, "set -eo pipefail; S="+src+"; "+script) }
	fails := func(script, want string) {
		t.Helper()
		out, err := sh(mnt, "S="+src+"; "+script)
		if err == nil || !strings.Contains(out, want) {
			t.Fatalf("%s: want failure with %q, got %v\n%s", script, want, err, out)
		}
	}

	run("mkdir -p " + B + "/head-3 && mkdir -p " + B + "/head-3")
	run("cp $S/g " + B + "/head-3/K && cmp $S/g " + B + "/head-3/K")
	if out := run("ls layer-00"); out != "block-00000000000000ab\n" {
		t.Fatalf("ls layer-00: %q", out)
	}
	if out := run("ls " + B + " | tr '\\n' ' '"); out != "head-0 head-1 head-2 head-3 head-4 head-5 head-6 head-7 " {
		t.Fatalf("ls block: %q", out)
	}
	if out := run("ls " + B + "/head-3"); out != "K\n" {
		t.Fatalf("ls head: %q", out)
	}
	if out := run("stat -c '%s %F %a' " + B + "/head-3/K"); out != "4096 regular file 644\n" {
		t.Fatalf("stat: %q", out)
	}
	if out := run("cat " + B + "/head-3/K | hexdump -C | sed -n 1p"); !strings.HasPrefix(out, fmt.Sprintf("00000000  %02x %02x", g[0], g[1])) {
		t.Fatalf("hexdump: %q", out)
	}
	// dd at offsets, in pieces, and through a pipe.
	run("dd if=$S/g of=" + B + "/head-3/V bs=1024 status=none && cmp $S/g " + B + "/head-3/V")
	run("cmp <(dd if=" + B + "/head-3/K bs=512 skip=3 count=2 status=none) <(dd if=$S/g bs=512 skip=3 count=2 status=none)")
	run("cat $S/g | dd of=" + B + "/head-2/K bs=4096 status=none && cmp $S/g " + B + "/head-2/K")
	// Extended attributes.
	out := run("getfattr -d " + B + "/head-3/K")
	for _, want := range []string{`user.kvfs.crc32c="` + crc + `"`, `user.kvfs.dtype="bf16"`, `user.kvfs.shape="16x128"`,
		`user.kvfs.block="00000000000000ab"`, `user.kvfs.layer="0"`, `user.kvfs.head="3"`, `user.kvfs.kind="K"`} {
		if !strings.Contains(out, want) {
			t.Fatalf("getfattr -d lacks %s:\n%s", want, out)
		}
	}
	if out := run("getfattr -n user.kvfs.crc32c --only-values " + B + "/head-3/K"); out != crc {
		t.Fatalf("crc32c xattr %q, want %q", out, crc)
	}
	// Wrong sizes store nothing.
	run("head -c 100 /dev/zero > $S/small && head -c 8192 /dev/zero > $S/big")
	fails("cp $S/small "+B+"/head-4/K", "Invalid argument")
	fails("cp $S/big "+B+"/head-4/K", "File too large")
	fails("dd if=$S/big of="+B+"/head-4/V bs=4096 count=2 status=none", "File too large")
	if out := run("ls " + B + "/head-4"); out != "" {
		t.Fatalf("head-4 after failed copies: %q", out)
	}
	// Names that do not parse, and things that cannot be created.
	fails("cat layer-99/"+layout.BlockName(0xab)+"/head-3/K", "No such file or directory")
	fails("ls layer-0", "No such file or directory")
	fails("cat "+B+"/head-3/k", "No such file or directory")
	fails("cat "+B+"/head-8/K", "No such file or directory")
	fails("touch "+B+"/head-3/notes", "Operation not permitted")
	fails("ln -s K "+B+"/head-3/L", "Operation not permitted")
	fails("mkfifo "+B+"/head-3/F", "Operation not permitted")
	fails("mv "+B+"/head-3/K "+B+"/head-1/K", "Operation not permitted")
	fails("mkdir layer-00/notes", "Operation not permitted")
	// Everything reads back through find | xargs cat.
	if out := run("find layer-00 -type f | sort | xargs cat | wc -c"); strings.TrimSpace(out) != "12288" {
		t.Fatalf("find | xargs cat: %q bytes", out)
	}
	if out := run("grep -E '^(slots_used|groups) ' .kvfs/stats | tr '\\n' ' '"); out != "slots_used 1 groups 3 " {
		t.Fatalf("stats: %q", out)
	}
	// rm of a group, then rm -r of the block.
	run("rm " + B + "/head-3/K")
	if out := run("ls " + B + "/head-3"); out != "V\n" {
		t.Fatalf("ls after rm: %q", out)
	}
	run("rm -r " + B)
	if out := run("ls layer-00"); out != "" {
		t.Fatalf("ls layer-00 after rm -r: %q", out)
	}
	if out := run("grep -E '^slots_used ' .kvfs/stats"); out != "slots_used 0\n" {
		t.Fatalf("stats after rm -r: %q", out)
	}
}

// TestFlippedByteOnDiskReadsEIO corrupts one group on disk: cat fails with
// EIO, the neighbours and the daemon are fine.
func TestFlippedByteOnDiskReadsEIO(t *testing.T) {
	need(t)
	mnt := t.TempDir()
	st := newStore(t, "64MiB")
	d := startMount(t, st, mnt)
	k := layout.Key{Block: 0xbadbad, Layer: 5, Head: 2, Kind: layout.V}
	nb := layout.Key{Block: 0xbadbad, Layer: 5, Head: 3, Kind: layout.V}
	g, h := groupBytes(7), groupBytes(8)
	for key, data := range map[layout.Key][]byte{k: g, nb: h} {
		p := filepath.Join(mnt, defaultGeo.Name(key))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(mnt, defaultGeo.Name(k))
	slot := mustSh(t, mnt, "getfattr -n user.kvfs.slot --only-values "+defaultGeo.Name(k))
	var s int64
	if _, err := fmt.Sscan(slot, &s); err != nil {
		t.Fatal(err)
	}
	off := diskOffset(t, st, k, s) + 123
	f, err := os.OpenFile(st, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{g[123] ^ 1}, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := sh(mnt, "cat "+p+" > /dev/null")
	if err == nil || !strings.Contains(out, "Input/output error") {
		t.Fatalf("cat of a corrupt group: %v %q", err, out)
	}
	if err := fileEqual(t, filepath.Join(mnt, defaultGeo.Name(nb)), h); err != nil {
		t.Fatalf("neighbour: %v", err)
	}
	if out := mustSh(t, mnt, "grep -E '^(store_corrupt|fs_corrupt) ' .kvfs/stats | tr '\\n' ' '"); out != "store_corrupt 1 fs_corrupt 1 " {
		t.Fatalf("stats: %q", out)
	}
	// Rewriting the group heals it.
	if err := os.WriteFile(p, g, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fileEqual(t, p, g); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.logText(), "checksum mismatch") {
		t.Fatalf("the daemon did not log the corruption:\n%s", d.logText())
	}
}
