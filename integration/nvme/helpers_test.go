package nvmeint

import (
	"os"
	"testing"
)

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

func TestStorePlaceholder(t *testing.T) { testDevicePath(t) }
func TestCrashWrite(t *testing.T)       { testDevicePath(t) }
func TestCrashCheck(t *testing.T)       { testDevicePath(t) }
