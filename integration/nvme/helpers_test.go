package nvmeint

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	nvmeengine "github.com/kvfs/kvfs/engine/nvme"
	"github.com/kvfs/kvfs/layout"
)

// testDevicePath returns the NVMe namespace to test on, or skips.
func testDevicePath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("KVFS_NVME_DEV")
	if p == "" {
		if _, err := os.Stat("/dev/ng0n1"); err != nil {
			t.Skip("no NVMe namespace: KVFS_NVME_DEV is unset and /dev/ng0n1 does not exist; `make test-nvme` runs this test under QEMU")
		}
		p = "/dev/ng0n1"
	}
	return p
}

// blockDevice is the block twin /dev/nvmeXnY of a char device /dev/ngXnY.
func blockDevice(ng string) string {
	return strings.Replace(ng, "/ng", "/nvme", 1)
}

func openEngine(t *testing.T, fdp string) *nvmeengine.Engine {
	t.Helper()
	return openEngineOpts(t, testDevicePath(t), fdp)
}

// openEngineAt opens the nvme engine on another namespace path.
func openEngineAt(t *testing.T, path string) *nvmeengine.Engine {
	t.Helper()
	return openEngineOpts(t, path, "auto")
}

func openEngineOpts(t *testing.T, path, fdp string) *nvmeengine.Engine {
	t.Helper()
	e, err := nvmeengine.OpenEngine(path, nvmeengine.EngineOptions{QueueDepth: 32, FDP: fdp, Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))})
	if err != nil {
		t.Fatalf("OpenEngine(%s): %v", path, err)
	}
	t.Cleanup(func() { _ = e.Close() })
	t.Logf("%s", e)
	return e
}

// testGeometry: 16 groups of 4 KiB per block (4 layers × 2 heads × K/V).
var testGeometry = layout.Geometry{Layers: 4, KVHeads: 2, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}

// groupData fills b with the content of group idx of block at version v;
// every (block, idx, v) gives different bytes.
func groupData(b []byte, block uint64, idx int, v uint32) {
	seed := crc32.ChecksumIEEE(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(nil, v), block^uint64(idx)<<40))
	x := uint64(seed)<<32 | uint64(idx)<<8 | uint64(v)
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
}
