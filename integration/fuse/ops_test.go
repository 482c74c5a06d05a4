package fuseint

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/layout"
)

// useMount writes a group through mnt and reads it back.
func useMount(t *testing.T, mnt string, seed uint64) {
	t.Helper()
	k := layout.Key{Block: 0xabc0 + seed, Layer: 2, Head: 3, Kind: layout.V}
	p := filepath.Join(mnt, defaultGeo.Name(k))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	g := groupBytes(seed)
	if err := os.WriteFile(p, g, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fileEqual(t, p, g); err != nil {
		t.Fatal(err)
	}
}

// TestLogReaderGoesAway is `kvfs mount S M --log-level info 2>&1 | head -n 2`:
// head exits after two lines, the mount logs more (SIGHUP logs a line each
// time), keeps serving, and SIGTERM still unmounts cleanly with exit 0.
func TestLogReaderGoesAway(t *testing.T) {
	need(t)
	st, mnt := newStore(t, "64MiB"), t.TempDir()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	head := exec.Command("head", "-n", "2")
	head.Stdin = pr
	var headOut strings.Builder
	head.Stdout = &headOut
	if err := head.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	d := startMountOut(t, pw, "", st, mnt)
	pw.Close()
	headDone := make(chan error, 1)
	go func() { headDone <- head.Wait() }()
	// Log lines until head has its two and exits; then more, into the
	// closed pipe.
	for i := 0; ; i++ {
		select {
		case err := <-headDone:
			if err != nil {
				t.Fatalf("head: %v", err)
			}
			goto gone
		default:
		}
		if i > 10000 {
			t.Fatal("head never exited")
		}
		_ = d.cmd.Process.Signal(syscall.SIGHUP)
		useMount(t, mnt, uint64(i%4))
	}
gone:
	if n := strings.Count(headOut.String(), "\n"); n != 2 {
		t.Fatalf("head printed %d lines:\n%s", n, headOut.String())
	}
	for i := range 20 {
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatalf("daemon gone after its reader left: %v", err)
		}
		useMount(t, mnt, uint64(10+i))
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM after the reader left: %v (want exit 0)", err)
	}
	if _, ok, _ := fs.FindMount(mnt); ok {
		t.Fatal("still mounted after SIGTERM")
	}
}

// TestLogFileReopenOnSIGHUP: a foreground mount with --log-file logs there,
// not to stderr; after the file is renamed (logrotate), SIGHUP makes the
// mount write to a new file at the path.
func TestLogFileReopenOnSIGHUP(t *testing.T) {
	need(t)
	st, mnt := newStore(t, "64MiB"), t.TempDir()
	logPath := filepath.Join(t.TempDir(), "kvfs.log")
	stderrPath := filepath.Join(t.TempDir(), "stderr")
	errf, err := os.Create(stderrPath)
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	d := startMountOut(t, errf, logPath, st, mnt, "--log-file", logPath)
	useMount(t, mnt, 1)
	if !strings.Contains(d.logText(), "mount: serving") {
		t.Fatalf("log file:\n%s", d.logText())
	}
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The new file appears once the signal is handled.
	for !exists(logPath) {
		select {
		case err := <-d.done:
			t.Fatalf("mount exited after SIGHUP: %v", err)
		default:
		}
		useMount(t, mnt, 2)
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	cur, _ := os.ReadFile(logPath)
	old, _ := os.ReadFile(logPath + ".1")
	if !strings.Contains(string(cur), "log file reopened") || !strings.Contains(string(cur), "closing the store") {
		t.Fatalf("new log file:\n%s", cur)
	}
	if strings.Contains(string(old), "closing the store") {
		t.Fatalf("rotated log got lines after SIGHUP:\n%s", old)
	}
	if b, _ := os.ReadFile(stderrPath); len(b) != 0 {
		t.Fatalf("stderr with --log-file: %q", b)
	}
}

// repoRoot is the repository root (this package is integration/fuse).
func repoRoot(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// TestMakeInstallDESTDIR: make install into a DESTDIR with PREFIX=/usr puts
// kvfs, mount.fuse.kvfs and kvfs@.service where PREFIX says, each pointing
// at the installed kvfs; the unit passes systemd-analyze verify; make
// uninstall removes all three.
func TestMakeInstallDESTDIR(t *testing.T) {
	need(t)
	if !haveCmd("make") || !haveCmd("go") {
		t.Skip("skipping: make install needs make and the Go toolchain")
	}
	dest := t.TempDir()
	mustSh(t, repoRoot(t), "make -s install DESTDIR="+dest+" PREFIX=/usr")
	bin := filepath.Join(dest, "usr/bin/kvfs")
	helper := filepath.Join(dest, "sbin/mount.fuse.kvfs")
	unit := filepath.Join(dest, "usr/lib/systemd/system/kvfs@.service")
	for _, p := range []string{bin, helper, unit} {
		if !exists(p) {
			t.Fatalf("make install: %s missing", p)
		}
	}
	if out := mustSh(t, "", bin+" --help"); !strings.Contains(out, "mount") {
		t.Fatalf("installed kvfs --help: %s", out)
	}
	if out := mustSh(t, "", helper+" /s /m -o engine=uring,allow_other,nofail -f"); strings.TrimSpace(out) != "/usr/bin/kvfs mount --daemon /s /m --engine=uring --allow-other" {
		t.Fatalf("installed helper would run %q", out)
	}
	u, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(u), "ExecStart=/usr/bin/kvfs mount ") || !strings.Contains(string(u), "Type=notify") {
		t.Fatalf("installed unit:\n%s", u)
	}
	verifyUnit(t, strings.ReplaceAll(string(u), "/usr/bin/kvfs", bin))
	mustSh(t, repoRoot(t), "make -s uninstall DESTDIR="+dest+" PREFIX=/usr")
	for _, p := range []string{bin, helper, unit} {
		if exists(p) {
			t.Fatalf("make uninstall left %s", p)
		}
	}
}

// verifyUnit runs systemd-analyze verify on an instance of the unit text
// (its ExecStart must name an existing kvfs): no complaint, exit 0.
func verifyUnit(t *testing.T, text string) {
	t.Helper()
	if !haveCmd("systemd-analyze") {
		// scripts/deps.sh installs systemd; only a machine without it skips.
		t.Skip("skipping: systemd-analyze is missing (apt-get install systemd)")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kvfs@.service"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", filepath.Join(dir, "kvfs@default.service")).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Fatalf("systemd-analyze verify kvfs@default.service: %v\n%s\n%s", err, out, text)
	}
	// The check can fail: a unit whose ExecStart is missing does.
	if err := os.WriteFile(filepath.Join(dir, "kvfs@.service"), []byte(strings.Replace(text, "ExecStart=/", "ExecStart=/nonexistent/", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("systemd-analyze", "verify", filepath.Join(dir, "kvfs@default.service")).CombinedOutput(); err == nil {
		t.Fatalf("systemd-analyze verify passed a unit with a missing ExecStart:\n%s", out)
	}
}

// installHelper puts dist/mount.fuse.kvfs at /sbin/mount.fuse.kvfs (where
// mount(8) looks) for the test, restoring what was there.
func installHelper(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 || !haveCmd("mount") {
		t.Skip("skipping: mount -t fuse.kvfs needs root and mount(8)")
	}
	const dst = "/sbin/mount.fuse.kvfs"
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "dist/mount.fuse.kvfs"))
	if err != nil {
		t.Fatal(err)
	}
	old, oldErr := os.ReadFile(dst)
	if err := os.WriteFile(dst, src, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if oldErr == nil {
			_ = os.WriteFile(dst, old, 0o755)
		} else {
			_ = os.Remove(dst)
		}
	})
	t.Setenv("KVFS_BIN", kvfsBin) // mount(8) run by root passes the environment on
}

// waitExit waits for the daemon pid in a "kvfs: mounted … (pid N," line to
// exit (it closed the store), failing after 30 s.
func waitExit(t *testing.T, mountOut string) {
	t.Helper()
	i := strings.Index(mountOut, "(pid ")
	if i < 0 {
		t.Fatalf("no daemon pid in %q", mountOut)
	}
	var pid int
	if _, err := fmt.Sscanf(mountOut[i:], "(pid %d,", &pid); err != nil {
		t.Fatalf("daemon pid in %q: %v", mountOut, err)
	}
	for range 3000 {
		if !exists(filepath.Join("/proc", strconv.Itoa(pid))) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("daemon %d still running 30 s after umount", pid)
}

// TestMountTypeFuseKvfs: mount -t fuse.kvfs STORE DIR -o engine=…,allow_other
// through the helper returns once the mount answers; umount(8) unmounts and
// the daemon exits.
func TestMountTypeFuseKvfs(t *testing.T) {
	need(t)
	installHelper(t)
	st, mnt := newStore(t, "64MiB"), t.TempDir()
	logPath := filepath.Join(t.TempDir(), "kvfs.log")
	out := mustSh(t, "", "mount -t fuse.kvfs "+st+" "+mnt+" -o engine=posix,allow_other,log_level=info,log_file="+logPath)
	t.Cleanup(func() { _ = fs.Detach(mnt) })
	mi, ok, _ := fs.FindMount(mnt)
	if !ok || mi.FSType != "fuse.kvfs" || mi.Source != st {
		t.Fatalf("mountinfo after mount -t fuse.kvfs: %+v %v", mi, ok)
	}
	if info, _ := os.ReadFile("/proc/self/mountinfo"); !mountLineHas(string(info), mnt, "allow_other") {
		t.Fatalf("allow_other is not among the mount's options:\n%s", info)
	}
	useMount(t, mnt, 3)
	mustSh(t, "", "umount "+mnt)
	waitExit(t, out)
	if _, ok, _ := fs.FindMount(mnt); ok {
		t.Fatal("still mounted after umount")
	}
	if b, _ := os.ReadFile(logPath); !strings.Contains(string(b), "engine") || !strings.Contains(string(b), "closing the store") {
		t.Fatalf("log file (log_file=):\n%s", b)
	}
	// ro is refused with a reason.
	if out, err := sh("", "mount -t fuse.kvfs "+st+" "+mnt+" -o ro"); err == nil || !strings.Contains(out, "read-only") {
		t.Fatalf("mount -o ro: %v %s", err, out)
	}
}

// TestFstabMountA: an fstab line of type fuse.kvfs with the fstab-only
// options mounts with mount -a; a nofail line whose store is missing does
// not make mount -a fail. The fstab is a temporary file (mount -T), so the
// machine's /etc/fstab is never touched.
func TestFstabMountA(t *testing.T) {
	need(t)
	installHelper(t)
	st, mnt, mnt2 := newStore(t, "64MiB"), t.TempDir(), t.TempDir()
	logDir := t.TempDir()
	fstab := filepath.Join(t.TempDir(), "fstab")
	lines := st + " " + mnt + " fuse.kvfs defaults,nofail,_netdev,noatime,x-systemd.requires=local-fs.target,engine=posix,log_file=" + logDir + "/a.log 0 0\n" +
		filepath.Join(t.TempDir(), "missing.kvfs") + " " + mnt2 + " fuse.kvfs nofail,log_file=" + logDir + "/b.log 0 0\n"
	if err := os.WriteFile(fstab, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := sh("", "mount -a -T "+fstab)
	t.Cleanup(func() { _ = fs.Detach(mnt) })
	if err != nil {
		t.Fatalf("mount -a with a nofail line that fails: %v\n%s", err, out)
	}
	if mi, ok, _ := fs.FindMount(mnt); !ok || mi.FSType != "fuse.kvfs" || mi.Source != st {
		t.Fatalf("mount -a: %+v %v\n%s", mi, ok, out)
	}
	if _, ok, _ := fs.FindMount(mnt2); ok {
		t.Fatal("the missing store was mounted")
	}
	useMount(t, mnt, 4)
	// A second mount -a leaves the mounted line alone.
	if out2, err := sh("", "mount -a -T "+fstab); err != nil {
		t.Fatalf("second mount -a: %v\n%s", err, out2)
	}
	mustSh(t, "", "umount "+mnt)
	waitExit(t, out)
	if _, ok, _ := fs.FindMount(mnt); ok {
		t.Fatal("still mounted after umount")
	}
	// mount MOUNTPOINT takes the rest from the fstab line; the group
	// written above is still there.
	out = mustSh(t, "", "mount -T "+fstab+" "+mnt)
	k := layout.Key{Block: 0xabc0 + 4, Layer: 2, Head: 3, Kind: layout.V}
	if err := fileEqual(t, filepath.Join(mnt, defaultGeo.Name(k)), groupBytes(4)); err != nil {
		t.Fatal(err)
	}
	mustSh(t, "", "umount "+mnt)
	waitExit(t, out)
}

// mountLineHas reports whether the mountinfo line of mnt mentions opt.
func mountLineHas(mountinfo, mnt, opt string) bool {
	for _, l := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == mnt && strings.Contains(l, opt) {
			return true
		}
	}
	return false
}

// TestNonRootMount: an unprivileged user (nobody) formats a store, mounts it
// (through fusermount3), writes and reads a group, and unmounts.
func TestNonRootMount(t *testing.T) {
	need(t)
	if os.Geteuid() != 0 || !haveCmd("runuser") || !haveCmd("fusermount3") {
		t.Skip("skipping: needs root (to become nobody), runuser and fusermount3 (apt-get install fuse3)")
	}
	const uid, gid = 65534, 65534 // nobody, nogroup
	// Let everyone open /dev/fuse (the distributions' default); restore.
	var st syscall.Stat_t
	if err := syscall.Stat("/dev/fuse", &st); err != nil {
		t.Fatal(err)
	}
	if mode := os.FileMode(st.Mode & 0o777); mode&0o006 != 0o006 {
		if err := os.Chmod("/dev/fuse", 0o666); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod("/dev/fuse", mode) })
	}
	dir, err := os.MkdirTemp("", "kvfs-nonroot")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin, mnt := filepath.Join(dir, "kvfs"), filepath.Join(dir, "mnt")
	b, err := os.ReadFile(kvfsBin)
	if err != nil {
		t.Fatal(err)
	}
	g := groupBytes(21)
	k := layout.Key{Block: 0x77, Layer: 5, Head: 2, Kind: layout.K}
	for _, e := range []struct {
		p    string
		b    []byte
		mode os.FileMode
	}{{bin, b, 0o755}, {filepath.Join(dir, "group"), g, 0o644}} {
		if err := os.WriteFile(e.p, e.b, e.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, mnt} {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, ok, _ := fs.FindMount(mnt); ok {
			_ = fs.Detach(mnt)
		}
	})
	store := filepath.Join(dir, "s.kvfs")
	p := filepath.Join(mnt, defaultGeo.Name(k))
	asNobody := func(script string) string {
		t.Helper()
		return mustSh(t, dir, "runuser -u nobody -- sh -ec '"+script+"'")
	}
	asNobody(bin + " format " + store + " --size 64MiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16")
	out := asNobody(bin + " mount --daemon " + store + " " + mnt)
	if info, _ := os.ReadFile("/proc/self/mountinfo"); !mountLineHas(string(info), mnt, "user_id=65534") {
		t.Fatalf("no mount of nobody on %s after %q:\n%s", mnt, out, info)
	}
	asNobody("mkdir -p " + filepath.Dir(p) + " && cp group " + p + " && cmp group " + p + " && id -u")
	asNobody(bin + " umount " + mnt)
	if _, ok, _ := fs.FindMount(mnt); ok {
		t.Fatal("still mounted after kvfs umount as nobody")
	}
	// The group is in the store: a second mount by nobody reads it.
	asNobody(bin + " mount --daemon " + store + " " + mnt)
	asNobody("cmp group " + p + " && " + bin + " umount " + mnt)
}

// TestSdNotify: with $NOTIFY_SOCKET set (systemd's Type=notify), the mount
// sends READY=1 once it answers and STOPPING=1 on SIGTERM.
func TestSdNotify(t *testing.T) {
	need(t)
	sock := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	d := startMount(t, newStore(t, "64MiB"), t.TempDir())
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), "READY=1\nMAINPID="+strconv.Itoa(d.cmd.Process.Pid)) {
		t.Fatalf("first notification %q %v", buf[:n], err)
	}
	useMount(t, d.mnt, 5)
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if n, err = c.Read(buf); err != nil || string(buf[:n]) != "STOPPING=1" {
		t.Fatalf("second notification %q %v", buf[:n], err)
	}
}
