package uring

import (
	"fmt"
	"testing"
)

// BenchmarkNop is the cost of one submit-and-wait round trip.
func BenchmarkNop(b *testing.B) {
	r := newRing(b, Options{Entries: 8})
	cqes := make([]CQE, 8)
	for b.Loop() {
		s := r.GetSQE()
		s.PrepNop()
		if _, err := r.SubmitAndWait(1); err != nil {
			b.Fatal(err)
		}
		if r.ReapCQEs(cqes) != 1 {
			b.Fatal("no CQE")
		}
	}
}

// BenchmarkNopBatch32 submits 32 NOPs per io_uring_enter (per-NOP cost).
func BenchmarkNopBatch32(b *testing.B) {
	r := newRing(b, Options{Entries: 32})
	cqes := make([]CQE, 64)
	n := 0
	for b.Loop() {
		s := r.GetSQE()
		s.PrepNop()
		if n++; n == 32 {
			if _, err := r.SubmitAndWait(32); err != nil {
				b.Fatal(err)
			}
			for got := 0; got < 32; got += r.ReapCQEs(cqes) {
			}
			n = 0
		}
	}
}

// BenchmarkReadFixed is 4 KiB O_DIRECT random READ_FIXED at queue depths
// 1 … 256 from a 64 MiB file.
func BenchmarkReadFixed(b *testing.B) {
	needURing(b)
	const block = 4096
	const fileSize = 64 << 20
	fd := openDirect(b, diskDir(b), fileSize)
	for qd := 1; qd <= 256; qd *= 2 {
		b.Run(fmt.Sprintf("QD=%d", qd), func(b *testing.B) {
			r := newRing(b, Options{Entries: uint32(qd)})
			buf := alignedBuf(b, qd*block)
			if _, err := r.RegisterBuffers([][]byte{buf}); err != nil {
				b.Fatal(err)
			}
			free := make([]int, 0, qd)
			for i := 0; i < qd; i++ {
				free = append(free, i)
			}
			cqes := make([]CQE, r.CQEntries())
			x := uint64(88172645463325252)
			b.SetBytes(block)
			b.ResetTimer()
			started, done := 0, 0
			for done < b.N {
				for started < b.N && len(free) > 0 {
					slot := free[len(free)-1]
					free = free[:len(free)-1]
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
					off := (x % (fileSize / block)) * block
					s := r.GetSQE()
					s.PrepReadFixed(int32(fd), buf[slot*block:(slot+1)*block], off, 0)
					s.SetUserData(uint64(slot))
					started++
				}
				if _, err := r.SubmitAndWait(1); err != nil {
					b.Fatal(err)
				}
				for _, c := range cqes[:r.ReapCQEs(cqes)] {
					if c.Res != block {
						b.Fatalf("res %d", c.Res)
					}
					free = append(free, int(c.UserData))
					done++
				}
			}
		})
	}
}
