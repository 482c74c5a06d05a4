package engine

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// viewData is group k's payload at version v: its key and version in
// every 16 bytes, so a read can tell which write it saw.
func viewData(k layout.Key, v uint64) []byte {
	b := make([]byte, testGeo.GroupBytes())
	for o := 0; o < len(b); o += 16 {
		binary.LittleEndian.PutUint64(b[o:], k.Block<<16|uint64(testGeo.Index(k)))
		binary.LittleEndian.PutUint64(b[o+8:], v)
	}
	return b
}

// TestViewReadsWhileWriting: on a tmpfs store file read through the uring
// engine's mapping (view reads, the default), readers of whole blocks
// that writers keep rewriting see, for every group, one whole version a
// writer wrote — never a mix of two, never a group reported corrupt — and
// misses only for blocks not yet written.
func TestViewReadsWhileWriting(t *testing.T) {
	path := filepath.Join(shmDir(t, "kvfs-view-test-"), "store")
	const blocks = 6
	eo := Options{Kind: KindUring}
	if _, err := FormatPath(path, FormatPathOptions{Geometry: testGeo, Size: store.SizeFor(testGeo, 3*blocks), Engine: eo}); err != nil {
		t.Fatal(err)
	}
	s, closeAll, err := OpenStore(path, eo, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	if s.HostView() == nil {
		t.Skip("skipping: the store file offers no host view here")
	}
	gpb := testGeo.GroupsPerBlock()
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := uint64(1); !stop.Load(); v++ {
				b := uint64(w*blocks/2) + v%(blocks/2)
				reqs := make([]store.WriteReq, gpb)
				for i := range reqs {
					k := testGeo.KeyAt(b, i)
					reqs[i] = store.WriteReq{Key: k, Data: viewData(k, v)}
				}
				if err := s.Write(reqs); err != nil {
					errs <- err
					return
				}
				for i := range reqs {
					if reqs[i].Err != nil {
						errs <- reqs[i].Err
						return
					}
				}
			}
		}()
	}
	reads := atomic.Int64{}
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, gpb*testGeo.GroupBytes())
			for n := 0; !stop.Load(); n++ {
				b := uint64(n % blocks)
				reqs := make([]store.ReadReq, gpb)
				for i := range reqs {
					reqs[i] = store.ReadReq{Key: testGeo.KeyAt(b, i), Buf: buf[i*testGeo.GroupBytes() : (i+1)*testGeo.GroupBytes()]}
				}
				if err := s.Read(reqs); err != nil {
					errs <- err
					return
				}
				for i, q := range reqs {
					if errors.Is(q.Err, store.ErrNotFound) {
						continue
					}
					if q.Err != nil {
						errs <- q.Err
						return
					}
					// One version throughout the group, and the group's own key.
					v := binary.LittleEndian.Uint64(q.Buf[8:])
					if k := testGeo.KeyAt(b, i); string(q.Buf) != string(viewData(k, v)) {
						errs <- errors.New("a group read while its block was rewritten mixes versions or keys")
						return
					}
				}
				reads.Add(1)
			}
		}()
	}
	time.Sleep(700 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if reads.Load() == 0 {
		t.Fatal("no read finished")
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}
