package fuseint

import (
	"bufio"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/layout"
)

// crashKey is the group the i-th copy of TestKill9DuringWrites writes.
func crashKey(i int) layout.Key {
	return layout.Key{Block: 0x1000 + uint64(i/64), Layer: i % 32, Head: (i / 32) % 8, Kind: layout.Kind(i % 2)}
}

// TestKill9DuringWrites kills the daemon in the middle of a loop of cp's,
// mounts again on the same (now stale) mountpoint, and checks that every
// group whose cp succeeded reads back byte-identical and that nothing in
// the store reads corrupt.
func TestKill9DuringWrites(t *testing.T) {
	kill9DuringWrites(t)
}

// TestKill9DuringWritesTier is TestKill9DuringWrites with both mounts
// behind a DRAM tier of one block: each cp (a write of one group) drops
// the tier's copy of its block, and the reads after the remount are
// served through the tier.
func TestKill9DuringWritesTier(t *testing.T) {
	kill9DuringWrites(t, "--dram", "2MiB")
}

func kill9DuringWrites(t *testing.T, mountArgs ...string) {
	need(t)
	mnt := t.TempDir()
	st := newStore(t, "128MiB")
	d := startMount(t, st, mnt, mountArgs...)
	src := t.TempDir()
	const n = 150
	var script strings.Builder
	script.WriteString("set -u\n")
	for i := range n {
		data := groupBytes(uint64(1000 + i))
		if err := os.WriteFile(filepath.Join(src, strconv.Itoa(i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
		p := defaultGeo.Name(crashKey(i))
		fmt.Fprintf(&script, "mkdir -p %s 2>/dev/null && cp %s/%d %s 2>/dev/null && echo %d\n", filepath.Dir(p), src, i, p, i)
	}
	w := exec.Command("bash", "-c", script.String())
	w.Dir = mnt
	stdout, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	ok := map[int]bool{}
	lines := bufio.NewScanner(stdout)
	killed := false
	for lines.Scan() {
		i, err := strconv.Atoi(lines.Text())
		if err != nil {
			t.Fatalf("writer said %q", lines.Text())
		}
		ok[i] = true
		if len(ok) == 20 && !killed {
			if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	_ = w.Wait()
	if !killed {
		t.Fatalf("the writer finished (%d copies) before the kill", len(ok))
	}
	if err := d.stop(syscall.SIGKILL); err == nil {
		t.Fatal("daemon exited cleanly after kill -9?")
	}
	t.Logf("%d of %d copies succeeded before and around the kill", len(ok), n)
	if len(ok) >= n {
		t.Fatal("every copy succeeded: the kill came too late")
	}
	// The dead daemon left a stale mount. A plain stat may be answered from
	// the kernel's attribute cache of the root (the writer refreshed it a
	// moment ago); a forced statx must ask the daemon.
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, mnt, unix.AT_STATX_FORCE_SYNC, unix.STATX_BASIC_STATS, &stx); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("statx of the dead mount: %v, want ENOTCONN", err)
	}
	d2 := startMount(t, st, mnt, mountArgs...)
	for i := range ok {
		want, _ := os.ReadFile(filepath.Join(src, strconv.Itoa(i)))
		if err := fileEqual(t, filepath.Join(mnt, defaultGeo.Name(crashKey(i))), want); err != nil {
			t.Fatalf("copy %d succeeded before the kill, now: %v", i, err)
		}
	}
	// Nothing in the store reads corrupt; whatever is there is one of the
	// copies' bytes.
	out, err := sh(mnt, "find layer-* -type f | xargs -r cat | wc -c")
	if err != nil {
		t.Fatalf("reading everything back: %v\n%s", err, out)
	}
	if !strings.Contains(d2.logText(), "stale mount") {
		t.Fatalf("the second mount did not report the stale mount:\n%s", d2.logText())
	}
	if got, _ := strconv.Atoi(strings.TrimSpace(out)); got < len(ok)*defaultGeo.GroupBytes() {
		t.Fatalf("read back %s bytes, want at least %d", out, len(ok)*defaultGeo.GroupBytes())
	}
	if len(mountArgs) > 0 {
		if s := dramStats(t, mnt); s["dram_bytes"] == 0 || s["dram_hits"] == 0 || s["dram_promoted_bytes"] == 0 {
			t.Fatalf("the reads did not go through the tier: %v", s)
		}
	}
}

// TestSIGTERMUnmountsCleanly: SIGTERM unmounts, closes the store and exits 0.
func TestSIGTERMUnmountsCleanly(t *testing.T) {
	need(t)
	mnt := t.TempDir()
	st := newStore(t, "64MiB")
	d := startMount(t, st, mnt)
	k := layout.Key{Block: 0x77, Layer: 31, Head: 7, Kind: layout.V}
	g := groupBytes(77)
	p := filepath.Join(mnt, defaultGeo.Name(k))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, g, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, d.logText())
	}
	if _, ok, _ := fs.FindMount(mnt); ok {
		t.Fatal("still mounted after SIGTERM")
	}
	// The store is released and holds the group.
	got := kvfs(t, "get", st, "--block", "77", "--layer", "31", "--head", "7", "--kind", "V")
	if got != string(g) {
		t.Fatal("kvfs get after SIGTERM: other bytes")
	}
}

// TestSIGTERMWithAFileOpen: the unmount is busy, so the daemon detaches
// the mount lazily; it exits 0 once the last file closes.
func TestSIGTERMWithAFileOpen(t *testing.T) {
	need(t)
	mnt := t.TempDir()
	d := startMount(t, newStore(t, "64MiB"), mnt)
	holder := exec.Command("bash", "-c", "exec 3<.kvfs/geometry; echo open; sleep 60")
	holder.Dir = mnt
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "open\n" {
		t.Fatalf("holder: %q %v", line, err)
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	// The mount disappears (lazily) while the file is still open.
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, ok, _ := fs.FindMount(mnt); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still mounted 15 s after SIGTERM\n%s", d.logText())
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case err := <-d.done:
		t.Fatalf("daemon exited (%v) while a file was open", err)
	default:
	}
	_ = holder.Process.Kill()
	_ = holder.Wait()
	if err := d.wait(15 * time.Second); err != nil {
		t.Fatalf("exit after the last file closed: %v\n%s", err, d.logText())
	}
	if !strings.Contains(d.logText(), "detaching lazily") {
		t.Fatalf("log:\n%s", d.logText())
	}
}

// TestDaemonAndUmount: --daemon returns once the mount answers; kvfs umount
// unmounts and waits until the daemon released the store.
func TestDaemonAndUmount(t *testing.T) {
	need(t)
	mnt := t.TempDir()
	st := newStore(t, "64MiB")
	logPath := filepath.Join(t.TempDir(), "daemon.log")
	port := freePort(t)
	out := kvfs(t, "mount", st, mnt, "--daemon", "--log-file", logPath, "--log-level", "info", "--metrics-addr", "127.0.0.1:"+port)
	t.Cleanup(func() {
		if _, ok, _ := fs.FindMount(mnt); ok {
			_ = exec.Command(kvfsBin, "umount", "--lazy", mnt).Run()
		}
	})
	if !strings.Contains(out, "mounted") {
		t.Fatalf("kvfs mount --daemon said %q", out)
	}
	if mi, ok, _ := fs.FindMount(mnt); !ok || mi.FSType != "fuse.kvfs" || mi.Source != st {
		t.Fatalf("mountinfo: %+v %v", mi, ok)
	}
	// A second mount on the same mountpoint is refused.
	if out, err := exec.Command(kvfsBin, "mount", st, mnt).CombinedOutput(); err == nil || !strings.Contains(string(out), "already") {
		t.Fatalf("second mount: %v %s", err, out)
	}
	k := layout.Key{Block: 0xd, Layer: 1, Head: 1, Kind: layout.K}
	p := filepath.Join(mnt, defaultGeo.Name(k))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	g := groupBytes(13)
	if err := os.WriteFile(p, g, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fileEqual(t, p, g); err != nil {
		t.Fatal(err)
	}
	// The control file answers through the daemon's ctl server.
	c, err := client.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Info().Geometry; got != defaultGeo {
		t.Fatalf("INFO geometry %v", got)
	}
	hb, err := c.NewHostBuffer("", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	sts, err := c.Load([]client.Entry{{Key: k, Buffer: hb.ID, Offset: 8192}})
	if err != nil || sts[0] != client.OK || string(hb.Mem[8192:8192+len(g)]) != string(g) {
		t.Fatalf("LOAD of the copied group: %v %v", err, sts)
	}
	_ = hb.Close()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Prometheus metrics. The kernel sends the RELEASE of .kvfs/ctl after
	// close(2) returns: scrape until the session is gone.
	var body []byte
	for range 200 {
		resp, err := http.Get("http://127.0.0.1:" + port + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "kvfs_ctl_sessions_open 0") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{"kvfs_store_reads_total 2", "kvfs_store_writes_total 1", "kvfs_fs_stored_total 1", "kvfs_ctl_groups_loaded_total 1",
		`kvfs_store_batch_seconds_bucket{op="read"`, "kvfs_store_slots_used 1", "kvfs_ctl_sessions_open 0"} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
	kvfs(t, "umount", mnt)
	if _, ok, _ := fs.FindMount(mnt); ok {
		t.Fatal("still mounted after kvfs umount")
	}
	// umount returned after the daemon closed the store: it opens at once.
	if got := kvfs(t, "get", st, "--block", "d", "--layer", "1", "--head", "1", "--kind", "K"); got != string(g) {
		t.Fatal("kvfs get after umount: other bytes")
	}
	logText, _ := os.ReadFile(logPath)
	if !strings.Contains(string(logText), "mount: serving") || !strings.Contains(string(logText), "closing the store") {
		t.Fatalf("daemon log:\n%s", logText)
	}
	if out, err := exec.Command(kvfsBin, "umount", mnt).CombinedOutput(); err == nil || !strings.Contains(string(out), "not mounted") {
		t.Fatalf("umount of nothing: %v %s", err, out)
	}
}

// TestBadInvocations: usage errors exit 2 and mount nothing.
func TestBadInvocations(t *testing.T) {
	need(t)
	mnt := t.TempDir()
	st := newStore(t, "64MiB")
	for _, args := range [][]string{
		{"mount", st},
		{"mount", st, mnt, "--ctl-mode", "999"},
		{"mount", st, mnt, "--ctl-group", "no-such-group-kvfs"},
		{"mount", st, mnt, "--engine", "floppy"},
		{"mount", st, mnt, "--metrics-addr", "nope"},
		{"umount"},
	} {
		err := exec.Command(kvfsBin, args...).Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("kvfs %v: %v, want exit status 2", args, err)
		}
	}
	// Not a store: exit 1, nothing mounted.
	bogus := filepath.Join(t.TempDir(), "bogus")
	if err := os.WriteFile(bogus, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	err := exec.Command(kvfsBin, "mount", bogus, mnt).Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("mount of a non-store: %v, want exit status 1", err)
	}
	if _, ok, _ := fs.FindMount(mnt); ok {
		t.Fatal("mounted a non-store")
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
