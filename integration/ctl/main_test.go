package ctl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/client"
)

// The test binary doubles as a client process: with KVFS_CTL_HELPER set it
// runs that helper instead of the tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("KVFS_CTL_HELPER"); mode != "" {
		os.Exit(helper(mode))
	}
	os.Exit(m.Run())
}

func helper(mode string) int {
	mnt := os.Getenv("KVFS_CTL_MOUNT")
	c, err := client.Open(mnt)
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	defer c.Close()
	switch mode {
	case "register":
		// Print the errno of registering KVFS_CTL_PATH (0 on success).
		_, err := c.RegisterHost(os.Getenv("KVFS_CTL_PATH"), 0)
		return printErrno(err)
	case "registerfd":
		// Open KVFS_CTL_PATH read-write here and register the descriptor;
		// print "open=ERRNO" when the open fails, else "errno=ERRNO".
		f, err := os.OpenFile(os.Getenv("KVFS_CTL_PATH"), os.O_RDWR, 0)
		if err != nil {
			var en syscall.Errno
			if !errors.As(err, &en) {
				fmt.Println("error:", err)
				return 1
			}
			fmt.Printf("open=%d\n", int(en))
			return 0
		}
		defer f.Close()
		_, err = c.RegisterFD(int(f.Fd()), 0)
		return printErrno(err)
	case "pin":
		// Lower RLIMIT_MEMLOCK to KVFS_CTL_MEMLOCK bytes, then create a
		// host buffer of KVFS_CTL_SIZE bytes; print the errno.
		lim, _ := strconv.ParseUint(os.Getenv("KVFS_CTL_MEMLOCK"), 10, 64)
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: lim, Max: lim}); err != nil {
			fmt.Println("setrlimit:", err)
			return 1
		}
		size, _ := strconv.ParseInt(os.Getenv("KVFS_CTL_SIZE"), 10, 64)
		b, err := c.NewHostBuffer("", size)
		if err == nil {
			fmt.Printf("pinned=%v\n", b.Pinned)
		} else {
			fmt.Println(err)
		}
		return printErrno(err)
	case "loadloop":
		// Load whole blocks KVFS_CTL_BLOCKS (hex, comma separated) into a
		// host buffer at KVFS_CTL_PATH until killed.
		var blocks []uint64
		for _, s := range strings.Split(os.Getenv("KVFS_CTL_BLOCKS"), ",") {
			b, err := strconv.ParseUint(s, 16, 64)
			if err != nil {
				fmt.Println("blocks:", err)
				return 1
			}
			blocks = append(blocks, b)
		}
		g := c.Info().Geometry
		var es []client.Entry
		for _, b := range blocks {
			for i := range g.GroupsPerBlock() {
				es = append(es, client.Entry{Key: g.KeyAt(b, i), Offset: uint64(len(es) * c.Info().GroupBytes)})
			}
		}
		buf, err := c.NewHostBuffer(filepath.Base(os.Getenv("KVFS_CTL_PATH")), int64(len(es)*c.Info().GroupBytes))
		if err != nil {
			fmt.Println("buffer:", err)
			return 1
		}
		for i := range es {
			es[i].Buffer = buf.ID
		}
		st := make([]client.Status, len(es))
		for n := 0; ; n++ {
			if _, err := c.Batch(true, es, st, nil); err != nil {
				fmt.Println("load:", err)
				return 1
			}
			if n == 0 {
				fmt.Println("ready")
			}
		}
	}
	if rc, ok := blocksHelper(mode, c); ok {
		return rc
	}
	if rc, ok := hardening2Helper(mode, c); ok {
		return rc
	}
	fmt.Println("unknown helper", mode)
	return 2
}

// printErrno prints "errno=N" for err (0 for nil), the helpers' answer.
func printErrno(err error) int {
	var e *client.Error
	switch {
	case err == nil:
		fmt.Println("errno=0")
	case errors.As(err, &e):
		fmt.Printf("errno=%d\n", int(e.Errno))
	default:
		fmt.Println("error:", err)
		return 1
	}
	return 0
}

// helperCmd prepares the test binary as a helper process. With cred set,
// the binary is first copied where any user may run it.
func helperCmd(t *testing.T, e *env, mode string, cred *syscall.Credential, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		dir := filepath.Join(filepath.Dir(e.dir), "bin")
		os.MkdirAll(dir, 0o755)
		dst := filepath.Join(dir, "helper")
		if _, err := os.Stat(dst); err != nil {
			if err := copyFile(exe, dst); err != nil {
				t.Fatal(err)
			}
		}
		exe = dst
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), append([]string{"KVFS_CTL_HELPER=" + mode, "KVFS_CTL_MOUNT=" + e.dir}, env...)...)
	cmd.Dir = "/"
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	return cmd
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// registerAs runs the register helper as cred and returns the errno.
func registerAs(t *testing.T, e *env, cred *syscall.Credential, path string) syscall.Errno {
	t.Helper()
	return helperErrno(t, e, "register", cred, "KVFS_CTL_PATH="+path)
}

// registerFDAs runs the registerfd helper as cred: the errno of opening
// path read-write there (open true), or else of registering the descriptor.
func registerFDAs(t *testing.T, e *env, cred *syscall.Credential, path string) (errno syscall.Errno, open bool) {
	t.Helper()
	out := helperOut(t, e, "registerfd", cred, "KVFS_CTL_PATH="+path)
	if v, ok := strings.CutPrefix(out, "open="); ok {
		n, _ := strconv.Atoi(v)
		return syscall.Errno(n), true
	}
	return parseErrno(t, out), false
}

func helperErrno(t *testing.T, e *env, mode string, cred *syscall.Credential, env ...string) syscall.Errno {
	t.Helper()
	return parseErrno(t, helperOut(t, e, mode, cred, env...))
}

// helperOut runs a helper to its end and returns its last "key=value" line.
func helperOut(t *testing.T, e *env, mode string, cred *syscall.Credential, env ...string) string {
	t.Helper()
	out, err := helperCmd(t, e, mode, cred, env...).CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	last := ""
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "errno=") || strings.HasPrefix(sc.Text(), "open=") {
			last = sc.Text()
		}
	}
	if last == "" {
		t.Fatalf("helper said %q", out)
	}
	return last
}

func parseErrno(t *testing.T, line string) syscall.Errno {
	t.Helper()
	v, ok := strings.CutPrefix(line, "errno=")
	if !ok {
		t.Fatalf("helper said %q", line)
	}
	n, _ := strconv.Atoi(v)
	return syscall.Errno(n)
}
