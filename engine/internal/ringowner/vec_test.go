package ringowner

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

// vecPipeDriver is pipeDriver with vector reads (IORING_OP_READV from the
// pipe), so that reads come back short whenever the writer is slower.
type vecPipeDriver struct{ pipeDriver }

func (d *vecPipeDriver) PrepReadv(sqe *uring.SQE, rq *store.IO, iov []unix.Iovec, _ int64) error {
	sqe.PrepRW(uring.OpReadv, int32(d.r[rq.Stream]), uintptr(unsafe.Pointer(&iov[0])), uint32(len(iov)), ^uint64(0))
	return nil
}

// TestVecShortReads: a vector read of more segments than one SQE takes
// (MaxVecSegments), fed by a writer in small uneven chunks so that most
// SQEs come back short, lands every byte in its segment in order (each
// continuation skips what already landed, also inside a segment) and
// touches nothing between segments.
func TestVecShortReads(t *testing.T) {
	needRing(t)
	r, w := pipes(t, 1)
	o, err := Start(Config{Name: "test", QueueDepth: 1, PoolBytes: -1, Logger: zap.NewNop()}, &vecPipeDriver{pipeDriver{r: r}})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	const nseg = 1500
	mem := bytes.Repeat([]byte{sentinel}, nseg*400)
	vec := make([][]byte, nseg)
	total := 0
	for i := range vec {
		n := 50 + i%150 // uneven sizes, a gap after each
		vec[i] = mem[i*400 : i*400+n]
		total += n
	}
	data := make([]byte, total)
	for i := range data {
		data[i] = byte(i*13 + i/251)
	}
	go func() {
		for off := 0; off < len(data); {
			n := min(777, len(data)-off)
			if _, err := unix.Write(w[0], data[off:off+n]); err != nil {
				return
			}
			off += n
			if off%(777*40) == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	ios := []store.IO{{Op: store.OpRead, Vec: vec}}
	if err := o.Do(ios); err != nil || ios[0].Err != nil {
		t.Fatal(err, ios[0].Err)
	}
	at := 0
	for i, v := range vec {
		if !bytes.Equal(v, data[at:at+len(v)]) {
			t.Fatalf("segment %d differs", i)
		}
		at += len(v)
		gap := mem[i*400+len(v) : (i+1)*400]
		if !bytes.Equal(gap, bytes.Repeat([]byte{sentinel}, len(gap))) {
			t.Fatalf("memory after segment %d written", i)
		}
	}
	st := o.Stats()
	if st.SQEs < 2 {
		t.Fatalf("%d SQEs for %d segments: not split", st.SQEs, nseg)
	}
	t.Logf("%d segments, %d bytes: %d SQEs, %d resubmits", nseg, total, st.SQEs, st.Resubmits)

	// End of file (the writer closed): an error, not a short success.
	unix.Close(w[0])
	ios = []store.IO{{Op: store.OpRead, Vec: vec[:3]}}
	if err := o.Do(ios); err != nil || !errors.Is(ios[0].Err, io.ErrUnexpectedEOF) {
		t.Fatalf("read at end of file: %v %v", err, ios[0].Err)
	}
	// An empty segment, and a driver without vector reads: EINVAL.
	ios = []store.IO{{Op: store.OpRead, Vec: [][]byte{mem[:8], {}}}}
	if err := o.Do(ios); err != nil || !errors.Is(ios[0].Err, unix.EINVAL) {
		t.Fatalf("empty segment: %v %v", err, ios[0].Err)
	}
	o2, err := Start(Config{Name: "test", QueueDepth: 1, PoolBytes: -1, Logger: zap.NewNop()}, &pipeDriver{r: r})
	if err != nil {
		t.Fatal(err)
	}
	defer o2.Close()
	ios = []store.IO{{Op: store.OpRead, Vec: vec[:1]}}
	if err := o2.Do(ios); err != nil || !errors.Is(ios[0].Err, unix.EINVAL) {
		t.Fatalf("vector read on a driver without them: %v %v", err, ios[0].Err)
	}
}
