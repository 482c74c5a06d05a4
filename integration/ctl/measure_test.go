package ctl

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvfs/kvfs/bench"
	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// TestMeasureLoad compares end-to-end LOAD through the mount (ioctl → daemon
// → store.Read straight into the registered /dev/shm buffer) with a direct
// store.Read loop into page-aligned memory, on the same store, the same
// access pattern (whole random blocks, groups in slot order, packed
// destinations) and interleaved rounds so the disk's noise hits both.
//
//	KVFS_MEASURE=1 go test -run Measure -v ./integration/ctl
//
// Knobs (environment): KVFS_MEASURE_DIR (store directory: a disk dir for
// the device, /dev/shm for the page cache; default both), KVFS_MEASURE_ENGINE
// (default uring; posix on tmpfs), KVFS_MEASURE_GPC (groups per call, default
// 256), KVFS_MEASURE_SECONDS (per round and side, default 2),
// KVFS_MEASURE_ROUNDS (default 3), KVFS_MEASURE_MIB (store size, default
// 1024), KVFS_MEASURE_JOBS (concurrent calls, default 1).
func TestMeasureLoad(t *testing.T) {
	if os.Getenv("KVFS_MEASURE") == "" {
		t.Skip("set KVFS_MEASURE=1 to measure")
	}
	requireMount(t)
	dirs := []string{os.Getenv("KVFS_MEASURE_DIR")}
	if dirs[0] == "" {
		dirs = []string{os.TempDir(), "/dev/shm"}
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) { measure(t, dir) })
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func measure(t *testing.T, dir string) {
	// 8 layers × 4 heads × 2 = 64 groups of 4 KiB: 256 KiB per block.
	geo := layout.Geometry{Layers: 8, KVHeads: 4, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}
	gpc := envInt("KVFS_MEASURE_GPC", 256)
	secs := time.Duration(envInt("KVFS_MEASURE_SECONDS", 2)) * time.Second
	rounds := envInt("KVFS_MEASURE_ROUNDS", 3)
	jobs := envInt("KVFS_MEASURE_JOBS", 1)
	kind := os.Getenv("KVFS_MEASURE_ENGINE")
	if kind == "" {
		kind = "uring"
	}
	path := filepath.Join(dir, fmt.Sprintf("kvfs-measure-%d.store", os.Getpid()))
	t.Cleanup(func() { os.Remove(path) })
	size := int64(envInt("KVFS_MEASURE_MIB", 1024)) << 20
	if err := store.PrepareFile(path, size); err != nil {
		t.Fatal(err)
	}
	eng, err := engine.Open(path, engine.Options{Kind: kind})
	if err != nil {
		t.Fatalf("engine %s: %v", kind, err)
	}
	if _, err := store.Format(eng, geo, store.FormatOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	eng.Close()
	st, closeAll, err := engine.OpenStore(path, engine.Options{Kind: kind}, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll() })
	// Fill 90% of the slots with random whole blocks.
	per := geo.GroupsPerBlock()
	gb := geo.GroupBytes()
	nblocks := int(st.Info().Slots * 9 / 10)
	data := make([]byte, per*gb)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	blocks := make([]uint64, nblocks)
	var reqs []store.WriteReq
	for i := range blocks {
		blocks[i] = 0x1000000 + uint64(i)
		for g := range per {
			reqs = append(reqs, store.WriteReq{Key: geo.KeyAt(blocks[i], g), Data: data[g*gb : (g+1)*gb]})
		}
		if len(reqs) >= 32*per || i == len(blocks)-1 {
			if err := st.Write(reqs); err != nil {
				t.Fatal(err)
			}
			reqs = reqs[:0]
		}
	}
	e := mountEnv(t, envOptions{st: st})
	c := openClient(t, e)
	// Each job rotates through rot destination windows of one call, 64 MiB
	// in all, so no mode gets the destination hot in a core's cache (an
	// engine loads into ever different KV-cache pages too).
	rot := max(1, (64<<20)/(gpc*gb))
	buf, err := c.NewHostBuffer("", int64(jobs*rot*gpc*gb))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	direct, err := store.AllocAligned(jobs * rot * gpc * gb)
	if err != nil {
		t.Fatal(err)
	}
	defer store.FreeAligned(direct)

	pick := func(rng *rand.Rand, keys []layout.Key) {
		for n := 0; n < len(keys); {
			b := blocks[rng.IntN(len(blocks))]
			for g := 0; g < per && n < len(keys); g++ {
				keys[n] = geo.KeyAt(b, g)
				n++
			}
		}
	}
	type result struct {
		calls int
		lat   []time.Duration
		wall  time.Duration
	}
	// The four ways of doing the same loads, from the store's own cost to
	// the whole path: store.Read into anonymous memory, store.Read into the
	// client's /dev/shm mapping, the ctl session called in-process (no
	// FUSE), and the LOAD ioctl through the mount.
	const (
		modeDirect = iota
		modeShm
		modeSession
		modeIoctl
	)
	ss, errno := e.srv.Open(0, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	defer ss.Release()
	var rh abi.RegisterHost
	rh.ABI = abi.Version
	rh.SetPath(buf.Path)
	rarg := make([]byte, abi.RegisterHostSize)
	rh.Marshal(rarg)
	if _, errno := ss.Ioctl(abi.CmdRegisterHost, rarg, rarg); errno != 0 {
		t.Fatal(errno)
	}
	rh.Unmarshal(rarg)
	run := func(mode int) result {
		done := make(chan []time.Duration, jobs)
		start := time.Now()
		for j := range jobs {
			go func() {
				rng := rand.New(rand.NewPCG(uint64(j), uint64(time.Now().UnixNano())))
				keys := make([]layout.Key, gpc)
				es := make([]client.Entry, gpc)
				stt := make([]client.Status, gpc)
				reqs := make([]store.ReadReq, gpc)
				in := make([]byte, abi.BatchSize)
				out := make([]byte, abi.BatchSize)
				var lat []time.Duration
				for call := 0; time.Since(start) < secs; call++ {
					pick(rng, keys)
					base := ((j*rot + call%rot) * gpc) * gb
					t0 := time.Now()
					switch mode {
					case modeIoctl:
						for i, k := range keys {
							es[i] = client.Entry{Key: k, Buffer: buf.ID, Offset: uint64(base + i*gb)}
						}
						if n, err := c.Batch(true, es, stt, nil); err != nil || n != gpc {
							t.Errorf("load: %v (%d ok)", err, n)
							return
						}
					case modeSession:
						(&abi.BatchHeader{ABI: abi.Version, Count: uint32(gpc)}).Marshal(in)
						for i, k := range keys {
							(&abi.Entry{Block: k.Block, Layer: uint16(k.Layer), Head: uint16(k.Head), Kind: uint8(k.Kind),
								Buffer: rh.Buffer, Offset: uint64(base + i*gb)}).Marshal(in[abi.BatchHeaderSize+i*abi.EntrySize:])
						}
						if n, errno := ss.Ioctl(abi.CmdLoad, in, out); errno != 0 || int(n) != gpc {
							t.Errorf("session load: %v (%d ok)", errno, n)
							return
						}
					default:
						mem := direct
						if mode == modeShm {
							mem = buf.Mem
						}
						for i, k := range keys {
							reqs[i] = store.ReadReq{Key: k, Buf: mem[base+i*gb : base+(i+1)*gb]}
						}
						if err := st.Read(reqs); err != nil {
							t.Error(err)
							return
						}
					}
					lat = append(lat, time.Since(t0))
				}
				done <- lat
			}()
		}
		var r result
		for range jobs {
			l := <-done
			r.lat = append(r.lat, l...)
		}
		r.wall = time.Since(start)
		r.calls = len(r.lat)
		return r
	}
	// The round trip of an empty LOAD_SMALL: the FUSE ioctl path alone.
	empty := func() time.Duration {
		arg := make([]byte, abi.BatchSmallSz)
		(&abi.BatchHeader{ABI: abi.Version}).Marshal(arg)
		const n = 2000
		t0 := time.Now()
		for range n {
			if _, err := c.Ioctl(abi.CmdLoadSmall, arg); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(t0) / n
	}()
	for mode := range 4 { // warm up
		run(mode)
	}
	stats := func(r result) (gbps, mean, p50, p99 float64) {
		var sum time.Duration
		for _, d := range r.lat {
			sum += d
		}
		slices.Sort(r.lat)
		return float64(r.calls*gpc*gb) / r.wall.Seconds() / 1e9, bench.Micros(sum) / float64(r.calls),
			bench.Micros(bench.Percentile(r.lat, 50)), bench.Micros(bench.Percentile(r.lat, 99))
	}
	t.Logf("store %s (%s engine, %d MiB, %d blocks of %d × %d B), %d groups/call, %d jobs; empty ioctl round trip %.1f µs",
		path, st.Engine().Name(), size>>20, nblocks, per, gb, gpc, jobs, float64(empty.Nanoseconds())/1e3)
	var sumD, sumI float64
	names := []string{"store.Read into anonymous memory", "store.Read into the shm mapping", "ctl session in-process (no FUSE)", "LOAD ioctl through the mount"}
	for r := range rounds {
		var g, p50 [4]float64
		for mode := range 4 {
			m0 := e.srv.Metrics()
			res := run(mode)
			m1 := e.srv.Metrics()
			gbps, mean, med, p99 := stats(res)
			g[mode], p50[mode] = gbps, med
			line := fmt.Sprintf("round %d: %-34s %6.2f GB/s  %7.1f µs/call (p50 %7.1f, p99 %7.1f)  %.3f µs/group",
				r, names[mode], gbps, mean, med, p99, mean/float64(gpc))
			if calls := float64(m1.Loads - m0.Loads); calls > 0 {
				line += fmt.Sprintf("  [daemon: %.1f µs/call serving, %.1f in store.Read]",
					float64(m1.BatchNanos-m0.BatchNanos)/1e3/calls, float64(m1.StoreNanos-m0.StoreNanos)/1e3/calls)
			}
			t.Log(line)
		}
		sumD += g[modeDirect]
		sumI += g[modeIoctl]
		t.Logf("round %d: ioctl/direct throughput %.3f; control path (ioctl p50 − direct p50) %.2f µs/group, of which FUSE (ioctl − session) %.2f, ctl (session − shm) %.2f, shm vs anon %.2f",
			r, g[modeIoctl]/g[modeDirect], (p50[modeIoctl]-p50[modeDirect])/float64(gpc), (p50[modeIoctl]-p50[modeSession])/float64(gpc),
			(p50[modeSession]-p50[modeShm])/float64(gpc), (p50[modeShm]-p50[modeDirect])/float64(gpc))
	}
	t.Logf("mean over %d rounds: direct %.2f GB/s, ioctl %.2f GB/s, ratio %.3f", rounds, sumD/float64(rounds), sumI/float64(rounds), sumI/sumD)
}
