package client

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kvfs/kvfs/internal/bytesize"
	"github.com/kvfs/kvfs/layout"
)

// A requests file lists groups to load, one per line, either as fields
//
//	BLOCK LAYER HEAD KIND [OFFSET [PITCH]]
//
// (BLOCK in hex, LAYER and HEAD in decimal, KIND K or V, OFFSET and PITCH in
// bytes, units like 64KiB allowed) or as a JSON object:
//
//	{"block": "00ab", "layer": 0, "head": 1, "kind": "V", "offset": 4096, "pitch": 0}
//
// ("block" may also be a number). Blank lines and lines starting with # are
// skipped. A line without OFFSET is packed after the requests before it
// (PlaceRequests); PITCH 0 means the tile's rows are contiguous. kvfs load
// reads these files; its help text says the same for users.

// Request is one parsed line of a requests file. The exported fields with
// JSON names are what kvfs load --json prints for each entry.
type Request struct {
	Line   int    `json:"line"`  // 1-based line in the file
	Block  string `json:"block"` // 16 hex digits
	Layer  int    `json:"layer"`
	Head   int    `json:"head"`
	Kind   string `json:"kind"`
	Offset uint64 `json:"offset"`
	Pitch  uint32 `json:"pitch"`

	// Key is the group the line names.
	Key layout.Key `json:"-"`
	// AutoOffset is set when the line gives no offset; PlaceRequests
	// assigns one.
	AutoOffset bool `json:"-"`
}

// RequestError is a line of a requests file that does not parse, or that
// does not fit the daemon's geometry or the buffer (PlaceRequests).
type RequestError struct {
	Line int
	Err  error
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("kvfs client: requests line %d: %v", e.Line, e.Err)
}

func (e *RequestError) Unwrap() error { return e.Err }

// Entry is the request as an Entry of buffer id.
func (q *Request) Entry(id BufferID) Entry {
	return Entry{Key: q.Key, Buffer: id, Offset: q.Offset, Pitch: q.Pitch}
}

// ParseRequests reads a requests file. A line that does not parse is a
// *RequestError; nothing is returned then.
func ParseRequests(r io.Reader) ([]Request, error) {
	var out []Request
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		q := Request{Line: n}
		var err error
		if line[0] == '{' {
			err = q.parseJSON(line)
		} else {
			err = q.parseFields(strings.Fields(line))
		}
		if err != nil {
			return nil, &RequestError{Line: n, Err: err}
		}
		out = append(out, q)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kvfs client: requests: %w", err)
	}
	return out, nil
}

func (q *Request) parseFields(f []string) error {
	if len(f) < 4 || len(f) > 6 {
		return fmt.Errorf("want BLOCK LAYER HEAD KIND [OFFSET [PITCH]], got %d fields", len(f))
	}
	var err error
	if q.Key.Block, err = layout.ParseBlockID(f[0]); err != nil {
		return err
	}
	if q.Key.Layer, err = strconv.Atoi(f[1]); err != nil || q.Key.Layer < 0 {
		return fmt.Errorf("layer %q is not a number", f[1])
	}
	if q.Key.Head, err = strconv.Atoi(f[2]); err != nil || q.Key.Head < 0 {
		return fmt.Errorf("head %q is not a number", f[2])
	}
	if q.Key.Kind, err = layout.ParseKind(f[3]); err != nil {
		return err
	}
	q.AutoOffset = true
	if len(f) > 4 {
		off, err := bytesize.Parse(f[4])
		if err != nil {
			return fmt.Errorf("offset: %w", err)
		}
		q.Offset, q.AutoOffset = uint64(off), false
	}
	if len(f) > 5 {
		p, err := bytesize.Parse(f[5])
		if err != nil || p > 1<<32-1 {
			return fmt.Errorf("pitch %q: want bytes below 4 GiB", f[5])
		}
		q.Pitch = uint32(p)
	}
	q.fill()
	return nil
}

func (q *Request) parseJSON(line string) error {
	var j struct {
		Block  json.RawMessage `json:"block"`
		Layer  *int            `json:"layer"`
		Head   *int            `json:"head"`
		Kind   string          `json:"kind"`
		Offset *uint64         `json:"offset"`
		Pitch  uint32          `json:"pitch"`
	}
	d := json.NewDecoder(strings.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&j); err != nil {
		return err
	}
	if j.Layer == nil || j.Head == nil || len(j.Block) == 0 {
		return errors.New(`want at least "block", "layer", "head" and "kind"`)
	}
	var s string
	if json.Unmarshal(j.Block, &s) != nil {
		var n uint64
		if err := json.Unmarshal(j.Block, &n); err != nil {
			return fmt.Errorf("block %s: want a hex string or a number", j.Block)
		}
		s = strconv.FormatUint(n, 16)
	}
	var err error
	if q.Key.Block, err = layout.ParseBlockID(s); err != nil {
		return err
	}
	if *j.Layer < 0 || *j.Head < 0 {
		return errors.New("negative layer or head")
	}
	q.Key.Layer, q.Key.Head, q.Pitch = *j.Layer, *j.Head, j.Pitch
	if q.Key.Kind, err = layout.ParseKind(j.Kind); err != nil {
		return err
	}
	q.AutoOffset = j.Offset == nil
	if j.Offset != nil {
		q.Offset = *j.Offset
	}
	q.fill()
	return nil
}

// fill sets the printed fields from Key.
func (q *Request) fill() {
	q.Block, q.Layer, q.Head, q.Kind = fmt.Sprintf("%016x", q.Key.Block), q.Key.Layer, q.Key.Head, q.Key.Kind.String()
}

// maxBufferEnd bounds where a request may end in its buffer (64 TiB).
const maxBufferEnd = 1 << 46

// PlaceRequests gives every request without an offset the first byte after
// the furthest end of the requests before it, and returns the buffer size
// all of them need. A pitch shorter than a row, or an end past 64 TiB, is a
// *RequestError.
func PlaceRequests(reqs []Request, info Info) (int64, error) {
	var next, size uint64
	for i := range reqs {
		q := &reqs[i]
		if q.AutoOffset {
			q.Offset = next
		}
		ext := uint64(info.GroupBytes)
		if q.Pitch != 0 {
			if int(q.Pitch) < info.RowBytes {
				return 0, &RequestError{Line: q.Line, Err: fmt.Errorf("pitch %d is smaller than a row (%d bytes)", q.Pitch, info.RowBytes)}
			}
			ext = uint64(info.Geometry.BlockTokens-1)*uint64(q.Pitch) + uint64(info.RowBytes)
		}
		end := q.Offset + ext
		if end < q.Offset || end > maxBufferEnd {
			return 0, &RequestError{Line: q.Line, Err: fmt.Errorf("offset %d is too large", q.Offset)}
		}
		next = max(next, end)
		size = max(size, end)
	}
	return int64(size), nil
}
