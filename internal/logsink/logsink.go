// Package logsink is where a long-running kvfs process writes its log: a
// stream (stderr) whose reader may go away, or a file that logrotate may
// move. A log line that cannot be written is dropped, never fatal: a daemon
// must outlive its log reader (`kvfs mount … 2>&1 | head -n 2`).
package logsink

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
)

// Sink is a zapcore.WriteSyncer that never fails: write errors (EPIPE on a
// closed pipe, ENOSPC, …) are counted and the line is dropped. With a file
// (Open), Reopen closes it and opens the same path again (SIGHUP after
// logrotate moved it).
type Sink struct {
	mu      sync.Mutex
	w       io.Writer
	f       *os.File // the file of Open, nil for a stream
	path    string
	dropped atomic.Uint64
}

// Stream returns a sink writing to w (typically os.Stderr).
func Stream(w io.Writer) *Sink { return &Sink{w: w} }

// Open returns a sink appending to the file at path, created 0644 if
// missing.
func Open(path string) (*Sink, error) {
	f, err := openLog(path)
	if err != nil {
		return nil, err
	}
	return &Sink{w: f, f: f, path: path}, nil
}

func openLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("log file: %w", err)
	}
	return f, nil
}

// Write writes p, or drops it when the destination fails; it always reports
// success so that the logger never reports or retries.
func (s *Sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w == nil {
		s.dropped.Add(1)
		return len(p), nil
	}
	if _, err := s.w.Write(p); err != nil {
		s.dropped.Add(1)
	}
	return len(p), nil
}

// Sync flushes a file sink; errors are ignored like those of Write.
func (s *Sink) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		_ = s.f.Sync()
	}
	return nil
}

// Dropped returns how many writes failed and were dropped.
func (s *Sink) Dropped() uint64 { return s.dropped.Load() }

// Path returns the file of an Open sink, "" for a stream.
func (s *Sink) Path() string { return s.path }

// Reopen opens the sink's path again and switches to it, closing the old
// file. On error the sink keeps writing to the old file. A stream sink has
// nothing to reopen.
func (s *Sink) Reopen() error {
	if s.path == "" {
		return nil
	}
	f, err := openLog(s.path)
	if err != nil {
		return err
	}
	s.mu.Lock()
	old := s.f
	s.w, s.f = f, f
	s.mu.Unlock()
	return old.Close()
}

// Close closes a file sink; later writes are dropped.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		s.w = nil
		return nil
	}
	err := s.f.Close()
	s.w, s.f = nil, nil
	return err
}
