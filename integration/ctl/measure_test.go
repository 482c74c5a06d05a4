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
	for i := range blocks {
		blocks[i] = 0x1000000 + uint64(i)
		reqs := make([]store.WriteReq, per)
		for g := range per {
			reqs[g] = store.WriteReq{Key: geo.KeyAt(blocks[i], g), Data: data[g*gb : (g+1)*gb]}
		}
		if err := st.Write(reqs); err != nil {
			t.Fatal(err)
		}
	}
	e := mountEnv(t, envOptions{st: st})
	c := openClient(t, e)
	buf, err := c.NewHostBuffer("", int64(jobs*gpc*gb))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	direct, err := store.AllocAligned(jobs * gpc * gb)
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
	run := func(viaIoctl bool) result {
		done := make(chan []time.Duration, jobs)
		start := time.Now()
		for j := range jobs {
			go func() {
				rng := rand.New(rand.NewPCG(uint64(j), uint64(time.Now().UnixNano())))
				keys := make([]layout.Key, gpc)
				es := make([]client.Entry, gpc)
				stt := make([]client.Status, gpc)
				reqs := make([]store.ReadReq, gpc)
				var lat []time.Duration
				for time.Since(start) < secs {
					pick(rng, keys)
					t0 := time.Now()
					if viaIoctl {
						for i, k := range keys {
							es[i] = client.Entry{Key: k, Buffer: buf.ID, Offset: uint64((j*gpc + i) * gb)}
						}
						if n, err := c.Batch(true, es, stt, nil); err != nil || n != gpc {
							t.Errorf("load: %v (%d ok)", err, n)
							break
						}
					} else {
						for i, k := range keys {
							reqs[i] = store.ReadReq{Key: k, Buf: direct[(j*gpc+i)*gb : (j*gpc+i+1)*gb]}
						}
						if err := st.Read(reqs); err != nil {
							t.Error(err)
							break
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
	run(true) // warm up
	run(false)
	stats := func(r result) (gbps, mean, p50, p99 float64) {
		var sum time.Duration
		for _, d := range r.lat {
			sum += d
		}
		slices.Sort(r.lat)
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		return float64(r.calls*gpc*gb) / r.wall.Seconds() / 1e9, us(sum) / float64(r.calls),
			us(r.lat[len(r.lat)/2]), us(r.lat[min(len(r.lat)-1, len(r.lat)*99/100)])
	}
	t.Logf("store %s (%s engine, %d MiB, %d blocks of %d × %d B), %d groups/call, %d jobs; empty ioctl round trip %.1f µs",
		path, st.Engine().Name(), size>>20, nblocks, per, gb, gpc, jobs, float64(empty.Nanoseconds())/1e3)
	var sumD, sumI float64
	for r := range rounds {
		d := run(false)
		i := run(true)
		dg, dm, dp50, dp99 := stats(d)
		ig, im, ip50, ip99 := stats(i)
		sumD += dg
		sumI += ig
		t.Logf("round %d: direct store.Read %.2f GB/s %.1f µs/call (p50 %.1f p99 %.1f) | ioctl LOAD %.2f GB/s %.1f µs/call (p50 %.1f p99 %.1f) %.3f µs/group | ratio %.3f | control path +%.2f µs/group",
			r, dg, dm, dp50, dp99, ig, im, ip50, ip99, im/float64(gpc), ig/dg, (ip50-dp50)/float64(gpc))
	}
	t.Logf("mean over %d rounds: direct %.2f GB/s, ioctl %.2f GB/s, ratio %.3f", rounds, sumD/float64(rounds), sumI/float64(rounds), sumI/sumD)
}
