package ctl

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/layout"
)

// TestPythonClient runs the Python client's suite against a real mount:
// test_client.py (round trips through the files, many entries, pitch,
// absent and corrupt groups, hostile requests, register refusals), and with
// KVFS_PYTHON all of python/tests: kvfs.torch's pinned path on CPU tensors
// (test_torch_cpu.py), a tiny random Llama's transformers cache stored and
// loaded back with identical generation (test_hf_roundtrip.py), and
// kvfs.hf's prefix cache (test_hf_prefix.py: shared prefixes and partial
// hits on this mount; evictions, a corrupt group and a killed daemon on
// daemons of its own, run from the kvfs binary this test builds and passes
// as KVFS_BIN).
//
// With KVFS_PYTHON set (scripts/test-python.sh: a venv where `pip install
// ./python` put the client, with torch and transformers) it runs
// `$KVFS_PYTHON -m pytest python/tests` against that install, from outside
// the checkout; KVFS_TEST_REQUIRE from the environment then makes a skipped
// test fail (python/tests/conftest.py). Otherwise it runs test_client.py
// with python3 and PYTHONPATH=python.
func TestPythonClient(t *testing.T) {
	py, installed := os.Getenv("KVFS_PYTHON"), true
	if py == "" {
		var err error
		if py, err = exec.LookPath("python3"); err != nil {
			t.Skip("skipping: python3 is not installed")
		}
		installed = false
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
	cmd.Env = append(os.Environ(), "PYTHONPATH="+root)
	if installed {
		bin := filepath.Join(t.TempDir(), "kvfs")
		build := exec.Command("go", "build", "-o", bin, "github.com/kvfs/kvfs/cmd/kvfs")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build kvfs: %v\n%s", err, out)
		}
		cmd = exec.Command(py, "-m", "pytest", "-p", "no:cacheprovider", "-v", filepath.Join(root, "tests"))
		cmd.Dir = t.TempDir() // "import kvfs" must find the installed client, not python/kvfs
		cmd.Env = append(os.Environ(), "KVFS_BIN="+bin)
	}
	cmd.Env = append(cmd.Env, "KVFS_MOUNT="+e.dir, "PYTHONDONTWRITEBYTECODE=1",
		fmt.Sprintf("KVFS_CORRUPT=%x %d %d %s", bad.Block, bad.Layer, bad.Head, bad.Kind))
	out, err := cmd.CombinedOutput()
	t.Logf("%s:\n%s", cmd.Args, out)
	if err != nil {
		t.Fatalf("python client tests failed: %v", err)
	}
}
