package abi

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
)

// Sentinel errors of the decoder, one for each way a request can be wrong.
// Errors returned by Decode and Check wrap exactly one of them.
var (
	ErrCommand  = errors.New("kvfs/abi: unknown ioctl command")
	ErrSize     = errors.New("kvfs/abi: argument size does not match the command")
	ErrVersion  = errors.New("kvfs/abi: unsupported ABI version")
	ErrCount    = errors.New("kvfs/abi: entry count above the batch capacity")
	ErrFlags    = errors.New("kvfs/abi: unknown flags")
	ErrReserved = errors.New("kvfs/abi: reserved field not zero")
	ErrPath     = errors.New("kvfs/abi: malformed path")
	ErrFD       = errors.New("kvfs/abi: negative file descriptor")

	// Per-entry errors; an entry that fails gets status BadRequest and the
	// matching Detail, and the rest of the batch proceeds.
	ErrKey    = errors.New("kvfs/abi: layer, head or kind outside the geometry")
	ErrBuffer = errors.New("kvfs/abi: buffer not registered on this handle")
	ErrRange  = errors.New("kvfs/abi: tile outside the registered buffer")
	ErrPitch  = errors.New("kvfs/abi: pitch smaller than a row")
)

// ErrOverlap is the per-entry error of a LOAD entry whose destination
// overlaps another entry's (Detail BadOverlap); the check is the server's.
var ErrOverlap = errors.New("kvfs/abi: destination overlaps another entry's")

// Op is what a command does.
type Op uint8

// Operations.
const (
	OpInfo Op = iota + 1
	OpRegisterHost
	OpUnregister
	OpLoad
	OpStore
	OpRegisterFD
)

func (o Op) String() string {
	switch o {
	case OpInfo:
		return "info"
	case OpRegisterHost:
		return "register-host"
	case OpUnregister:
		return "unregister"
	case OpLoad:
		return "load"
	case OpStore:
		return "store"
	case OpRegisterFD:
		return "register-fd"
	case OpRegisterCUDA:
		return "register-cuda"
	case OpLookup:
		return "lookup"
	}
	if b := o.blocksString(); b != "" {
		return b
	}
	return "op(" + itoa(int(o)) + ")"
}

// Command describes one ioctl command.
type Command struct {
	Op   Op
	Size int // _IOC_SIZE
	In   bool
	Out  bool
	// Max: batch capacity (OpLoad, OpStore, OpLoadBlocks, OpStoreBlocks:
	// of 32-byte entries; BlocksInlineTaggedMax applies to tagged inline
	// entries), or the pairs of OpLookup.
	Max int
	// Inline: LOAD_BLOCKS/STORE_BLOCKS/LOOKUP with the entries in the
	// argument.
	Inline bool
}

// Lookup returns the command cmd stands for.
func Lookup(cmd uint32) (Command, error) {
	var c Command
	switch cmd {
	case CmdInfo:
		c = Command{Op: OpInfo}
	case CmdRegisterHost:
		c = Command{Op: OpRegisterHost}
	case CmdUnregister:
		c = Command{Op: OpUnregister}
	case CmdRegisterFD:
		c = Command{Op: OpRegisterFD}
	case CmdRegisterCUDA:
		c = Command{Op: OpRegisterCUDA}
	case CmdLoad:
		c = Command{Op: OpLoad, Max: BatchMax}
	case CmdStore:
		c = Command{Op: OpStore, Max: BatchMax}
	case CmdLoadSmall:
		c = Command{Op: OpLoad, Max: BatchSmallMax}
	case CmdStoreSmall:
		c = Command{Op: OpStore, Max: BatchSmallMax}
	default:
		var ok bool
		if c, ok = lookupBlocks(cmd); !ok {
			c, ok = lookupPrefix(cmd)
		}
		if !ok {
			return Command{}, fmt.Errorf("%w: %#08x", ErrCommand, cmd)
		}
	}
	c.Size = IoctlSize(cmd)
	c.In = IoctlDir(cmd)&dirWrite != 0
	c.Out = IoctlDir(cmd)&dirRead != 0
	return c, nil
}

// Request is a decoded ioctl argument. Entries of a batch stay encoded in
// Entries (Count × EntrySize bytes of the input) and are decoded one by one
// with Entry.Unmarshal, so a batch costs no allocation.
type Request struct {
	Command
	Register     RegisterHost // OpRegisterHost
	Path         string       // OpRegisterHost: Register.Path up to its NUL
	Unregister   Unregister   // OpUnregister
	RegisterFD   RegisterFD   // OpRegisterFD
	RegisterCUDA RegisterCUDA // OpRegisterCUDA
	Header       BatchHeader  // OpLoad, OpStore
	Entries      []byte       // OpLoad, OpStore

	// Blocks is the input of the minor-2 commands (blocks.go).
	Blocks BlocksRequest
	// Lookup is the input of LOOKUP (prefix.go).
	Lookup LookupRequest
}

// Decode checks an ioctl's command and argument sizes and decodes its input.
// in and out are the bytes the kernel passes in and expects back; for a
// restricted ioctl each is _IOC_SIZE(cmd) long when the direction has it,
// else empty.
func Decode(cmd uint32, in []byte, outLen int) (Request, error) {
	c, err := Lookup(cmd)
	if err != nil {
		return Request{}, err
	}
	wantIn, wantOut := 0, 0
	if c.In {
		wantIn = c.Size
	}
	if c.Out {
		wantOut = c.Size
	}
	if len(in) != wantIn || outLen != wantOut {
		return Request{}, fmt.Errorf("%w: %v takes %d bytes in and %d out, got %d and %d",
			ErrSize, c.Op, wantIn, wantOut, len(in), outLen)
	}
	r := Request{Command: c}
	switch c.Op {
	case OpInfo:
	case OpRegisterHost:
		r.Register.Unmarshal(in)
		if err := checkVersion(r.Register.ABI); err != nil {
			return r, err
		}
		if r.Register.Flags != 0 {
			return r, fmt.Errorf("%w: register flags %#x", ErrFlags, r.Register.Flags)
		}
		if r.Register.Buffer != 0 || r.Register.Reserved0 != 0 || r.Register.Reserved1 != 0 {
			return r, fmt.Errorf("%w: in register request", ErrReserved)
		}
		n := bytes.IndexByte(r.Register.Path[:], 0)
		if n < 0 {
			return r, fmt.Errorf("%w: not NUL terminated", ErrPath)
		}
		if n == 0 {
			return r, fmt.Errorf("%w: empty", ErrPath)
		}
		r.Path = string(r.Register.Path[:n])
		if r.Path[0] != '/' {
			return r, fmt.Errorf("%w: %q is not absolute", ErrPath, r.Path)
		}
	case OpRegisterFD:
		r.RegisterFD.Unmarshal(in)
		q := &r.RegisterFD
		if err := checkVersion(q.ABI); err != nil {
			return r, err
		}
		if q.Flags != 0 {
			return r, fmt.Errorf("%w: register flags %#x", ErrFlags, q.Flags)
		}
		if q.Buffer != 0 || q.Pinned != 0 || q.Reserved0 != 0 || q.Reserved != [4]uint64{} {
			return r, fmt.Errorf("%w: in register-fd request", ErrReserved)
		}
		if q.FD < 0 {
			return r, fmt.Errorf("%w: %d", ErrFD, q.FD)
		}
	case OpRegisterCUDA:
		if err := r.RegisterCUDA.decode(in); err != nil {
			return r, err
		}
	case OpUnregister:
		r.Unregister.Unmarshal(in)
		if err := checkVersion(r.Unregister.ABI); err != nil {
			return r, err
		}
	case OpLoad, OpStore:
		r.Header.Unmarshal(in)
		if err := checkVersion(r.Header.ABI); err != nil {
			return r, err
		}
		if r.Header.Flags != 0 {
			return r, fmt.Errorf("%w: batch flags %#x", ErrFlags, r.Header.Flags)
		}
		if r.Header.Count > uint32(c.Max) {
			return r, fmt.Errorf("%w: %d entries, at most %d", ErrCount, r.Header.Count, c.Max)
		}
		r.Entries = in[BatchHeaderSize : BatchHeaderSize+int(r.Header.Count)*EntrySize]
	case OpLookup:
		if err := decodeLookup(c, in, &r.Lookup); err != nil {
			return r, err
		}
	default:
		if err := decodeBlocks(c, in, &r.Blocks); err != nil {
			return r, err
		}
	}
	return r, nil
}

func checkVersion(v uint32) error {
	if v != Version {
		return fmt.Errorf("%w: %d (this daemon speaks %d)", ErrVersion, v, Version)
	}
	return nil
}

// Tile is the geometry an entry is checked against.
type Tile struct {
	Layers   uint32 // layers of the store
	KVHeads  uint32 // kv heads of the store
	Rows     uint32 // block_tokens: rows of one tile
	RowBytes uint32 // head_dim × dtype bytes
}

// Extent is the number of bytes a tile with the given pitch spans from its
// first byte: Rows × RowBytes when packed (pitch 0), else
// (Rows-1) × pitch + RowBytes. ok is false when pitch is nonzero but smaller
// than a row, or the extent does not fit in 64 bits.
func (t Tile) Extent(pitch uint32) (n uint64, ok bool) {
	if pitch == 0 {
		return uint64(t.Rows) * uint64(t.RowBytes), true
	}
	if pitch < t.RowBytes {
		return 0, false
	}
	if t.Rows == 0 {
		return 0, true
	}
	hi, lo := bits.Mul64(uint64(t.Rows-1), uint64(pitch))
	if hi != 0 {
		return 0, false
	}
	n, carry := bits.Add64(lo, uint64(t.RowBytes), 0)
	return n, carry == 0
}

// Check validates one entry against the geometry and the length of the
// buffer it names (known is false when the buffer id is not registered on
// the handle). It returns nil or an error wrapping ErrReserved, ErrKey,
// ErrBuffer, ErrPitch or ErrRange, in that order of precedence, and the
// extent of the tile in the buffer. Arithmetic cannot overflow: a request
// passes only when Offset + extent ≤ bufLen holds in exact integers.
func (t Tile) Check(e *Entry, bufLen uint64, known bool) (extent uint64, err error) {
	if e.Reserved != 0 {
		return 0, fmt.Errorf("%w: entry byte 31 is %#x", ErrReserved, e.Reserved)
	}
	if uint32(e.Layer) >= t.Layers || uint32(e.Head) >= t.KVHeads || e.Kind > 1 {
		return 0, fmt.Errorf("%w: layer %d head %d kind %d (store has %d layers, %d heads)",
			ErrKey, e.Layer, e.Head, e.Kind, t.Layers, t.KVHeads)
	}
	if !known {
		return 0, fmt.Errorf("%w: id %d", ErrBuffer, e.Buffer)
	}
	extent, ok := t.Extent(e.Pitch)
	if !ok {
		return 0, fmt.Errorf("%w: pitch %d, rows are %d bytes", ErrPitch, e.Pitch, t.RowBytes)
	}
	if e.Offset > bufLen || extent > bufLen-e.Offset {
		return 0, fmt.Errorf("%w: %d bytes at offset %d in a buffer of %d", ErrRange, extent, e.Offset, bufLen)
	}
	return extent, nil
}

// DetailOf maps an error from Check to the entry's Detail.
func DetailOf(err error) Detail {
	switch {
	case err == nil:
		return BadNone
	case errors.Is(err, ErrReserved):
		return BadReserved
	case errors.Is(err, ErrKey):
		return BadKey
	case errors.Is(err, ErrBuffer):
		return BadBuffer
	case errors.Is(err, ErrPitch):
		return BadPitch
	case errors.Is(err, ErrOverlap):
		return BadOverlap
	case errors.Is(err, ErrParent):
		return BadParent
	case errors.Is(err, ErrMeta):
		return BadMeta
	}
	return BadRange
}
