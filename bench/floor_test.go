package bench

import (
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/store"
)

// BenchmarkReadFloor is the least CPU any reader of a tmpfs (or cached)
// file spends per byte, without and with verifying it: 8 goroutines read
// random 2 MiB pieces of KVFS_FLOOR_FILE (a store file, say, formatted
// --zero and filled), each into its own 16 rotating 2 MiB buffers as fio
// (QD 16) reads into its own, then (verified) checksum every 4 KiB of
// each piece with CRC32C as the store checks groups. read is fio's work;
// read+crc is a floor for a verified read, the CRC read from the buffer
// the piece landed in; chunk256K+crc reads the piece in 256 KiB parts into
// one cache-sized buffer and checks each part there (the checksum reads
// from cache) before copying it out, the store's way, with a plain copy
// (chunk64K+crc: in 64 KiB parts).
// The ratio of ns/op between them bounds what any verified load can reach
// against fio on the machine. Skipped without KVFS_FLOOR_FILE:
//
//	KVFS_FLOOR_FILE=/dev/shm/f.kvfs go test -run x -bench ReadFloor ./bench/
func BenchmarkReadFloor(b *testing.B) {
	path := os.Getenv("KVFS_FLOOR_FILE")
	if path == "" {
		b.Skip("KVFS_FLOOR_FILE not set")
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	const piece, group, part, bufs = 2 << 20, 4 << 10, 256 << 10, 16
	pieces := int(st.Size() / piece)
	if pieces < 1 {
		b.Fatalf("%s: smaller than one %d-byte piece", path, piece)
	}
	fd := int(f.Fd())
	check := func(p []byte) (sum uint32) {
		for o := 0; o < len(p); o += group {
			sum ^= store.CRC32C(p[o : o+group])
		}
		return sum
	}
	for _, mode := range []string{"read", "read+crc", "chunk64K+crc", "chunk256K+crc"} {
		part := part
		if mode == "chunk64K+crc" {
			part = 64 << 10
		}
		b.Run(mode, func(b *testing.B) {
			b.SetBytes(piece)
			b.SetParallelism(max(1, 8/runtimeProcs()))
			b.RunParallel(func(pb *testing.PB) {
				ring := make([][]byte, bufs)
				for i := range ring {
					ring[i] = make([]byte, piece)
				}
				hot := make([]byte, part)
				r := rand.New(rand.NewPCG(rand.Uint64(), 1))
				var sum uint32
				for i := 0; pb.Next(); i++ {
					dst, off := ring[i%bufs], int64(r.IntN(pieces))*piece
					switch mode {
					case "chunk64K+crc", "chunk256K+crc":
						for o := 0; o < piece; o += part {
							if _, err := unix.Pread(fd, hot, off+int64(o)); err != nil {
								b.Error(err)
								return
							}
							sum ^= check(hot)
							copy(dst[o:], hot)
						}
					default:
						if _, err := unix.Pread(fd, dst, off); err != nil {
							b.Error(err)
							return
						}
						if mode == "read+crc" {
							sum ^= check(dst)
						}
					}
				}
				_ = sum
			})
		})
	}
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
