package sdnotify

import (
	"net"
	"path/filepath"
	"testing"
)

func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func recv(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	b := make([]byte, 256)
	n, err := c.Read(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
}

func TestNotifyPath(t *testing.T) {
	p := filepath.Join(t.TempDir(), "notify")
	c := listen(t, p)
	t.Setenv("NOTIFY_SOCKET", p)
	if sent, err := Notify("READY=1"); !sent || err != nil {
		t.Fatalf("Notify: %v %v", sent, err)
	}
	if got := recv(t, c); got != "READY=1" {
		t.Fatalf("got %q", got)
	}
}

func TestNotifyAbstract(t *testing.T) {
	name := "kvfs-sdnotify-test-" + filepath.Base(t.TempDir())
	c := listen(t, "@"+name) // Go maps a leading @ to the abstract namespace
	t.Setenv("NOTIFY_SOCKET", "@"+name)
	if sent, err := Notify("STOPPING=1"); !sent || err != nil {
		t.Fatalf("Notify: %v %v", sent, err)
	}
	if got := recv(t, c); got != "STOPPING=1" {
		t.Fatalf("got %q", got)
	}
}

func TestNotifyUnset(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if sent, err := Notify("READY=1"); sent || err != nil {
		t.Fatalf("unset: %v %v", sent, err)
	}
	t.Setenv("NOTIFY_SOCKET", "relative")
	if _, err := Notify("READY=1"); err == nil {
		t.Fatal("a relative NOTIFY_SOCKET was accepted")
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "nobody-listens"))
	if _, err := Notify("READY=1"); err == nil {
		t.Fatal("a socket nobody listens on was accepted")
	}
}
