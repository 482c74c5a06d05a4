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
	// A block directory lists the heads that hold a group (or were made).
	if out := run("ls " + B + " | tr '\\n' ' '"); out != "head-3 " {
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
	run("mkdir " + B + "/head-2 && cat $S/g | dd of=" + B + "/head-2/K bs=4096 status=none && cmp $S/g " + B + "/head-2/K")
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
	run("mkdir " + B + "/head-4 && head -c 100 /dev/zero > $S/small && head -c 8192 /dev/zero > $S/big")
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
	fails("touch "+B+"/notes", "Operation not permitted")
	fails("cat "+B+"/head-5/K", "No such file or directory")
	fails("ln -s K "+B+"/head-3/L", "Operation not permitted")
	fails("mkfifo "+B+"/head-3/F", "Operation not permitted")
	fails("mv "+B+"/head-3/K "+B+"/head-3/notes", "Operation not permitted")
	fails("mkdir layer-00/notes", "Operation not permitted")
	// Everything reads back through find | xargs cat.
	if out := run("find layer-00 -type f | sort | xargs cat | wc -c"); strings.TrimSpace(out) != "12288" {
		t.Fatalf("find | xargs cat: %q bytes", out)
	}
	if out := run("grep -E '\"(slots_used|groups)\"' .kvfs/stats | tr -d ' \\n'"); out != `"slots_used":1,"groups":3,` {
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
	if out := run("grep -E '\"slots_used\"' .kvfs/stats | tr -d ' '"); out != "\"slots_used\":0,\n" {
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
	if out := mustSh(t, mnt, "grep -E '\"(store_corrupt|fs_corrupt)\"' .kvfs/stats | tr -d ' \\n'"); out != `"store_corrupt":1,"fs_corrupt":1,` {
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

// toolsPrelude is bash run before each step of TestToolsRoundTrip: strict
// mode, and cmptree A B, which fails unless A and B hold the same files
// with the same bytes (compared with cmp).
const toolsPrelude = `set -euo pipefail
cmptree() {
	local a b d
	d=$(cd "$2" && pwd)
	a=$(cd "$1" && find . -type f | sort)
	b=$(cd "$2" && find . -type f | sort)
	if [ "$a" != "$b" ]; then echo "cmptree: $1 and $2 list different files:"; echo "$a"; echo "--"; echo "$b"; return 1; fi
	[ -n "$a" ] || { echo "cmptree: $1 is empty"; return 1; }
	(cd "$1" && find . -type f -print0 | xargs -0 -I{} cmp {} "$d/{}")
}
stat1() { grep -E "\"$1\":" .kvfs/stats | tr -dc '0-9.'; echo; }
`

// TestToolsRoundTrip backs a block up out of the mount and restores it
// with the standard tools, each of which must exit 0 and leave the same
// bytes: cp -r, cp -a, tar c/x, rsync -a (temporary file and rename, and
// --inplace), in and out; then mv of groups and blocks, touch, chmod,
// chown, rm -rf and find -delete.
func TestToolsRoundTrip(t *testing.T) {
	need(t)
	if !haveCmd("rsync") {
		t.Skip("skipping: rsync is not installed (scripts/deps.sh installs it)")
	}
	mnt := t.TempDir()
	startMount(t, newStore(t, "64MiB"), mnt)
	tmp := t.TempDir()
	run := func(script string) string {
		t.Helper()
		return mustSh(t, mnt, toolsPrelude+"T="+tmp+"\n"+script)
	}
	fails := func(script, want string) {
		t.Helper()
		out, err := sh(mnt, "T="+tmp+"\n"+script)
		if err == nil || !strings.Contains(out, want) {
			t.Fatalf("%s: want failure with %q, got %v\n%s", script, want, err, out)
		}
	}
	const A, B, C = "block-00000000000000a1", "block-00000000000000b2", "block-00000000000000c3"
	// The source: heads 0, 1 and 3 of block A in layer 0, K and V.
	src := filepath.Join(tmp, "src", A)
	for i, h := range []string{"head-0", "head-1", "head-3"} {
		for j, kind := range []string{"K", "V"} {
			p := filepath.Join(src, h, kind)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, groupBytes(uint64(10*i+j+1)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	run("cp -r $T/src/" + A + " layer-00/ && cmptree $T/src/" + A + " layer-00/" + A)

	// Out of the mount and back in, with each tool.
	run("mkdir $T/bk && cp -r layer-00/" + A + " $T/bk/ && cmptree $T/src/" + A + " $T/bk/" + A)
	run("cp -r $T/bk/" + A + " layer-02/ && cmptree $T/src/" + A + " layer-02/" + A)
	run("mkdir $T/bka && cp -a layer-00/" + A + " $T/bka/ && cmptree $T/src/" + A + " $T/bka/" + A)
	run("cp -a $T/bka/" + A + " layer-03/ && cmptree $T/src/" + A + " layer-03/" + A)
	run("tar -C layer-00 -cf $T/a.tar " + A + " && tar -C layer-04 -xf $T/a.tar && cmptree $T/src/" + A + " layer-04/" + A)
	run("mkdir $T/tx && tar -C $T/tx -xf $T/a.tar && cmptree $T/src/" + A + " $T/tx/" + A)
	before := run("stat1 fs_staged_stored")
	run("rsync -a $T/bk/" + A + " layer-05/ && cmptree $T/src/" + A + " layer-05/" + A)
	if after := run("stat1 fs_staged_stored"); strings.TrimSpace(after) == strings.TrimSpace(before) {
		t.Fatalf("rsync stored no group through a staged temporary file (fs_staged_stored %s → %s)", before, after)
	}
	run("rsync -a --inplace $T/bk/" + A + " layer-06/ && cmptree $T/src/" + A + " layer-06/" + A)
	// The cp -a backup carries the user.kvfs.* attributes: rsync -X
	// sets them, and they are accepted (and ignored).
	run("getfattr -n user.kvfs.crc32c $T/bka/" + A + "/head-0/K >/dev/null")
	run("rsync -aX $T/bka/" + A + " layer-07/ && cmptree $T/src/" + A + " layer-07/" + A)
	run("mkdir $T/rs && rsync -a layer-05/" + A + " $T/rs/ && cmptree $T/src/" + A + " $T/rs/" + A)
	// rsync again over what is there: nothing changes, exit 0.
	run("rsync -a --checksum $T/bk/" + A + " layer-05/ && cmptree $T/src/" + A + " layer-05/" + A)
	if out := run("ls -A layer-05/" + A + "/head-0 | tr '\\n' ' '"); out != "K V " {
		t.Fatalf("rsync left staged files behind: %q", out)
	}

	// mv of a group onto the other kind of its head.
	run("mv layer-02/" + A + "/head-1/K layer-02/" + A + "/head-1/V && cmp $T/src/" + A + "/head-1/K layer-02/" + A + "/head-1/V")
	run("[ ! -e layer-02/" + A + "/head-1/K ] && [ \"$(ls layer-02/" + A + "/head-1)\" = V ]")
	// mv of a group to another head: copied and deleted (EXDEV).
	run("mv layer-02/" + A + "/head-0/V layer-02/" + A + "/head-3/V && cmp $T/src/" + A + "/head-0/V layer-02/" + A + "/head-3/V")
	run("[ \"$(ls layer-02/" + A + "/head-0)\" = K ]")

	// mv of a block directory re-keys the block, in every layer, in place.
	slot := run("getfattr -n user.kvfs.slot --only-values layer-00/" + A + "/head-0/K")
	used := run("stat1 slots_used")
	run("mv layer-00/" + A + " layer-00/" + B)
	for _, l := range []string{"layer-00", "layer-03", "layer-04", "layer-05", "layer-06", "layer-07"} {
		run("cmptree $T/src/" + A + " " + l + "/" + B + " && [ ! -e " + l + "/" + A + " ]")
	}
	run("[ ! -e layer-02/" + A + " ] && cmp $T/src/" + A + "/head-1/K layer-02/" + B + "/head-1/V")
	if got := run("getfattr -n user.kvfs.slot --only-values layer-00/" + B + "/head-0/K"); got != slot {
		t.Fatalf("the renamed block moved from slot %s to %s", slot, got)
	}
	if got := run("stat1 slots_used"); got != used {
		t.Fatalf("slots_used %s after the rename, %s before", got, used)
	}
	if got := run("getfattr -n user.kvfs.block --only-values layer-05/" + B + "/head-3/V"); got != "00000000000000b2" {
		t.Fatalf("user.kvfs.block of the renamed block: %q", got)
	}
	// Onto an existing block: refused, nothing changes.
	run("cp -r $T/bk/" + A + " layer-09/" + C)
	fails("mv layer-00/"+B+" layer-00/"+C, "Directory not empty")
	run("cmptree $T/src/" + A + " layer-00/" + B + " && cmptree $T/src/" + A + " layer-09/" + C)
	// To another layer: copied and deleted (EXDEV).
	if out := run("mv layer-09/" + C + " layer-10/ && cmptree $T/src/" + A + " layer-10/" + C + " && [ -z \"$(ls layer-09)\" ]"); out != "" {
		t.Fatalf("mv across layers printed:\n%s", out)
	}

	// touch, chmod, chown and times: accepted, nothing changes.
	g := "layer-10/" + C + "/head-0/K"
	run("touch " + g + " && touch -d 2001-02-03 " + g + " && chmod 600 " + g + " && chown 65534:65534 " + g +
		" && chmod 700 layer-10/" + C + " && chown 65534 layer-10/" + C + "/head-0 && touch layer-10/" + C)
	if out := run("[ \"$(stat -c '%a %u %s' " + g + ")\" = \"644 $(id -u) 4096\" ] && echo ok"); out != "ok\n" {
		t.Fatalf("stat after chmod/chown: %q", out)
	}
	run("cmp $T/src/" + A + "/head-0/K " + g)

	// rm -rf of a layer's blocks, find -delete: other layers keep theirs.
	run("rm -rf layer-03/* && [ -z \"$(ls layer-03)\" ]")
	run("find layer-04 -mindepth 1 -delete && [ -z \"$(ls layer-04)\" ]")
	run("cmptree $T/src/" + A + " layer-05/" + B)
	run("rm -rf layer-10/" + C + " && [ -z \"$(ls layer-10)\" ]")
	if out := run("stat1 fs_staged"); out != "0\n" {
		t.Fatalf("staged files left: %q", out)
	}
}

// TestStagedFiles: a temporary name in a head directory is staged in
// memory, becomes a group only when renamed onto K or V, and disappears
// otherwise; a wrong size fails the rename and stores nothing.
func TestStagedFiles(t *testing.T) {
	need(t)
	mnt := t.TempDir()
	startMount(t, newStore(t, "64MiB"), mnt)
	tmp := t.TempDir()
	run := func(script string) string {
		t.Helper()
		return mustSh(t, mnt, toolsPrelude+"T="+tmp+"\n"+script)
	}
	fails := func(script, want string) {
		t.Helper()
		out, err := sh(mnt, "T="+tmp+"\n"+script)
		if err == nil || !strings.Contains(out, want) {
			t.Fatalf("%s: want failure with %q, got %v\n%s", script, want, err, out)
		}
	}
	for i, name := range []string{"g1", "g2"} {
		if err := os.WriteFile(filepath.Join(tmp, name), groupBytes(uint64(100+i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const H = "layer-01/block-0000000000000042/head-2"
	run("mkdir -p " + H + " && cp $T/g1 " + H + "/K")
	groups := run("stat1 groups")
	// Written and closed, never renamed: listed, readable, not stored,
	// then gone.
	run("cp $T/g2 " + H + "/.K.tmp && cmp $T/g2 " + H + "/.K.tmp && [ \"$(ls -A " + H + " | tr '\\n' ' ')\" = '.K.tmp K ' ]")
	if got := run("stat1 groups"); got != groups {
		t.Fatalf("a staged file was stored: groups %s → %s", groups, got)
	}
	run("for i in $(seq 150); do [ -e " + H + "/.K.tmp ] || exit 0; sleep 0.1; done; echo staged file still there; exit 1")
	run("cmp $T/g1 " + H + "/K && [ \"$(stat1 fs_staged)\" = 0 ]")
	if got := run("stat1 groups"); got != groups {
		t.Fatalf("groups %s → %s", groups, got)
	}
	// Renamed onto V: stored.
	run("cp $T/g2 " + H + "/tmp && mv " + H + "/tmp " + H + "/V && cmp $T/g2 " + H + "/V && cmp $T/g1 " + H + "/K")
	run("[ \"$(ls -A " + H + " | tr '\\n' ' ')\" = 'K V ' ]")
	// Renamed onto K over an existing group: replaced.
	run("cp $T/g2 " + H + "/x && mv -f " + H + "/x " + H + "/K && cmp $T/g2 " + H + "/K")
	// Wrong sizes: the rename fails and the group keeps its bytes.
	fails("head -c 100 /dev/zero > "+H+"/small && mv "+H+"/small "+H+"/K", "Numerical result out of range")
	fails("head -c 8192 /dev/zero > "+H+"/big", "File too large")
	fails("mv "+H+"/big "+H+"/V", "File too large")
	run("cmp $T/g2 " + H + "/K && cmp $T/g2 " + H + "/V && rm " + H + "/small " + H + "/big")
	// A staged file removed by rm is gone at once.
	run("cp $T/g1 " + H + "/y && rm " + H + "/y && [ ! -e " + H + "/y ]")
	// rmdir waits for the staged files of a head to go.
	run("mkdir " + H + "/../head-5 && cp $T/g1 " + H + "/../head-5/z")
	fails("rmdir "+H+"/../head-5", "not empty")
	run("rm " + H + "/../head-5/z && rmdir " + H + "/../head-5")
}
