package nvmeint

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kvfs/kvfs/nvme"
	"github.com/kvfs/kvfs/store"
)

// TestStoreFabric runs in the rig's fabric boot (KVFS_FABRIC=on), where
// KVFS_NVME_DEV is a namespace the kernel's NVMe/TCP host reaches through
// the nvmet target on loopback, backed by the emulated controller's
// namespace (KVFS_NVME_BACKING). It checks that sysfs shows the namespace
// behind a TCP fabric, and what became of FDP: the backing namespace has
// it, the target does not pass it through, and the engine then places
// nothing (every write untagged). Elsewhere it checks that the local
// namespace is not reported as a fabric one.
func TestStoreFabric(t *testing.T) {
	path := testDevicePath(t)
	a, err := nvme.Attach(path)
	if err != nil {
		t.Fatalf("Attach(%s): %v", path, err)
	}
	t.Logf("%s: %s", path, a)
	if os.Getenv("KVFS_FABRIC") != "on" {
		if a.Fabric() || a.Transport() != "pcie" {
			t.Fatalf("local emulated namespace reported as %s", a)
		}
		return
	}
	if !a.Fabric() || a.Transport() != "tcp" || a.SubsysNQN != "kvfs-fabric" {
		t.Fatalf("fabric namespace: %s; want tcp to subsystem kvfs-fabric", a)
	}
	if ad := a.Paths[0].Address; !strings.Contains(ad, "traddr=127.0.0.1") || !strings.Contains(ad, "trsvcid=4420") {
		t.Errorf("address %q: want traddr=127.0.0.1,trsvcid=4420", ad)
	}
	blk := blockDevice(path)
	if b, err := nvme.Attach(blk); err != nil || b.String() != a.String() {
		t.Errorf("Attach(%s) = %v, %v; want the char device's %s", blk, b, err, a)
	}

	backing := os.Getenv("KVFS_NVME_BACKING")
	bd, err := nvme.OpenDevice(backing)
	if err != nil {
		t.Fatalf("backing %s: %v", backing, err)
	}
	bfdp, err := bd.FDP()
	_ = bd.Close()
	if err != nil {
		t.Fatalf("backing %s FDP: %v", backing, err)
	}
	e := openEngine(t, "auto")
	ffdp, err := e.FDPInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FDP of the backing namespace %s: %s", backing, bfdp)
	t.Logf("FDP of the fabric namespace %s: %s", path, ffdp)
	switch {
	case ffdp.Enabled:
		t.Logf("the target passes FDP through: %d handles", len(ffdp.Handles))
	case bfdp.Enabled:
		t.Logf("the target does not pass FDP through (backing has %d handles): the engine writes untagged", len(bfdp.Handles))
		if len(e.Placement().PIDs) != 0 {
			t.Errorf("no FDP on the fabric namespace but the engine places on %v", e.Placement().PIDs)
		}
	}
	if ea := e.Attachment(); ea == nil || !ea.Fabric() {
		t.Errorf("engine attachment %v: want the fabric one", ea)
	}

	// One namespace, two attachments (the fabric path and the backing
	// controller), standing for two hosts: the store's flock cannot see
	// across them, the ownership lease does. The refused open only reads.
	if _, err := store.Format(e, testGeometry, store.FormatOptions{Force: true, Size: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	owner, err := store.Open(e, store.Options{Lease: &store.LeaseOptions{Host: "host-fabric"}})
	if err != nil {
		t.Fatalf("open through the fabric with a lease: %v", err)
	}
	other := openEngineAt(t, backing)
	if _, err := store.Open(other, store.Options{Lease: &store.LeaseOptions{Host: "host-local"}}); !errors.Is(err, store.ErrLeaseHeld) {
		t.Errorf("second host's open while the fabric host holds the lease: %v, want ErrLeaseHeld", err)
	} else {
		t.Logf("second host refused: %v", err)
	}
	if err := owner.Close(); err != nil {
		t.Fatal(err)
	}
	rec, err := store.ReadLease(other)
	if err != nil || rec == nil || rec.Host != "host-fabric" || !rec.Expiry.IsZero() {
		t.Errorf("lease through the backing after the owner closed: %+v, %v; want host-fabric's, released", rec, err)
	}
}
