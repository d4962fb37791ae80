// Package netns names a network namespace by one identity (the kernel's
// namespace inode, whatever path spelled it) and runs a function on an OS
// thread inside another network namespace, so that code which must not
// switch its own threads (long-lived programs, tests) can open sockets,
// netlink handles and sysfs files there.
package netns

import (
	"errors"
	"fmt"
	"runtime"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Do runs fn on a locked OS thread inside the network namespace file path
// (e.g. /run/netns/NAME); an empty path runs fn in the caller's namespace.
// Sockets created by fn belong to that namespace and may be used from any
// goroutine afterwards. With sysfs set, the thread also gets a private
// mount namespace with a sysfs of that network namespace on /sys (as `ip
// netns exec` does), so /sys/class/net shows the namespace's devices. Such
// a thread is never unlocked: it exits with the goroutine, taking its
// namespaces along, as does a thread that could not switch back.
func Do(path string, sysfs bool, fn func() error) error {
	if path == "" && !sysfs {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		target := orig
		if path != "" {
			if target, err = vnetns.GetFromPath(path); err != nil {
				errc <- fmt.Errorf("open netns %s: %w", path, err)
				return
			}
			defer target.Close()
		}
		if err := vnetns.Set(target); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		if sysfs {
			if err := privateSysfs(); err != nil {
				errc <- fmt.Errorf("netns %s: %w", path, err)
				return
			}
			errc <- fn()
			return // thread is tainted: let it die locked
		}
		ferr := fn()
		if err := vnetns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave netns %s: %w", path, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// privateSysfs gives the calling thread its own mount namespace with a fresh
// sysfs, which shows the devices of the thread's current network namespace.
// Nothing is changed outside the thread: mounts are not propagated back.
func privateSysfs() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make / rslave: %w", err)
	}
	err := unix.Mount("sysfs", "/sys", "sysfs", 0, "")
	if errors.Is(err, unix.EBUSY) {
		// The namespace's sysfs is the one already on /sys (the
		// caller's own namespace, e.g. under `ip netns exec`): the
		// kernel refuses to stack a superblock on itself.
		return nil
	}
	if err != nil {
		return fmt.Errorf("mount sysfs: %w", err)
	}
	return nil
}
