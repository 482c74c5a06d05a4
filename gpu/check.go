package gpu

import (
	"errors"

	"github.com/kvfs/kvfs/store"
)

// The verification rule. Every load, whatever its route, follows one
// rule: a group's bytes are used — its load reported done, or for a
// direct load its slot given back to the store — only after its CRC32C
// was computed over bytes only the daemon or the device writes and
// matched the checksum its header records; a group that does not match is
// zeroed where it lies and reported store.ErrCorrupt. Who computes it is
// decided in one place, checksOnDevice:
//
//   - Without Verify, the store: the pipeline reads groups into staging
//     as verified store requests, and store.Read checks them there on the
//     CPU (zeroing a corrupt one, which the pipeline then copies as
//     zeros: goesOn) before any copy to the device is queued.
//   - With Verify, the device: reads are store.ReadReq.Unverified and
//     carry each group's recorded checksum out (Item.CRC, Tile.CRCs), and
//     once a chunk's copies completed, check hands its groups to the
//     device's checker: Verify for groups where they landed, Land for
//     groups in device scratch, which it checks as it writes their rows.

// checksOnDevice reports whether loads are checked on the device (Verify)
// rather than by the store in staging: every read the pipeline makes is
// store.ReadReq.Unverified exactly when it is.
func (p *Pipeline) checksOnDevice() bool { return p.Verify != nil }

// check applies the rule to groups whose copies completed: inPlace are
// checked where they landed (Verify), landed are checked in device
// scratch at srcs and written into their tiles (Land). When the checker
// fails as a whole, the items it left without an outcome fail with its
// error (their tiles are undefined).
func (p *Pipeline) check(inPlace []*Item, landed []*Item, srcs []uint64) {
	if len(inPlace) > 0 {
		before := failedGroups(inPlace)
		err := p.Verify(inPlace)
		p.noteCorrupt(failedGroups(inPlace) - before)
		failUnset(inPlace, err)
	}
	if len(landed) > 0 {
		before := failedGroups(landed)
		err := p.Land(landed, srcs)
		p.noteCorrupt(failedGroups(landed) - before)
		failUnset(landed, err)
	}
}

// failedGroups is how many groups of items have failed: a checker fails
// only the groups it finds corrupt (FailHead), so what it adds to this
// count is its corrupt groups.
func failedGroups(items []*Item) int {
	n := 0
	for _, it := range items {
		switch {
		case it.Tile != nil:
			n += it.Tile.Failed
		case it.Err != nil:
			n++
		}
	}
	return n
}

// noteCorrupt tells Corrupt of n groups a check found corrupt.
func (p *Pipeline) noteCorrupt(n int) {
	if n > 0 && p.Corrupt != nil {
		p.Corrupt(n)
	}
}

// goesOn reports whether a group whose read ended with err goes on to its
// tile: one that landed, and one the store found corrupt, whose bytes it
// zeroed (copied as zeros, so the tile holds no stale group as if good);
// not one that is missing or whose read failed, whose tile is left as it
// was.
func goesOn(err error) bool { return err == nil || errors.Is(err, store.ErrCorrupt) }

// failUnset gives err, when not nil, to the items without an outcome.
func failUnset(items []*Item, err error) {
	if err == nil {
		return
	}
	for _, it := range items {
		if !it.done() {
			it.failAll(err)
		}
	}
}
