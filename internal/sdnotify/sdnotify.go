// Package sdnotify reports service state to systemd (sd_notify(3)) over the
// datagram socket named by $NOTIFY_SOCKET, without cgo or libsystemd.
package sdnotify

import (
	"fmt"
	"net"
	"os"
)

// Notify sends state (e.g. "READY=1", "STOPPING=1", "RELOADING=1") to the
// socket in $NOTIFY_SOCKET. It returns sent=false and no error when the
// variable is unset (not run by systemd with Type=notify). An abstract
// socket is written "@name".
func Notify(state string) (sent bool, err error) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return false, nil
	}
	if addr[0] != '/' && addr[0] != '@' {
		return false, fmt.Errorf("sd_notify: NOTIFY_SOCKET %q: want a path or @abstract name", addr)
	}
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("sd_notify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("sd_notify: %w", err)
	}
	return true, nil
}
