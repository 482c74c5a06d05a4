package nvme

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// TestAvailableUnprivileged runs Available in a child process as nobody:
// the char device is root's (0600), so passthrough is unavailable for
// permission reasons and Available says so.
func TestAvailableUnprivileged(t *testing.T) {
	path := testDevicePath(t)
	if os.Getenv("KVFS_NVME_CHILD") == "1" {
		err := Available(path)
		fmt.Printf("CHILD-RESULT %v|perm=%v|unavail=%v\n", err, errors.Is(err, ErrPermission), errors.Is(err, ErrUnavailable))
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to an unprivileged user")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestAvailableUnprivileged$", "-test.v")
	cmd.Env = append(os.Environ(), "KVFS_NVME_CHILD=1", "KVFS_NVME_DEV="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	line := ""
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "CHILD-RESULT ") {
			line = l
		}
	}
	t.Logf("as uid 65534: %s", line)
	if !strings.Contains(line, "perm=true") || !strings.Contains(line, "unavail=true") {
		t.Fatalf("Available as nobody: %q, want a permission error\n%s", line, out)
	}
}

// TestAvailableNotNVMe: paths that are not NVMe namespaces.
func TestAvailableNotNVMe(t *testing.T) {
	for _, c := range []struct {
		path string
		want error
	}{
		{"/dev/null", ErrNotNVMe},
		{"/dev/nonexistent-ng9n9", ErrNotCharDevice},
		{"/proc/self/status", ErrNotCharDevice},
	} {
		err := Available(c.path)
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, c.want) {
			t.Errorf("Available(%s) = %v, want %v", c.path, err, c.want)
		}
	}
}
