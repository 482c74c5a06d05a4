package ctl

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestPythonTorchLayout runs python/tests/test_torch_layout.py: kvfs.torch's
// target math for NHD, HND and Hugging Face tensors (every byte a target
// names is the element torch holds there), the pin=True staging layout,
// tensor-parallel head ranges and the REGISTER_CUDA encoding. Pure Python,
// no torch, GPU or mount.
func TestPythonTorchLayout(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("skipping: python3 is not installed")
	}
	root, err := filepath.Abs("../../python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, filepath.Join(root, "tests", "test_torch_layout.py"))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+root, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 test_torch_layout.py:\n%s", out)
	if err != nil {
		t.Fatalf("kvfs.torch layout tests failed: %v", err)
	}
}

// TestPythonTorchPinned runs python/tests/test_torch_cpu.py against a real
// mount: kvfs.torch's pin=True path (staging, chunking, double buffering,
// the scatter into NHD, HND and Hugging Face tensors, tensor-parallel shards,
// absent blocks) on CPU tensors, every byte checked against the group files.
// It uses $KVFS_PYTHON where set, else python3, and skips where that has no
// torch, as the python3 on PATH in CI's `go test ./...`; the same file runs
// with torch installed (a missing torch failing the run) under
// TestPythonClient in make test-python. The GPU itself is exercised by
// integration/gpu/run_torch.sh.
func TestPythonTorchPinned(t *testing.T) {
	py := os.Getenv("KVFS_PYTHON")
	if py == "" {
		var err error
		if py, err = exec.LookPath("python3"); err != nil {
			t.Skip("skipping: python3 is not installed")
		}
	}
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		t.Skipf("skipping: %s has no torch (make test-python runs test_torch_cpu.py with torch)", py)
	}
	e := mountEnv(t, envOptions{slots: 64})
	root, err := filepath.Abs("../../python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, filepath.Join(root, "tests", "test_torch_cpu.py"))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+root, "KVFS_MOUNT="+e.dir, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 test_torch_cpu.py:\n%s", out)
	if err != nil {
		t.Fatalf("kvfs.torch pinned-path tests failed: %v", err)
	}
}
