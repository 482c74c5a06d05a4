package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvfs/kvfs/store"
)

// ErrFewBlocks is wrapped when a store or a mount holds too few blocks for
// the measurement asked for.
var ErrFewBlocks = errors.New("bench: too few blocks")

// BlocksConfig describes a measurement of the store's own batched reads:
// each call is one store.Read of every present group of Blocks distinct
// random blocks, with QD calls in flight.
type BlocksConfig struct {
	// Store is the open store; it must hold at least Blocks blocks.
	Store *store.Store
	// Blocks is the number of whole blocks per call (default 1).
	Blocks int
	// QD is the number of calls in flight, one goroutine each (default 1).
	QD int
	// Duration is how long calls are issued (default 5 s).
	Duration time.Duration
}

// BlocksResult is the outcome of RunBlocks. GBps is 10^9 bytes per second;
// latencies are per call.
type BlocksResult struct {
	Engine        string
	BlocksPerCall int
	GroupsPerCall int
	CallBytes     int // bytes of one call (whole blocks of the geometry)
	QD            int
	Calls         int64
	Bytes         int64
	Seconds       float64
	GBps          float64
	CallsPerSec   float64
	P50us         float64
	P99us         float64
	// CPUs is the process's CPU time (user + system) over the run,
	// CPUsPerGB that per 10^9 bytes read.
	CPUs      float64
	CPUsPerGB float64
}

// RunBlocks measures store.Read of whole random blocks. Each worker reads
// into one contiguous buffer, from the engine when it offers (registered,
// huge-page) memory, as a client's registered buffer would be: whole
// blocks land in it without a copy. A failed read ends the run with its
// error.
func RunBlocks(ctx context.Context, c BlocksConfig) (BlocksResult, error) {
	if c.Blocks == 0 {
		c.Blocks = 1
	}
	if c.QD == 0 {
		c.QD = 1
	}
	if c.Duration == 0 {
		c.Duration = 5 * time.Second
	}
	switch {
	case c.Store == nil:
		return BlocksResult{}, fmt.Errorf("%w: no store", ErrConfig)
	case c.Blocks < 0 || c.QD < 0 || c.Duration < 0:
		return BlocksResult{}, fmt.Errorf("%w: %d blocks per call, %d calls in flight for %v", ErrConfig, c.Blocks, c.QD, c.Duration)
	}
	s := c.Store
	blocks := s.Blocks()
	if len(blocks) == 0 {
		return BlocksResult{}, fmt.Errorf("%w: the store holds no blocks to read", ErrFewBlocks)
	}
	if c.Blocks > len(blocks) {
		return BlocksResult{}, fmt.Errorf("%w: %d blocks per call: the store holds only %d blocks", ErrConfig, c.Blocks, len(blocks))
	}
	g := s.Geometry()
	gb := g.GroupBytes()
	type worker struct {
		lat   []time.Duration
		bytes int64
		err   error
	}
	workers := make([]worker, c.QD)
	// Every worker's memory is allocated before the clock starts (a
	// growing engine pool maps and registers segments here, not in the
	// measurement).
	mems := make([][]byte, c.QD)
	for w := range mems {
		mem, free, err := allocIO(s.Engine(), c.Blocks*g.GroupsPerBlock()*gb)
		if err != nil {
			return BlocksResult{}, err
		}
		defer free()
		mems[w] = mem
	}
	deadline := time.Now().Add(c.Duration)
	cpu0 := CPUSeconds()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := &workers[w]
			rng := rand.New(rand.NewPCG(uint64(w)+1, 0x6b766673))
			reqs := make([]store.ReadReq, 0, c.Blocks*g.GroupsPerBlock())
			picks := make([]int, 0, c.Blocks)
			mem := mems[w]
			bufs := make([][]byte, cap(reqs))
			for i := range bufs {
				bufs[i] = mem[i*gb : (i+1)*gb]
			}
			for time.Now().Before(deadline) && ctx.Err() == nil {
				reqs = reqs[:0]
				for _, bi := range pickDistinct(rng, len(blocks), picks) {
					b := blocks[bi]
					for idx := range g.GroupsPerBlock() {
						if b.Has(idx) {
							reqs = append(reqs, store.ReadReq{Key: g.KeyAt(b.ID, idx), Buf: bufs[len(reqs)]})
						}
					}
				}
				t0 := time.Now()
				if err := s.Read(reqs); err != nil {
					me.err = err
					return
				}
				me.lat = append(me.lat, time.Since(t0))
				for _, r := range reqs {
					if r.Err != nil {
						me.err = fmt.Errorf("bench: read %v: %w", r.Key, r.Err)
						return
					}
					me.bytes += int64(gb)
				}
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	cpu := CPUSeconds() - cpu0
	var lat []time.Duration
	res := BlocksResult{Engine: s.Engine().Name(), BlocksPerCall: c.Blocks, GroupsPerCall: c.Blocks * g.GroupsPerBlock(), QD: c.QD}
	for _, w := range workers {
		if w.err != nil {
			return BlocksResult{}, w.err
		}
		lat = append(lat, w.lat...)
		res.Bytes += w.bytes
	}
	slices.Sort(lat)
	res.CallBytes = res.GroupsPerCall * gb
	res.Calls, res.Seconds = int64(len(lat)), secs
	res.GBps = float64(res.Bytes) / secs / 1e9
	res.CallsPerSec = float64(res.Calls) / secs
	res.P50us, res.P99us = Micros(Percentile(lat, 50)), Micros(Percentile(lat, 99))
	res.CPUs, res.CPUsPerGB = cpu, PerGB(cpu, res.Bytes)
	return res, nil
}

// pickDistinct fills picks with cap(picks) distinct random indices
// below n (cap(picks) ≤ n), without allocating.
func pickDistinct(rng *rand.Rand, n int, picks []int) []int {
	picks = picks[:0]
	for len(picks) < cap(picks) {
		i := rng.IntN(n)
		if !slices.Contains(picks, i) {
			picks = append(picks, i)
		}
	}
	return picks
}

// FillBlocks writes every group of new blocks (ids from 0 up, the same
// random bytes in each group) until s holds n blocks, or until it is full:
// it never evicts. It writes into the store: the caller asked for it.
// progress, when not nil, gets the blocks present so far of n after each
// block written.
func FillBlocks(s *store.Store, n int, progress func(done, total int64)) error {
	g := s.Geometry()
	have := map[uint64]bool{}
	for _, b := range s.Blocks() {
		have[b.ID] = true
	}
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, g.GroupBytes())
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for id := uint64(0); len(have) < n; id++ {
		if have[id] {
			continue
		}
		if int64(len(have)) >= s.Info().Slots {
			break // full: more would evict
		}
		reqs := make([]store.WriteReq, g.GroupsPerBlock())
		for idx := range reqs {
			reqs[idx] = store.WriteReq{Key: g.KeyAt(id, idx), Data: data}
		}
		if err := s.Write(reqs); err != nil {
			return err
		}
		for _, r := range reqs {
			if r.Err != nil {
				return fmt.Errorf("bench: fill %v: %w", r.Key, r.Err)
			}
		}
		have[id] = true
		if progress != nil {
			progress(int64(len(have)), int64(n))
		}
	}
	return nil
}

// allocIO allocates n bytes of I/O memory: the engine's own buffers when it
// has them, else page-aligned memory. free gives them back.
func allocIO(e store.Engine, n int) (buf []byte, free func(), err error) {
	if a, ok := e.(store.BufferAllocator); ok {
		b, err := a.AllocBuffer(n)
		if err != nil {
			return nil, nil, fmt.Errorf("bench: buffer: %w", err)
		}
		return b, func() { a.FreeBuffer(b) }, nil
	}
	b, err := store.AllocAligned(n)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: buffer: %w", err)
	}
	return b, func() { store.FreeAligned(b) }, nil
}
