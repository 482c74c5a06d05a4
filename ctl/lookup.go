package ctl

import (
	"fmt"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/internal/freelist"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/index"
)

// lookupScratch is one LOOKUP's working memory, kept for the next call.
type lookupScratch struct {
	blocks []uint64
	tags   []store.Tag
	st     []index.Status
}

// lookupScratches keeps idle scratch: up to 16, one per caller of a busy
// daemon (2.5 MiB each at LookupMax pairs).
var lookupScratches = freelist.List[lookupScratch]{Max: 16}

// lookupStatus is the ABI's status for the store's answer.
func lookupStatus(s index.Status) abi.LookupStatus {
	switch s {
	case index.Present:
		return abi.LookupPresent
	case index.TagMismatch:
		return abi.LookupTagMismatch
	}
	return abi.LookupAbsent
}

// lookup serves LOOKUP (and its inline form): it copies the (block, tag)
// pairs into daemon memory (a client changing them during the call changes
// nothing), asks the store's index (Store.Lookup: no payload is read,
// nothing is pinned, no block counts as used), writes each pair's status
// back and the counts into the header. It returns the leading run of
// present pairs: how many blocks of the prefix the store can serve.
func (ss *Session) lookup(req *abi.Request, in, out []byte) (int32, error) {
	h := &req.Lookup.Header
	n := int(h.Count)
	copy(out, in)

	ss.io.RLock()
	defer ss.io.RUnlock()
	var eb *buffer
	var arr []byte // the pair array in the registered buffer
	if !req.Inline {
		ss.mu.Lock()
		if ss.mu.closed {
			ss.mu.Unlock()
			return 0, ErrClosed
		}
		eb = ss.mu.bufs[h.Buffer]
		ss.mu.Unlock()
		if eb == nil {
			return 0, fmt.Errorf("%w: %d", ErrEntryBuffer, h.Buffer)
		}
		size := uint64(n) * abi.LookupPairSize
		if l := uint64(len(eb.mem)); h.Offset > l || size > l-h.Offset {
			return 0, fmt.Errorf("%w: %d lookup pairs at offset %d of a buffer of %d host bytes", abi.ErrEntries, n, h.Offset, l)
		}
		arr = eb.mem[h.Offset : h.Offset+size]
	}
	src, dst := req.Lookup.Pairs, out[abi.LookupSize:]
	if arr != nil {
		src, dst = arr, arr
	}
	mine := func(addr uintptr) bool { return eb != nil && eb.contains(addr) }

	sc := lookupScratches.Get()
	defer lookupScratches.Put(sc)
	if cap(sc.blocks) < n {
		sc.blocks, sc.tags, sc.st = make([]uint64, n), make([]store.Tag, n), make([]index.Status, n)
	}
	blocks, tags, st := sc.blocks[:n], sc.tags[:n], sc.st[:n]
	if err := ss.guard(mine, func() error { return abi.DecodePairs(src, blocks, tags) }); err != nil {
		return 0, err
	}
	run := ss.srv.st.Lookup(blocks, tags, st)
	var res abi.LookupHeader
	if err := ss.guard(mine, func() error {
		for i, s := range st {
			ls := lookupStatus(s)
			switch ls {
			case abi.LookupPresent:
				res.Present++
			case abi.LookupTagMismatch:
				res.Mismatch++
			default:
				res.Absent++
			}
			abi.PutLookupStatus(dst, i, ls)
		}
		return nil
	}); err != nil {
		return 0, err
	}
	res.Run = uint32(run)
	res.PutResult(out[:abi.LookupSize])
	m := &ss.srv.m
	m.lookups.Add(1)
	m.lookedUp.Add(uint64(n))
	m.lookupHits.Add(uint64(res.Present))
	return int32(min(run, 1<<31-1)), nil
}
