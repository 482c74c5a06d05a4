#include "textflag.h"

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
