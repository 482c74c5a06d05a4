package ctl

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/client"
)

// kvfsBinary is the kvfs command: $KVFS_BIN, or built into dir.
func kvfsBinary(t *testing.T, dir string) string {
	t.Helper()
	if bin := os.Getenv("KVFS_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(dir, "kvfs")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kvfs/kvfs/cmd/kvfs").CombinedOutput(); err != nil {
		t.Skipf("skipping: cannot build kvfs (set KVFS_BIN): %v: %s", err, out)
	}
	return bin
}

// lockedBuffer collects a child's output for the test's messages.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSIGTERMWithStreamingClient: kvfs mount, run where fusectl is not
// mounted (its own mount namespace, fusectl unmounted there), stops within
// 10 s of SIGTERM while a client keeps its control file open and streams
// STOREs, and every STORE it answered reads back after a remount.
func TestSIGTERMWithStreamingClient(t *testing.T) {
	requireMount(t)
	dir := t.TempDir()
	bin := kvfsBinary(t, dir)
	st, mnt := filepath.Join(dir, "s.kvfs"), filepath.Join(dir, "m")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	g := testGeo
	if out, err := exec.Command(bin, "format", st, "--size", "128MiB", "--layers", fmt.Sprint(g.Layers),
		"--kv-heads", fmt.Sprint(g.KVHeads), "--head-dim", fmt.Sprint(g.HeadDim), "--block-tokens", fmt.Sprint(g.BlockTokens),
		"--dtype", "bf16").CombinedOutput(); err != nil {
		t.Fatalf("format: %v: %s", err, out)
	}

	// The daemon's mount namespace is private (Go makes / MS_REC|MS_PRIVATE
	// after unshare), so unmounting fusectl there leaves the machine's alone;
	// the daemon's mount is reached through /proc/<pid>/root.
	daemon := exec.Command("/bin/sh", "-c",
		`while umount /sys/fs/fuse/connections 2>/dev/null; do :; done; exec "$0" mount "$1" "$2"`, bin, st, mnt)
	var log lockedBuffer
	daemon.Stdout, daemon.Stderr = &log, &log
	daemon.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	exited, gone := make(chan error, 1), make(chan struct{})
	go func() {
		err := daemon.Wait()
		close(gone)
		exited <- err
	}()
	t.Cleanup(func() {
		select {
		case <-gone:
		default:
			daemon.Process.Kill()
			<-gone
		}
	})
	pid := daemon.Process.Pid
	view := fmt.Sprintf("/proc/%d/root%s", pid, mnt)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(view, client.CtlPath)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not mount:\n%s", log.String())
		}
		select {
		case err := <-exited:
			t.Fatalf("the daemon exited: %v\n%s", err, log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), " - fusectl ") {
		t.Fatalf("fusectl is still mounted in the daemon's namespace:\n%s", mi)
	}

	c, err := client.Open(view)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const blocks = 256
	gpb, gb := g.GroupsPerBlock(), g.GroupBytes()
	buf, err := c.NewHostBuffer("", int64(gpb*gb))
	if err != nil {
		t.Fatal(err)
	}
	// The client stores block n%256 with version n, for ever: acked holds
	// the version last answered OK per block, inflight the one being
	// stored when the stream ended.
	var mu sync.Mutex
	acked := map[uint64]uint64{}
	var inflight struct{ block, version uint64 }
	var calls int
	streamErr := make(chan error, 1)
	firstRound := make(chan struct{})
	go func() {
		es := make([]client.Entry, gpb)
		for n := uint64(0); ; n++ {
			b := n % blocks
			for i := range es {
				k := g.KeyAt(b, i)
				copy(buf.Mem[i*gb:], groupData(gb, k, n))
				es[i] = client.Entry{Key: k, Buffer: buf.ID, Offset: uint64(i * gb)}
			}
			mu.Lock()
			inflight.block, inflight.version = b, n
			mu.Unlock()
			sts, err := c.Store(es)
			if err == nil && !allOK(sts) {
				err = fmt.Errorf("store of block %d: %v", b, sts)
			}
			if err != nil {
				streamErr <- err
				return
			}
			mu.Lock()
			acked[b] = n
			calls++
			mu.Unlock()
			if n == blocks {
				close(firstRound)
			}
		}
	}()
	select {
	case <-firstRound:
	case err := <-streamErr:
		t.Fatalf("the client failed before the signal: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the client did not store its blocks")
	}
	mu.Lock()
	before := calls
	mu.Unlock()

	start := time.Now()
	daemon.Process.Signal(syscall.SIGTERM)
	const bound = 10 * time.Second
	select {
	case err := <-exited:
		took := time.Since(start)
		t.Logf("the daemon exited %v after SIGTERM: %v", took, err)
		if err != nil {
			t.Errorf("exit status: %v\n%s", err, log.String())
		}
		if took > bound {
			t.Errorf("the daemon took %v to stop, more than %v", took, bound)
		}
	case <-time.After(bound + 5*time.Second):
		mu.Lock()
		n := calls - before
		mu.Unlock()
		t.Fatalf("the daemon still runs %v after SIGTERM; the client made %d calls since:\n%s", time.Since(start), n, log.String())
	}
	var serr error
	select {
	case serr = <-streamErr:
	case <-time.After(5 * time.Second):
		t.Fatal("the client's calls still succeed after the daemon exited")
	}
	if !errors.Is(serr, syscall.ENOTCONN) && !errors.Is(serr, syscall.ECONNABORTED) {
		t.Errorf("the client's stream ended with %v, want ENOTCONN or ECONNABORTED", serr)
	}
	mu.Lock()
	t.Logf("%d calls before the signal, %d after; the stream ended with %v", before, calls-before, serr)
	mu.Unlock()
	c.Close()

	// Remount: every answered STORE reads back (the one in flight at the
	// abort may have landed too).
	if out, err := exec.Command(bin, "mount", "--daemon", "--log-file", filepath.Join(dir, "remount.log"), st, mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v: %s", err, out)
	}
	defer func() {
		if out, err := exec.Command(bin, "umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount: %v: %s", err, out)
		}
	}()
	for b, v := range acked {
		for i := range gpb {
			k := g.KeyAt(b, i)
			got, err := os.ReadFile(filepath.Join(mnt, g.Name(k)))
			if err != nil {
				t.Fatalf("block %d (stored as version %d): %v", b, v, err)
			}
			if bytes.Equal(got, groupData(gb, k, v)) {
				continue
			}
			if b == inflight.block && bytes.Equal(got, groupData(gb, k, inflight.version)) {
				continue
			}
			t.Fatalf("%v: not the version %d the daemon answered for", k, v)
		}
	}
}
