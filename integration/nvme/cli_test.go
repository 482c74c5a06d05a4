package nvmeint

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestStoreCLI drives the kvfs binary (built by the rig into /bin/kvfs) on
// the namespace: --engine auto must pick the nvme engine for the NVMe
// block and char devices, and the uring engine must read the same store.
func TestStoreCLI(t *testing.T) {
	ng := testDevicePath(t)
	bin := os.Getenv("KVFS_BIN")
	if bin == "" {
		bin = "/bin/kvfs"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no kvfs binary at %s (the rig builds it; set KVFS_BIN elsewhere)", bin)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		t.Logf("kvfs %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Fatalf("kvfs %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	blk := blockDevice(ng)
	if _, err := os.Stat(blk); err != nil {
		t.Skipf("no %s", blk)
	}
	run("format", blk, "--size", "64MiB", "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
		"--block-tokens", "16", "--dtype", "bf16", "--force", "--log-level", "info")
	for _, c := range []struct{ path, engine, want string }{
		{blk, "auto", "nvme"},
		{ng, "auto", "nvme"},
		{blk, "uring", "uring"},
	} {
		out := run("info", c.path, "--engine", c.engine, "--log-level", "info")
		if !regexp.MustCompile(`(?m)^engine:\s+` + c.want + `$`).MatchString(out) {
			t.Errorf("kvfs info %s --engine %s: no \"engine: %s\" line in the output", c.path, c.engine, c.want)
		}
	}
	// kvfs info shows the FDP configuration and the handles' room.
	out := run("info", blk, "--engine", "nvme")
	if os.Getenv("KVFS_FDP") == "on" {
		if !regexp.MustCompile(`(?m)^fdp: on, .*handles`).MatchString(out) || !strings.Contains(out, "(pid 0, ruh 0, meta)") {
			t.Errorf("kvfs info on an FDP namespace: no FDP configuration and handles in the output")
		}
	} else if !strings.Contains(out, "fdp: off") {
		t.Errorf("kvfs info on a namespace without FDP: no \"fdp: off\" line")
	}
	// kvfs info says how the namespace is attached: over the fabric in
	// the rig's fabric boot, PCIe otherwise.
	want := "attachment: local, transport pcie"
	if os.Getenv("KVFS_FABRIC") == "on" {
		want = "attachment: fabric, transport tcp"
	}
	if !strings.Contains(out, want) {
		t.Errorf("kvfs info %s: no %q line", blk, want)
	}
	run("fsck", blk)
}
