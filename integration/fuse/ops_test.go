package fuseint

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

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
