package testbed

import "fmt"

// DoSysfs runs fn on a thread inside node n that has the node's own sysfs
// mounted on /sys (privately, like `ip netns exec`), so /sys/class/net shows
// n's devices and their queues/*/rps_cpus and xps_cpus can be read and
// written. Nothing outside fn's thread sees the mount.
func DoSysfs(c Config, n Node, fn func() error) error { return DoSysfsNamed(c.NS(n), fn) }

// DoSysfsNamed is DoSysfs for any named network namespace (/run/netns/NAME).
func DoSysfsNamed(ns string, fn func() error) error {
	if !nsExists(ns) {
		return fmt.Errorf("netns %s does not exist: %w", ns, ErrNotUp)
	}
	return inNS(ns, true, fn)
}
