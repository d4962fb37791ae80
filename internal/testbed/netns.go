package testbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named network namespaces are bind-mounted, the same
// place iproute2 uses, so `ip netns` sees the testbed's nodes too.
const netnsDir = "/run/netns"

// nsExists reports whether a named network namespace exists.
func nsExists(name string) bool {
	_, err := os.Stat(filepath.Join(netnsDir, name))
	return err == nil
}

// createNS creates a named network namespace without leaving the calling
// goroutine's thread in it. netns.NewNamed switches the current thread into
// the new namespace, so it runs on a locked thread that switches back; if
// switching back fails the thread stays locked and dies with the goroutine.
func createNS(name string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if err != nil {
			// NewNamed may already have switched before failing.
			if serr := netns.Set(orig); serr == nil {
				runtime.UnlockOSThread()
			}
			errc <- fmt.Errorf("create netns %s: %w", name, err)
			return
		}
		h.Close()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("return from netns %s: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	return <-errc
}

// deleteNS removes a named namespace; a namespace that is already gone is
// not an error, so teardown can be repeated.
func deleteNS(name string) error {
	err := netns.DeleteNamed(name)
	if err == nil || errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !nsExists(name) {
		return nil
	}
	return fmt.Errorf("delete netns %s: %w", name, err)
}

// inNS runs fn on a locked OS thread inside the named namespace. Sockets
// created by fn belong to that namespace and may be used from any goroutine
// afterwards. With sysfs set, the thread also gets a private mount namespace
// with a sysfs of that network namespace on /sys (as `ip netns exec` does),
// so /sys/class/net shows the namespace's devices. Such a thread is never
// unlocked: it exits with the goroutine, taking its namespaces along.
func inNS(name string, sysfs bool, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(name)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", name, err)
			return
		}
		if sysfs {
			if err := privateSysfs(); err != nil {
				errc <- fmt.Errorf("netns %s: %w", name, err)
				return
			}
			errc <- fn()
			return // thread is tainted: let it die locked
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave netns %s: %w", name, err))
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
	if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		return fmt.Errorf("mount sysfs: %w", err)
	}
	return nil
}

// startInNS starts cmd inside the named namespace (with its own sysfs) and,
// if cpus is non-empty, pinned to those CPUs. The child inherits namespace,
// mounts and affinity from the locked thread that forks it.
func startInNS(name string, cpus []int, cmd *exec.Cmd) error {
	return inNS(name, true, func() error {
		if len(cpus) > 0 {
			var set unix.CPUSet
			for _, c := range cpus {
				set.Set(c)
			}
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				return fmt.Errorf("pin to cpus %v: %w", cpus, err)
			}
		}
		return cmd.Start()
	})
}
