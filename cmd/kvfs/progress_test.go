package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// onTerminal runs the command line args with stderr on a pseudo-terminal
// and returns its exit status and what the terminal received.
func onTerminal(t *testing.T, args ...string) (int, string) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("skipping: no pseudo-terminals: %v", err)
	}
	defer master.Close()
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string)
	go func() {
		var b bytes.Buffer
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf) // EIO once the slave is closed and drained
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		got <- b.String()
	}()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(slave)
	code := run(args)
	root.SetOut(nil)
	root.SetErr(nil)
	slave.Close()
	return code, <-got
}

// Long work draws its progress on a terminal, and nothing elsewhere (also
// checked for bench --fill in TestBenchSweepPlot, bench-load --fill in
// TestBenchLoad).
func TestProgressOnTerminal(t *testing.T) {
	path := newStore(t)
	code, term := onTerminal(t, "bench", path, "--blocks", "1", "--fill", "3", "--force-write", "--seconds", "0.1")
	if code != 0 || !strings.Contains(term, "fill: 100% 3/3 blocks") {
		t.Fatalf("bench --fill: exit %d, the terminal got %q", code, term)
	}
	code, term = onTerminal(t, "fsck", path)
	if code != 0 || !strings.Contains(term, "fsck: open: 100%") || !strings.Contains(term, "fsck: check: 100%") {
		t.Fatalf("fsck: exit %d, the terminal got %q", code, term)
	}
	if r := kvfs(t, nil, "fsck", path); r.code != 0 || r.stderr != "" {
		t.Fatalf("fsck into a buffer: exit %d, stderr %q", r.code, r.stderr)
	}
	// A fill that is not needed draws nothing.
	code, term = onTerminal(t, "bench", path, "--blocks", "1", "--fill", "2", "--force-write", "--seconds", "0.1")
	if code != 0 || strings.Contains(term, "fill") {
		t.Fatalf("bench --fill of a full enough store: exit %d, the terminal got %q", code, term)
	}
}
