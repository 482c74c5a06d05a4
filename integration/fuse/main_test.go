package fuseint

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

var (
	kvfsBin  string // the kvfs binary built for these tests
	skipWhy  string // why every test skips, when it does
	setupErr error
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	switch {
	case os.Geteuid() != 0 && !haveCmd("fusermount3"):
		skipWhy = "skipping: the FUSE end-to-end tests need root (or fusermount3); CI runs them as root"
	case !exists("/dev/fuse"):
		skipWhy = "skipping: /dev/fuse is missing; CI provides it"
	}
	if skipWhy != "" {
		return m.Run()
	}
	if bin := os.Getenv("KVFS_BIN"); bin != "" {
		// A prebuilt binary (machines without a Go toolchain).
		kvfsBin = bin
		return m.Run()
	}
	if !haveCmd("getfattr") && os.Geteuid() == 0 {
		// The attr package gives getfattr; try the cached lists first.
		if exec.Command("apt-get", "install", "-y", "-q", "attr").Run() != nil {
			_ = exec.Command("apt-get", "update", "-q").Run()
			_ = exec.Command("apt-get", "install", "-y", "-q", "attr").Run()
		}
	}

	dir, err := os.MkdirTemp("", "kvfs-fuse-bin")
	if err != nil {
		setupErr = err
		return m.Run()
	}
	defer os.RemoveAll(dir)
	kvfsBin = filepath.Join(dir, "kvfs")
	build := exec.Command("go", "build", "-o", kvfsBin, "github.com/kvfs/kvfs/cmd/kvfs")
	if out, err := build.CombinedOutput(); err != nil {
		setupErr = fmt.Errorf("go build kvfs: %v\n%s", err, out)
	}
	return m.Run()
}

func haveCmd(name string) bool { _, err := exec.LookPath(name); return err == nil }

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// need skips or fails the test when the environment is not usable.
func need(t *testing.T) {
	t.Helper()
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	if setupErr != nil {
		t.Fatal(setupErr)
	}
}

// defaultGeo is make run's geometry: 32 layers, 8 KV heads, head_dim 128,
// 16 tokens, bf16 (4 KiB groups, 2 MiB blocks).
var defaultGeo = layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}

// kvfs runs the kvfs binary and fails the test on a non-zero exit.
func kvfs(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(kvfsBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kvfs %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newStore formats a store of the default geometry in a temporary directory.
func newStore(t *testing.T, size string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "test.kvfs")
	kvfs(t, "format", p, "--size", size, "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--block-tokens", "16", "--dtype", "bf16")
	return p
}

// daemon is a kvfs mount running in the foreground of a child process.
type daemon struct {
	t     *testing.T
	cmd   *exec.Cmd
	store string
	mnt   string
	log   string
	done  chan error
}

// startMount runs kvfs mount STORE MNT in a child process and waits until
// the mount answers.
func startMount(t *testing.T, storePath, mnt string, extra ...string) *daemon {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "mount.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	return startMountOut(t, logf, logPath, storePath, mnt, extra...)
}

// startMountOut is startMount with the daemon's stdout and stderr on out
// (logPath, if not "", is where logText reads).
func startMountOut(t *testing.T, out *os.File, logPath, storePath, mnt string, extra ...string) *daemon {
	t.Helper()
	args := append([]string{"mount", storePath, mnt, "--log-level", "info"}, extra...)
	cmd := exec.Command(kvfsBin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, cmd: cmd, store: storePath, mnt: mnt, log: logPath, done: make(chan error, 1)}
	go func() { d.done <- cmd.Wait() }()
	t.Cleanup(d.cleanup)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if mi, ok, _ := fs.FindMount(mnt); ok && mi.FSType == "fuse.kvfs" && exists(filepath.Join(mnt, ".kvfs", "geometry")) {
			return d
		}
		select {
		case err := <-d.done:
			d.done <- err
			t.Fatalf("kvfs mount exited: %v\n%s", err, d.logText())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("mount not ready after 20 s\n%s", d.logText())
		}
	}
}

func (d *daemon) logText() string {
	b, _ := os.ReadFile(d.log)
	return string(b)
}

// stop sends sig and waits for the daemon to exit, returning its error.
func (d *daemon) stop(sig syscall.Signal) error {
	_ = d.cmd.Process.Signal(sig)
	return d.wait(30 * time.Second)
}

// wait waits for the daemon to exit, returning its error.
func (d *daemon) wait(limit time.Duration) error {
	select {
	case err := <-d.done:
		d.done <- err
		return err
	case <-time.After(limit):
		d.t.Fatalf("daemon did not exit within %v\n%s", limit, d.logText())
		return nil
	}
}

func (d *daemon) cleanup() {
	select {
	case err := <-d.done:
		d.done <- err
	default:
		_ = d.stop(syscall.SIGTERM)
	}
	if _, ok, _ := fs.FindMount(d.mnt); ok {
		_ = fs.Detach(d.mnt)
	}
}

// sh runs a shell command line and returns its combined output and error.
func sh(dir, script string) (string, error) {
	c := exec.Command("bash", "-c", script)
	c.Dir = dir
	out, err := c.CombinedOutput()
	return string(out), err
}

func mustSh(t *testing.T, dir, script string) string {
	t.Helper()
	out, err := sh(dir, script)
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return out
}

func groupBytes(seed uint64) []byte {
	b := make([]byte, defaultGeo.GroupBytes())
	r := rand.New(rand.NewPCG(seed, ^seed))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// diskOffset is where group k lies in the store file, computed from the
// superblock and the slot the group's xattr user.kvfs.slot reports.
func diskOffset(t *testing.T, storePath string, k layout.Key, slot int64) int64 {
	t.Helper()
	f, err := os.Open(storePath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, store.SuperblockSize)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	sb, err := store.UnmarshalSuperblock(b)
	if err != nil {
		t.Fatal(err)
	}
	g := sb.Geometry
	return sb.DataOffset + slot*sb.SlotBytes + 2*sb.HeaderBytes + g.Offset(g.Index(k))
}

func fileEqual(t *testing.T, path string, want []byte) error {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return errors.New("bytes differ")
	}
	return nil
}
