package ctl

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/layout"
)

// TestPythonClient runs python/tests/test_client.py (the Python client's
// suite: round trips through the files, many entries, pitch, absent and
// corrupt groups, hostile requests, register refusals) against a real mount.
func TestPythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("skipping: python3 is not installed")
	}
	e := mountEnv(t, envOptions{slots: 128})
	bad := layout.Key{Block: 0x7600, Layer: 1, Head: 0, Kind: layout.K}
	e.put(blockKeys(e.geo, bad.Block), 1)
	e.corrupt(bad)
	root, err := filepath.Abs("../../python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, filepath.Join(root, "tests", "test_client.py"))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+root, "KVFS_MOUNT="+e.dir, "PYTHONDONTWRITEBYTECODE=1",
		fmt.Sprintf("KVFS_CORRUPT=%x %d %d %s", bad.Block, bad.Layer, bad.Head, bad.Kind))
	out, err := cmd.CombinedOutput()
	t.Logf("python3 test_client.py:\n%s", out)
	if err != nil {
		t.Fatalf("python client tests failed: %v", err)
	}
}
