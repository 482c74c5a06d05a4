package store

import (
	"hash/crc32"
	"unsafe"
)

// crcShift advances a raw CRC32C register (no inversions) over n zero
// bytes, for one fixed n, by table: a linear map of the register's 32
// bits, one 256-entry table per byte of it. It joins checksums taken of
// consecutive segments apart: raw(s, A‖B) = shift(raw(s, A)) ^ raw(0, B)
// for |B| = n.
type crcShift [4][256]uint32

// newCRCShift builds the shift over n zero bytes from the images of the
// register's 32 single bits.
func newCRCShift(n int) *crcShift {
	zeros := make([]byte, n)
	var bit [32]uint32
	for i := range bit {
		// raw(s, p) = ^crc32.Update(^s, p)
		bit[i] = ^crc32.Update(^(uint32(1) << i), castagnoli, zeros)
	}
	t := new(crcShift)
	for k := range t {
		for b := range 256 {
			var v uint32
			for j := range 8 {
				if b&(1<<j) != 0 {
					v ^= bit[8*k+j]
				}
			}
			t[k][b] = v
		}
	}
	return t
}

func (t *crcShift) apply(x uint32) uint32 {
	return t[0][x&0xff] ^ t[1][x>>8&0xff] ^ t[2][x>>16&0xff] ^ t[3][x>>24]
}

// combine4 is the CRC32C of four consecutive segments of t's length from
// their raw checksums as crcCopyNT4 takes them.
func (t *crcShift) combine4(c *[4]uint32) uint32 {
	x := c[0]
	for _, ck := range c[1:] {
		x = t.apply(x) ^ ck
	}
	return ^x
}

// crcLand lands a bounced group b into w's destination and returns b's
// CRC32C, taken as the bytes go by: one pass over the source, which comes
// from memory once (the store file's mapping, or a chunk buffer) instead of
// once for the checksum and again, from cache, for the copy. Checked after
// landing, a corrupt group is zeroed in the destination (corruptReq), as a
// group landed straight there by a read is. Groups whose size or
// destination the four-chain copy does not fit take the checksum, then
// the copy.
func (s *Store) crcLand(w *want, b []byte) uint32 {
	if got, ok := s.copyOnePass(s.dst(w), b, w.rows, w.r.RowBytes, w.r.Pitch); ok {
		return got
	}
	got := CRC32C(b)
	s.land(w, b)
	return got
}

// copyOnePass is crcLand's and CopyGroup's one-pass copy of group b to
// dst (contiguous for rows 0, else rows of rb bytes pitch apart): the
// CRC32C of b, and whether it did it (onePass, and a shape and
// destination the four-chain copy takes).
func (s *Store) copyOnePass(dst, b []byte, rows, rb, pitch int) (uint32, bool) {
	if !s.onePass() {
		return 0, false
	}
	n := len(b)
	seg := n / 4
	if rows == 0 { // contiguous: each segment one row
		rows, rb, pitch = 4, seg, seg
	}
	if rows%4 != 0 || rb*rows != n || pitch < rb || !ntFits(dst, rows, rb, pitch) {
		return 0, false
	}
	c := [4]uint32{0xFFFFFFFF}
	crcCopyNT4(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(b)),
		seg, rows/4*pitch, rows/4, rb, pitch-rb, int(s.geo.GroupStride()), &c)
	return s.shift4.combine4(&c), true
}

// crcLand4 is crcLand for four bounced groups at once, ws[k] from b[k]:
// four checksum chains in step, one per group, each reading its group
// from start to end, instead of one group's quarters in step. It does so
// only where the four are alike: their sources one group stride apart
// (consecutive groups of a slot), their destinations of one shape, each
// fit for the one-pass copy, and equally far apart (consecutive heads of
// a tile in every cache layout kvfs knows); it reports whether it did,
// and the caller lands the groups one by one where it did not. Four whole
// groups in step, each read from start to end, move more than a group's
// quarters in step, most into head-major tiles (see docs/performance.md,
// 'Store batched reads'). Their checksums go to got; the copy prefetches
// from ahead bytes past the first group's source on (crcCopyNT4).
func (s *Store) crcLand4(ws []want, b *[4][]byte, got *[4]uint32, ahead int) bool {
	if !s.onePass() {
		return false
	}
	stride := int(s.geo.GroupStride())
	n := len(b[0])
	w0 := &ws[0]
	rows, rb, pitch := w0.rows, w0.r.RowBytes, w0.r.Pitch
	if rows == 0 { // contiguous: one row
		rows, rb, pitch = 1, n, n
	}
	if rb*rows != n || pitch < rb {
		return false
	}
	src := unsafe.SliceData(b[0])
	var d [4]unsafe.Pointer
	for k := range d {
		w := &ws[k]
		if w.rows != w0.rows || (w.rows != 0 && (w.r.RowBytes != rb || w.r.Pitch != pitch)) ||
			len(b[k]) != n || unsafe.SliceData(b[k]) != (*byte)(unsafe.Add(unsafe.Pointer(src), k*stride)) {
			return false
		}
		dst := s.dst(w)
		if !ntFits(dst, rows, rb, pitch) {
			return false
		}
		d[k] = unsafe.Pointer(unsafe.SliceData(dst))
	}
	dseg := uintptr(d[1]) - uintptr(d[0])
	if uintptr(d[2])-uintptr(d[1]) != dseg || uintptr(d[3])-uintptr(d[2]) != dseg {
		return false
	}
	*got = [4]uint32{0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}
	crcCopyNT4(d[0], unsafe.Pointer(src), stride, int(dseg), rows, rb, pitch-rb, ahead, got)
	for k := range got {
		got[k] = ^got[k]
	}
	return true
}

// onePass reports whether crcLand copies groups in one pass here (this
// store's group size and the machine allow it); where it does, a
// chunk read from the host view is not touched first (readInlineRun).
func (s *Store) onePass() bool { return s.shift4 != nil }

// CopyGroup copies one group's bytes src (contiguous, as stored) to dst,
// contiguous (rows 0) or rows of rowBytes bytes pitch apart, and returns
// their CRC32C. Where this store's group size and the machine allow it, it
// reads src once, checksumming in four chains and landing with
// non-temporal stores (as reads from a store file in memory land, see
// crcLand); otherwise it copies, then checksums what it copied. For a
// cache of whole groups in memory (the DRAM tier), whose hits are such
// copies.
func (s *Store) CopyGroup(dst, src []byte, rows, rowBytes, pitch int) uint32 {
	n := len(src)
	if n == s.geo.GroupBytes() {
		if got, ok := s.copyOnePass(dst, src, rows, rowBytes, pitch); ok {
			return got
		}
	}
	if rows == 0 {
		copy(dst[:n], src)
		return CRC32C(dst[:n])
	}
	var c uint32
	for i := range rows {
		d := dst[i*pitch : i*pitch+rowBytes]
		copy(d, src[i*rowBytes:(i+1)*rowBytes])
		c = crc32.Update(c, castagnoli, d)
	}
	return c
}

// GatherWrites fills each request's Data, a whole group packed as stored,
// from srcs[i]: contiguous (rows 0), or rows of rowBytes bytes pitch
// apart, as in a caller's cache (srcs[i] spans them: at least a group, or
// (rows-1)*pitch+rowBytes bytes); and records its CRC32C (CRC, Summed),
// so that Write reads no payload again. Where this store's group size
// and the machine allow it, each source is read once, checksummed on the
// way, and Data written with non-temporal stores: Data is staging that a
// write hands to the kernel or a disk next, which the CPU has no use for
// in its caches (and whose lines it need not read before writing them).
// Four requests go in step (four checksum chains, one per group, their
// rows read side by side) where their Data follow each other and their
// sources are equally far apart (consecutive heads of a tile, in every
// cache layout kvfs knows); the others one by one (a group's quarters in
// step). Without the one-pass copy it copies, then checksums the copy.
// Either way the checksum is of the bytes in Data, even when the source
// changes under the copy (a client rewriting its cache during its own
// store).
func (s *Store) GatherWrites(reqs []WriteReq, srcs [][]byte, rows, rowBytes, pitch int) {
	n := s.geo.GroupBytes()
	if rows == 0 { // contiguous: one row
		rows, rowBytes, pitch = 1, n, n
	}
	span := (rows-1)*pitch + rowBytes
	for i := 0; i < len(reqs); {
		if i+4 <= len(reqs) && s.gather4(reqs[i:i+4], srcs[i:i+4], rows, rowBytes, pitch, span) {
			i += 4
			continue
		}
		q := &reqs[i]
		q.CRC, q.Summed = s.gatherOne(q.Data[:n], srcs[i][:span], rows, rowBytes, pitch), true
		i++
	}
}

// gather4 is GatherWrites of four requests in step, and whether it did
// it: their Data n apart, their sources d apart, each span long, and the
// one-pass copy at hand.
func (s *Store) gather4(reqs []WriteReq, srcs [][]byte, rows, rowBytes, pitch, span int) bool {
	n := s.geo.GroupBytes()
	if !s.onePass() || rowBytes%64 != 0 || rows*rowBytes != n {
		return false
	}
	dst := unsafe.SliceData(reqs[0].Data)
	src := unsafe.Pointer(unsafe.SliceData(srcs[0]))
	d := uintptr(unsafe.Pointer(unsafe.SliceData(srcs[1]))) - uintptr(src)
	for k := range 4 {
		if len(reqs[k].Data) != n || len(srcs[k]) < span ||
			unsafe.SliceData(reqs[k].Data) != (*byte)(unsafe.Add(unsafe.Pointer(dst), k*n)) ||
			unsafe.Pointer(unsafe.SliceData(srcs[k])) != unsafe.Add(src, uintptr(k)*d) {
			return false
		}
	}
	// Prefetch the next row of the four, or, for one row each, the next
	// four groups.
	ahead := pitch
	if rows == 1 {
		ahead = 4 * int(d)
	}
	c := [4]uint32{0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}
	crcGatherNT4(unsafe.Pointer(dst), src, int(d), n, rows, rowBytes, pitch-rowBytes, ahead, &c)
	for k := range reqs {
		reqs[k].CRC, reqs[k].Summed = ^c[k], true
	}
	return true
}

// gatherOne gathers one group from src to dst (n bytes) and returns its
// CRC32C: a group's quarters in step where the one-pass copy fits, else a
// copy, then the checksum of the copy.
func (s *Store) gatherOne(dst, src []byte, rows, rowBytes, pitch int) uint32 {
	n := len(dst)
	// Each quarter's rows, prefetching its next row; a contiguous group's
	// quarters are one row each, prefetching the next group.
	r, rb, p, ahead := rows, rowBytes, pitch, pitch
	if rows == 1 {
		r, rb, p, ahead = 4, n/4, n/4, n
	}
	if s.onePass() && r%4 == 0 && rb%64 == 0 && r*rb == n {
		c := [4]uint32{0xFFFFFFFF}
		crcGatherNT4(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src)),
			r/4*p, n/4, r/4, rb, p-rb, ahead, &c)
		return s.shift4.combine4(&c)
	}
	for row := range rows {
		copy(dst[row*rowBytes:(row+1)*rowBytes], src[row*pitch:row*pitch+rowBytes])
	}
	return CRC32C(dst)
}
