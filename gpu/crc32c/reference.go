package crc32c

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
)

// The constants of crc32c.cu; reference.go and the kernel must agree on all
// of them (TestKernelConstants reads them from the source).
const (
	poly          = 0x82F63B78 // CRC32C, reflected
	lanes         = 32
	unit          = 16                 // bytes one lane loads at a time
	skip          = (lanes - 1) * unit // bytes between two units of one lane
	warpsPerBlock = 8

	tabZ      = 0
	tabS      = tabZ + 16*256
	tabP      = tabS + 4*256
	tabX      = tabP + 32
	tabWords  = tabX + 32
	tabShared = tabP
)

// GroupSize is the size in bytes of one Group in device memory.
const GroupSize = 24

// Group is one checksummed unit in memory: Rows rows of RowBytes bytes, row r
// at Addr + r*Pitch. A contiguous group is Rows = 1 (Pitch is then unused).
// Its layout is the kernel's struct kvfs_group.
type Group struct {
	Addr     uint64
	Pitch    uint64
	Rows     uint32
	RowBytes uint32
}

// ErrGroup reports a group whose geometry the kernel cannot take.
var ErrGroup = errors.New("crc32c: bad group")

// Len returns the group's length in bytes.
func (g Group) Len() uint64 { return uint64(g.Rows) * uint64(g.RowBytes) }

// Check returns an error wrapping ErrGroup when rows overlap (Pitch <
// RowBytes with more than one row), the address range wraps, or the group
// is 4 GiB or more.
func (g Group) Check() error {
	if g.Rows > 1 && g.Pitch < uint64(g.RowBytes) {
		return fmt.Errorf("%w: pitch %d < row bytes %d", ErrGroup, g.Pitch, g.RowBytes)
	}
	if g.Len() >= 1<<32 {
		return fmt.Errorf("%w: %d bytes (at most 4 GiB - 1)", ErrGroup, g.Len())
	}
	if g.Rows > 0 && g.RowBytes > 0 {
		hi, span := bits.Mul64(uint64(g.Rows-1), g.Pitch)
		if hi != 0 {
			return fmt.Errorf("%w: span overflows", ErrGroup)
		}
		if _, c := bits.Add64(span, g.Addr, 0); c != 0 {
			return fmt.Errorf("%w: address range wraps", ErrGroup)
		}
		if _, c := bits.Add64(span+g.Addr, uint64(g.RowBytes), 0); c != 0 {
			return fmt.Errorf("%w: address range wraps", ErrGroup)
		}
	}
	return nil
}

// End returns one past the group's last byte.
func (g Group) End() uint64 {
	if g.Rows == 0 || g.RowBytes == 0 {
		return g.Addr
	}
	return g.Addr + uint64(g.Rows-1)*g.Pitch + uint64(g.RowBytes)
}

// fast reports whether the kernel reads g in aligned 16-byte units.
func (g Group) fast() bool {
	return g.Addr&15 == 0 && g.RowBytes&15 == 0 && (g.Rows <= 1 || g.Pitch&15 == 0)
}

// AppendGroups appends the device encoding of gs (GroupSize bytes each,
// little endian) to b.
func AppendGroups(b []byte, gs []Group) []byte {
	for _, g := range gs {
		b = binary.LittleEndian.AppendUint64(b, g.Addr)
		b = binary.LittleEndian.AppendUint64(b, g.Pitch)
		b = binary.LittleEndian.AppendUint32(b, g.Rows)
		b = binary.LittleEndian.AppendUint32(b, g.RowBytes)
	}
	return b
}

// gfmul returns a·b mod P; bit 31 holds the coefficient of x^0.
func gfmul(a, b uint32) uint32 {
	var p uint32
	for i := 31; i >= 0; i-- {
		p ^= b & -((a >> i) & 1)
		b = (b >> 1) ^ (poly & -(b & 1))
	}
	return p
}

// xpow8n returns x^(8n) mod P from the x^(2^k) table.
func xpow8n(x2n []uint32, n uint64) uint32 {
	p := uint32(0x80000000)
	for k := 3; n != 0; k++ {
		if n&1 != 0 {
			p = gfmul(x2n[k&31], p)
		}
		n >>= 1
	}
	return p
}

// tables computes the table buffer exactly as kvfs_crc32c_init does.
func tables() []uint32 {
	var x2n [32]uint32
	p := uint32(0x40000000)
	x2n[0] = p
	for k := 1; k < 32; k++ {
		p = gfmul(p, p)
		x2n[k] = p
	}
	var t0 [256]uint32
	for i := range t0 {
		c := uint32(i)
		for range 8 {
			c = (c >> 1) ^ (poly & -(c & 1))
		}
		t0[i] = c
	}
	tab := make([]uint32, tabWords)
	for i := range tab {
		switch {
		case i < tabS:
			tbl, b := i>>8, i&255
			tab[i] = gfmul(t0[b], xpow8n(x2n[:], uint64(15-tbl+skip)))
		case i < tabP:
			tbl, b := (i-tabS)>>8, i&255
			tab[i] = gfmul(t0[b], xpow8n(x2n[:], uint64(tbl)))
		case i < tabX:
			tab[i] = xpow8n(x2n[:], unit*uint64(31-(i-tabP)))
		default:
			tab[i] = x2n[i-tabX]
		}
	}
	return tab
}

var tab = tables()

func slice4(c, w uint32) uint32 {
	s := tab[tabS:]
	c ^= w
	return s[3*256+(c&255)] ^ s[2*256+((c>>8)&255)] ^ s[256+((c>>16)&255)] ^ s[c>>24]
}

func zstep(c uint32, w [4]uint32) uint32 {
	z := tab[tabZ:]
	w[0] ^= c
	var r uint32
	for i, x := range w {
		for j := range 4 {
			r ^= z[(4*i+j)*256+int((x>>(8*j))&255)]
		}
	}
	return r
}

// Reference returns the CRC32C of group g of mem, where g.Addr is an offset
// into mem, computed lane by lane exactly as the kernel computes it (the
// same split into lanes, the same tables, the same combination). It equals
// hash/crc32's Castagnoli checksum of the group's bytes; tests prove that
// here, and the device tests prove the kernel equals it. It returns an error
// wrapping ErrGroup when g does not lie inside mem or fails Check.
func Reference(mem []byte, g Group) (uint32, error) {
	if err := g.Check(); err != nil {
		return 0, err
	}
	if g.End() > uint64(len(mem)) {
		return 0, fmt.Errorf("%w: group ends at %d, memory is %d bytes", ErrGroup, g.End(), len(mem))
	}
	n := g.Len()
	le := binary.LittleEndian
	var sum uint32
	for lane := range uint64(lanes) {
		var c uint32
		if g.fast() {
			units := int64(n / unit)
			rounds := (units + lanes - 1) / lanes
			u := units - lanes*rounds + int64(lane)
			for k := int64(0); k < rounds; k, u = k+1, u+lanes {
				if u < 0 {
					continue
				}
				o := uint64(u) * unit
				a := g.Addr + (o/uint64(g.RowBytes))*g.Pitch + o%uint64(g.RowBytes)
				b := mem[a : a+unit]
				w := [4]uint32{le.Uint32(b), le.Uint32(b[4:]), le.Uint32(b[8:]), le.Uint32(b[12:])}
				if u == 0 {
					c = 0xFFFFFFFF
				}
				if k < rounds-1 {
					c = zstep(c, w)
				} else {
					for _, x := range w {
						c = slice4(c, x)
					}
				}
			}
			if units-lanes+int64(lane) >= 0 {
				c = gfmul(c, tab[tabP+lane])
			}
			if units == 0 && lane == 0 {
				c = 0xFFFFFFFF
			}
		} else {
			chunk := (n + lanes - 1) / lanes
			begin, end := min(chunk*lane, n), min(chunk*lane+chunk, n)
			if lane == 0 {
				c = 0xFFFFFFFF
			}
			s0 := tab[tabS : tabS+256]
			for o := begin; o < end; o++ {
				x := mem[g.Addr+(o/uint64(g.RowBytes))*g.Pitch+o%uint64(g.RowBytes)]
				c = s0[(c^uint32(x))&255] ^ (c >> 8)
			}
			c = gfmul(c, xpow8n(tab[tabX:], n-end))
		}
		sum ^= c
	}
	return ^sum, nil
}
