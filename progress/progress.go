// Package progress draws one self-rewriting status line for long work
// (format, fsck, fills) on a terminal: what is done of the total, the rate
// and the time left. On anything that is not a terminal (a pipe, a file, a
// CI log) it writes nothing, so scripted output stays what it was.
//
// Library packages do not import it: they take a func(done, total int64)
// callback (see Meter.Update) and the command line wires a Meter to it.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/kvfs/kvfs/internal/bytesize"
)

// Unit says how Meter prints amounts.
type Unit int

const (
	// Count prints plain numbers ("1200/5000 blocks").
	Count Unit = iota
	// Bytes prints binary sizes and a byte rate ("1.2 GiB/4.0 GiB, 850 MiB/s").
	Bytes
)

// Interval is the least time between two redraws.
const Interval = 200 * time.Millisecond

// Meter is one status line. Its methods are safe for concurrent use; a nil
// or inactive Meter does nothing.
type Meter struct {
	mu     sync.Mutex
	w      io.Writer
	label  string
	noun   string
	unit   Unit
	total  int64
	done   int64
	start  time.Time
	last   time.Time
	now    func() time.Time
	width  int // length of the last line drawn, to blank what a shorter one leaves
	drawn  bool
	closed bool
}

// IsTerminal reports whether w is a terminal (an *os.File whose descriptor
// is a tty).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// New returns a Meter that draws on w when w is a terminal, and an inactive
// one (drawing nothing) otherwise. label names the work ("fsck"), noun the
// things counted in Count mode ("blocks"); total may be 0 when unknown.
func New(w io.Writer, label, noun string, unit Unit, total int64) *Meter {
	if !IsTerminal(w) {
		return nil
	}
	return newMeter(w, label, noun, unit, total, time.Now)
}

// Stderr is New on os.Stderr.
func Stderr(label, noun string, unit Unit, total int64) *Meter {
	return New(os.Stderr, label, noun, unit, total)
}

func newMeter(w io.Writer, label, noun string, unit Unit, total int64, now func() time.Time) *Meter {
	t := now()
	return &Meter{w: w, label: label, noun: noun, unit: unit, total: total, start: t, now: now}
}

// Active reports whether m draws anything.
func (m *Meter) Active() bool { return m != nil }

// Update sets what is done and the total (0 keeps the total); it has the
// shape of the progress callbacks library packages take.
func (m *Meter) Update(done, total int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if total > 0 {
		m.total = total
	}
	m.done = done
	m.maybeDraw()
}

// Add counts n more done.
func (m *Meter) Add(n int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.done += n
	m.maybeDraw()
}

// Done draws the final line and ends it with a newline, so what is printed
// next starts on its own line. A meter that never drew (no work was
// reported) stays silent. Later calls do nothing.
func (m *Meter) Done() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || !m.drawn {
		m.closed = true
		return
	}
	m.closed = true
	m.draw(true)
	fmt.Fprint(m.w, "\n")
}

// Clear erases the line without a final report (for work that failed).
func (m *Meter) Clear() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.closed = true
	if m.drawn {
		fmt.Fprintf(m.w, "\r%s\r", strings.Repeat(" ", m.width))
	}
}

func (m *Meter) maybeDraw() {
	if m.closed {
		return
	}
	t := m.now()
	if m.drawn && t.Sub(m.last) < Interval {
		return
	}
	m.last = t
	m.draw(false)
}

// draw writes the line; a write error (the terminal went away) is ignored:
// progress never fails the work it reports on.
func (m *Meter) draw(final bool) {
	line := m.line(m.now(), final)
	pad := ""
	if n := m.width - len(line); n > 0 {
		pad = strings.Repeat(" ", n)
	}
	fmt.Fprintf(m.w, "\r%s%s", line, pad)
	m.width = len(line)
	m.drawn = true
}

// line is the status text at time t.
func (m *Meter) line(t time.Time, final bool) string {
	el := t.Sub(m.start)
	var b strings.Builder
	b.WriteString(m.label)
	b.WriteString(": ")
	if m.total > 0 {
		pct := float64(m.done) / float64(m.total) * 100
		fmt.Fprintf(&b, "%3.0f%% ", min(pct, 100))
		b.WriteString(m.amount(m.done))
		b.WriteString("/")
		b.WriteString(m.amount(m.total))
	} else {
		b.WriteString(m.amount(m.done))
	}
	if m.unit == Count && m.noun != "" {
		b.WriteString(" " + m.noun)
	}
	if s := el.Seconds(); s > 0 && m.done > 0 {
		rate := float64(m.done) / s
		b.WriteString(", ")
		if m.unit == Bytes {
			b.WriteString(bytesize.Format(int64(rate)) + "/s")
		} else {
			fmt.Fprintf(&b, "%.0f/s", rate)
		}
		switch {
		case final:
			fmt.Fprintf(&b, " in %s", roundDur(el))
		case m.total > m.done:
			left := time.Duration(float64(m.total-m.done) / rate * float64(time.Second))
			fmt.Fprintf(&b, ", %s left", roundDur(left))
		}
	}
	return b.String()
}

func (m *Meter) amount(n int64) string {
	if m.unit == Bytes {
		return bytesize.Format(n)
	}
	return fmt.Sprint(n)
}

func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	default:
		return d.Round(time.Millisecond)
	}
}
