#include "textflag.h"

// NT4_ENTER and NT4_EXIT open and close crcCopyNT4 and crcGatherNT4,
// whose arguments are alike: DI dst, SI src, R8 seg, R9 dseg, R10 3*seg,
// R11 3*dseg, R13 rows, R14 src+ahead (the prefetch pointer), and the
// four checksums in AX, BX, CX, DX, stored back to crcs after an SFENCE.
#define NT4_ENTER \
	MOVQ dst+0(FP), DI; \
	MOVQ src+8(FP), SI; \
	MOVQ seg+16(FP), R8; \
	MOVQ dseg+24(FP), R9; \
	MOVQ rows+32(FP), R13; \
	MOVQ ahead+56(FP), R14; \
	ADDQ SI, R14; \
	LEAQ (R8)(R8*2), R10; \
	LEAQ (R9)(R9*2), R11; \
	MOVQ crcs+64(FP), R12; \
	MOVL 0(R12), AX; \
	MOVL 4(R12), BX; \
	MOVL 8(R12), CX; \
	MOVL 12(R12), DX

#define NT4_EXIT \
	SFENCE; \
	MOVQ crcs+64(FP), R12; \
	MOVL AX, 0(R12); \
	MOVL BX, 4(R12); \
	MOVL CX, 8(R12); \
	MOVL DX, 12(R12); \
	RET

// func copyRowsNT(dst, src unsafe.Pointer, rows, rowBytes, pitch int)
// Copies rows of rowBytes (a multiple of 64) from src (packed) to dst (row r
// at dst+r*pitch; dst and pitch multiples of 16) with non-temporal stores,
// then SFENCE.
TEXT ·copyRowsNT(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ rows+16(FP), BX
	MOVQ rowBytes+24(FP), DX
	MOVQ pitch+32(FP), R8
	TESTQ BX, BX
	JZ done
row:
	MOVQ DI, R9
	MOVQ DX, CX
	SHRQ $6, CX
	JZ next
line:
	MOVOU 0(SI), X0
	MOVOU 16(SI), X1
	MOVOU 32(SI), X2
	MOVOU 48(SI), X3
	MOVNTO X0, 0(R9)
	MOVNTO X1, 16(R9)
	MOVNTO X2, 32(R9)
	MOVNTO X3, 48(R9)
	ADDQ $64, SI
	ADDQ $64, R9
	DECQ CX
	JNZ line
next:
	ADDQ R8, DI
	DECQ BX
	JNZ row
done:
	SFENCE
	RET

// CRC4 folds the 8 bytes at offset o of each of crcCopyNT4's four source
// segments (SI + k*R8; R10 = 3*R8) into its checksum (AX, BX, CX, DX).
#define CRC4(o) CRC32Q o(SI), AX; CRC32Q o(SI)(R8*1), BX; CRC32Q o(SI)(R8*2), CX; CRC32Q o(SI)(R10*1), DX

// func crcCopyNT4(dst, src unsafe.Pointer, seg, dseg, rows, rowBytes, skip, ahead int, crcs *[4]uint32)
// Copies four segments of rows*rowBytes bytes (src+k*seg) to dst+k*dseg,
// each as rows rows of rowBytes (a multiple of 64) whose starts are
// rowBytes+skip apart, with non-temporal stores, while taking the raw
// CRC32C (no inversions) of each segment: four chains in step, chain k
// from crcs[k] on, the results back in crcs. Prefetches 256 bytes per
// 64-byte step from src+ahead on. Ends with SFENCE. Each segment's line is
// loaded, and stored, whole before the next segment's: non-temporal stores
// that fill a line one after another leave the write-combining buffer
// whole (stored interleaved across the four segments, offset by offset,
// the copy lost about a fifth: see docs/performance.md, 'Store batched
// reads'). Uses R14, R15 and
// X15, scratch registers in ABI0 (the wrapper that calls it restores
// them).
TEXT ·crcCopyNT4(SB), NOSPLIT, $0-72
	NT4_ENTER
	MOVQ skip+48(FP), R15
	TESTQ R13, R13
	JZ out

row:
	MOVQ rowBytes+40(FP), R12
	SHRQ $6, R12
	JZ next

line:
	MOVOU 0(SI), X0
	MOVOU 16(SI), X1
	MOVOU 32(SI), X2
	MOVOU 48(SI), X3
	MOVOU 0(SI)(R8*1), X4
	MOVOU 16(SI)(R8*1), X5
	MOVOU 32(SI)(R8*1), X6
	MOVOU 48(SI)(R8*1), X7
	MOVOU 0(SI)(R8*2), X8
	MOVOU 16(SI)(R8*2), X9
	MOVOU 32(SI)(R8*2), X10
	MOVOU 48(SI)(R8*2), X11
	MOVOU 0(SI)(R10*1), X12
	MOVOU 16(SI)(R10*1), X13
	MOVOU 32(SI)(R10*1), X14
	MOVOU 48(SI)(R10*1), X15
	PREFETCHT0 0(R14)
	PREFETCHT0 64(R14)
	PREFETCHT0 128(R14)
	PREFETCHT0 192(R14)
	CRC4(0)
	CRC4(8)
	CRC4(16)
	CRC4(24)
	CRC4(32)
	CRC4(40)
	CRC4(48)
	CRC4(56)
	MOVNTO X0, 0(DI)
	MOVNTO X1, 16(DI)
	MOVNTO X2, 32(DI)
	MOVNTO X3, 48(DI)
	MOVNTO X4, 0(DI)(R9*1)
	MOVNTO X5, 16(DI)(R9*1)
	MOVNTO X6, 32(DI)(R9*1)
	MOVNTO X7, 48(DI)(R9*1)
	MOVNTO X8, 0(DI)(R9*2)
	MOVNTO X9, 16(DI)(R9*2)
	MOVNTO X10, 32(DI)(R9*2)
	MOVNTO X11, 48(DI)(R9*2)
	MOVNTO X12, 0(DI)(R11*1)
	MOVNTO X13, 16(DI)(R11*1)
	MOVNTO X14, 32(DI)(R11*1)
	MOVNTO X15, 48(DI)(R11*1)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $256, R14
	DECQ R12
	JNZ line

next:
	ADDQ R15, DI
	DECQ R13
	JNZ row

out:
	NT4_EXIT

// GA..GD move the 8 bytes at offset o of crcGatherNT4's segments 0..3
// (read at SI + k*R8, R10 = 3*R8; stored at DI + k*R9, R11 = 3*R9)
// through R15 into checksums AX..DX: the checksum is of the bytes stored,
// whatever changes at the source meanwhile.
#define GA(o) MOVQ o(SI), R15; CRC32Q R15, AX; MOVNTIQ R15, o(DI)
#define GB(o) MOVQ o(SI)(R8*1), R15; CRC32Q R15, BX; MOVNTIQ R15, o(DI)(R9*1)
#define GC(o) MOVQ o(SI)(R8*2), R15; CRC32Q R15, CX; MOVNTIQ R15, o(DI)(R9*2)
#define GD(o) MOVQ o(SI)(R10*1), R15; CRC32Q R15, DX; MOVNTIQ R15, o(DI)(R11*1)

// func crcGatherNT4(dst, src unsafe.Pointer, seg, dseg, rows, rowBytes, skip, ahead int, crcs *[4]uint32)
// crcCopyNT4 the other way round: copies four segments, segment k read
// from src+k*seg as rows rows of rowBytes (a multiple of 64) whose starts
// are rowBytes+skip apart, packed to dst+k*dseg (a multiple of 8), with
// non-temporal stores, while taking the raw CRC32C of each segment, chain
// k from crcs[k] on, the results back in crcs. Each 8 bytes is read once
// into a register, checksummed and stored from it, so the checksums are
// of the bytes stored even when the source (a client's memory) changes
// under the copy. Prefetches, per 64-byte step, the line ahead bytes past
// each segment's current one (ahead = the rows' pitch: the next row's).
// Each segment's line is stored whole before the next one's, as in
// crcCopyNT4. Ends with SFENCE. Uses R14 and R15, scratch registers in
// ABI0.
TEXT ·crcGatherNT4(SB), NOSPLIT, $0-72
	NT4_ENTER
	TESTQ R13, R13
	JZ gout

grow:
	MOVQ rowBytes+40(FP), R12
	SHRQ $6, R12
	JZ gnext

gline:
	PREFETCHT0 0(R14)
	PREFETCHT0 0(R14)(R8*1)
	PREFETCHT0 0(R14)(R8*2)
	PREFETCHT0 0(R14)(R10*1)
	GA(0); GA(8); GA(16); GA(24); GA(32); GA(40); GA(48); GA(56)
	GB(0); GB(8); GB(16); GB(24); GB(32); GB(40); GB(48); GB(56)
	GC(0); GC(8); GC(16); GC(24); GC(32); GC(40); GC(48); GC(56)
	GD(0); GD(8); GD(16); GD(24); GD(32); GD(40); GD(48); GD(56)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, R14
	DECQ R12
	JNZ gline

gnext:
	ADDQ skip+48(FP), SI
	ADDQ skip+48(FP), R14
	DECQ R13
	JNZ grow

gout:
	NT4_EXIT
