package logsink

import (
	"os"
	"path/filepath"
	"testing"
)

// TestStreamClosedPipe: writes to a pipe whose reader is gone succeed (and
// are dropped) instead of failing; SIGPIPE must be ignored by the process,
// as kvfs mount does.
func TestStreamClosedPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s := Stream(w)
	if n, err := s.Write([]byte("first\n")); err != nil || n != 6 {
		t.Fatalf("write: %d %v", n, err)
	}
	r.Close()
	// os.File writes to a broken pipe on fds other than 1 and 2 return
	// EPIPE without raising SIGPIPE.
	if n, err := s.Write([]byte("second\n")); err != nil || n != 7 {
		t.Fatalf("write to a closed pipe: %d %v", n, err)
	}
	if s.Dropped() != 1 {
		t.Fatalf("dropped %d, want 1", s.Dropped())
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestReopen: after the file is renamed away (logrotate), Reopen creates a
// new one at the path; the old one keeps what was written before.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "kvfs.log")
	s, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Write([]byte("before\n"))
	if err := os.Rename(p, p+".1"); err != nil {
		t.Fatal(err)
	}
	s.Write([]byte("still old\n"))
	if err := s.Reopen(); err != nil {
		t.Fatal(err)
	}
	s.Write([]byte("after\n"))
	old, _ := os.ReadFile(p + ".1")
	cur, _ := os.ReadFile(p)
	if string(old) != "before\nstill old\n" || string(cur) != "after\n" {
		t.Fatalf("rotated %q, current %q", old, cur)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Write([]byte("closed\n")); err != nil || n != 7 || s.Dropped() != 1 {
		t.Fatalf("write after close: %d %v dropped %d", n, err, s.Dropped())
	}
}

// TestOpenBadPath: a log file that cannot be created is an error.
func TestOpenBadPath(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "missing", "kvfs.log"))
	if err == nil {
		t.Fatal("Open of a path in a missing directory succeeded")
	}
}
