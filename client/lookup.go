package client

import (
	"syscall"

	"github.com/kvfs/kvfs/ctl/abi"
)

// LookupPair is one block LOOKUP asks about, with the tag it must carry
// (zero: any).
type LookupPair struct {
	Block uint64
	Tag   Tag
}

// LookupStatus is LOOKUP's answer for one pair.
type LookupStatus = abi.LookupStatus

// Pair statuses.
const (
	LookupPresent     = abi.LookupPresent
	LookupAbsent      = abi.LookupAbsent
	LookupTagMismatch = abi.LookupTagMismatch
)

// LookupResult is LOOKUP's answer for a sequence of pairs.
type LookupResult struct {
	Statuses                  []LookupStatus // one per pair
	Present, Absent, Mismatch int
	// Run is the number of leading pairs that are present: the blocks of
	// the sequence a request can reuse.
	Run int
}

// Lookup asks whether each pair's block is stored whole under its tag
// (abi.CapPrefix; ENOTTY without). It reads no payload and pins nothing;
// the answer may be stale by the next LOAD. Up to abi.LookupInlineMax pairs
// go inline in one ioctl; more go through a registered array,
// abi.LookupMax pairs per ioctl, with Run carried across them. No pairs:
// an empty result, no ioctl.
func (c *Client) Lookup(ps []LookupPair) (LookupResult, error) {
	r := LookupResult{Statuses: make([]LookupStatus, len(ps))}
	if !c.info.Has(abi.CapPrefix) {
		return r, &Error{Op: "lookup", Errno: syscall.ENOTTY}
	}
	if len(ps) == 0 {
		return r, nil
	}
	if len(ps) <= abi.LookupInlineMax {
		raw := make([]byte, abi.LookupInlineSize)
		encodeLookup(raw, ps, 0, 0)
		if _, err := c.Ioctl(abi.CmdLookupInline, raw); err != nil {
			return r, &Error{Op: "lookup", Errno: err.(syscall.Errno)}
		}
		decodeLookup(&r, raw, raw[abi.LookupSize:], 0, len(ps))
		return r, nil
	}
	arr, err := c.entryArray()
	if err != nil {
		return r, err
	}
	defer c.putEntryArray(arr)
	per := min(abi.LookupMax, len(arr.Mem)/abi.LookupPairSize)
	for lo := 0; lo < len(ps); lo += per {
		if err := c.LookupIn(arr, 0, ps[lo:min(len(ps), lo+per)], &r, lo); err != nil {
			return r, err
		}
	}
	return r, nil
}

// LookupIn is LOOKUP with the pair array at offset off (a multiple of 8)
// of a registered buffer buf the caller owns: the pairs are written there,
// the daemon writes each status back, and r gets them as the pairs from
// index at of r.Statuses (which must have room), its counts adding up and
// its Run extended while every pair so far is present.
func (c *Client) LookupIn(buf *HostBuffer, off int, ps []LookupPair, r *LookupResult, at int) error {
	if len(ps) == 0 {
		return nil
	}
	if off < 0 || off+len(ps)*abi.LookupPairSize > len(buf.Mem) || at < 0 || at+len(ps) > len(r.Statuses) {
		return &Error{Op: "lookup", Errno: syscall.ERANGE}
	}
	mem := buf.Mem[off:]
	var raw [abi.LookupSize]byte
	encodeLookup(raw[:], ps, uint32(buf.ID), uint64(off))
	for i := range ps {
		(&abi.LookupPair{Block: ps[i].Block, Tag: ps[i].Tag}).Marshal(mem[i*abi.LookupPairSize:])
	}
	if _, err := c.Ioctl(abi.CmdLookup, raw[:]); err != nil {
		return &Error{Op: "lookup", Errno: err.(syscall.Errno)}
	}
	decodeLookup(r, raw[:], mem, at, len(ps))
	return nil
}

// encodeLookup writes the header of a LOOKUP of ps into b, and the pairs
// after it for the inline form (buffer 0).
func encodeLookup(b []byte, ps []LookupPair, buffer uint32, off uint64) {
	(&abi.LookupHeader{ABI: abi.Version, Count: uint32(len(ps)), Buffer: buffer, Offset: off}).Marshal(b)
	if buffer != 0 {
		return
	}
	for i := range ps {
		(&abi.LookupPair{Block: ps[i].Block, Tag: ps[i].Tag}).Marshal(b[abi.LookupSize+i*abi.LookupPairSize:])
	}
}

// decodeLookup adds the answer of one LOOKUP of n pairs (header hdr, pair
// statuses in pairs) to r, as the pairs from index at.
func decodeLookup(r *LookupResult, hdr, pairs []byte, at, n int) {
	var h abi.LookupHeader
	h.Unmarshal(hdr)
	r.Present += int(h.Present)
	r.Absent += int(h.Absent)
	r.Mismatch += int(h.Mismatch)
	for i := range n {
		r.Statuses[at+i] = LookupStatus(pairs[i*abi.LookupPairSize+abi.LookupStatusOff])
	}
	if r.Run == at {
		r.Run += int(h.Run)
	}
}
