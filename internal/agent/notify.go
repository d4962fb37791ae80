package agent

import (
	"fmt"
	"net"
	"os"
)

// Notify sends state (e.g. "READY=1", "STOPPING=1") to the service
// manager's $NOTIFY_SOCKET, the sd_notify protocol: one datagram on a
// unixgram socket, a leading '@' naming an abstract socket. Without
// $NOTIFY_SOCKET (not run by systemd with Type=notify) it does nothing.
func Notify(state string) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify %s: %w", state, err)
	}
	return nil
}
