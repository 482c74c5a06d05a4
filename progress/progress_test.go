package progress

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair through /dev/ptmx.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("skipping: no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty slave: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

func TestQuietWhenNotATerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m := New(w, "fsck", "", Bytes, 100)
	if m.Active() {
		t.Fatal("a meter on a pipe is active")
	}
	m.Update(10, 0) // a nil meter takes every call
	m.Add(90)
	m.Done()
	m.Clear()
	w.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 0 {
		t.Fatalf("wrote %q to a pipe", out)
	}
	if New(&bytes.Buffer{}, "x", "", Count, 1).Active() {
		t.Fatal("a meter on a bytes.Buffer is active")
	}
}

func TestDrawsOnATerminal(t *testing.T) {
	master, slave := openPTY(t)
	m := New(slave, "fill", "blocks", Count, 40)
	if !m.Active() {
		t.Fatal("a meter on a pty is inactive")
	}
	for range 40 {
		m.Add(1)
	}
	m.Done()
	m.Done() // once only
	slave.Close()
	var out bytes.Buffer
	buf := make([]byte, 4096)
	for !strings.Contains(out.String(), "\n") {
		n, err := master.Read(buf) // EIO once the slave is closed and drained
		out.Write(buf[:n])
		if err != nil {
			break
		}
	}
	s := out.String()
	if !strings.Contains(s, "fill: 100% 40/40 blocks") {
		t.Fatalf("the terminal got %q, want the final line with 100%% 40/40 blocks", s)
	}
	if !strings.HasPrefix(s, "\r") {
		t.Fatalf("the line does not start with a carriage return: %q", s)
	}
	if strings.Count(s, "\n") != 1 {
		t.Fatalf("want exactly one line end (from Done), got %q", s)
	}
}

func TestLine(t *testing.T) {
	start := time.Unix(1000, 0)
	now := start
	m := newMeter(io.Discard, "fsck", "", Bytes, 100<<20, func() time.Time { return now })
	now = start.Add(10 * time.Second)
	m.Update(25<<20, 0)
	if got, want := m.line(now, false), "fsck:  25% 25.0 MiB/100.0 MiB, 2.5 MiB/s, 30s left"; got != want {
		t.Fatalf("line = %q, want %q", got, want)
	}
	if got, want := m.line(now, true), "fsck:  25% 25.0 MiB/100.0 MiB, 2.5 MiB/s in 10s"; got != want {
		t.Fatalf("final line = %q, want %q", got, want)
	}
	c := newMeter(io.Discard, "fill", "blocks", Count, 0, func() time.Time { return now })
	now = now.Add(2 * time.Second)
	c.Update(300, 0)
	if got, want := c.line(now, false), "fill: 300 blocks, 150/s"; got != want {
		t.Fatalf("line without total = %q, want %q", got, want)
	}
}

func TestRedrawsAreThrottledAndBlankLeftovers(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(0, 0)
	m := newMeter(&out, "fill", "blocks", Count, 1000, func() time.Time { return now })
	for i := range 100 {
		m.Update(int64(i), 0)
	}
	if n := strings.Count(out.String(), "\r"); n != 1 {
		t.Fatalf("100 updates within one interval drew %d times, want 1", n)
	}
	now = now.Add(Interval)
	m.Update(1000, 0)
	m.Clear()
	if n := strings.Count(out.String(), "\r"); n != 4 {
		t.Fatalf("got %d carriage returns (%q), want 4: first draw, second draw, clear", n, out.String())
	}
	if strings.Contains(out.String(), "\n") {
		t.Fatal("Clear ended the line")
	}
	// Nothing reported, nothing drawn: work that was not needed (a fill
	// of a store that already holds enough) leaves no line.
	out.Reset()
	idle := newMeter(&out, "fill", "blocks", Count, 10, func() time.Time { return now })
	idle.Done()
	if out.Len() != 0 {
		t.Fatalf("Done without updates drew %q", out.String())
	}
}
