package testbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/rxlane/rxlane/internal/netnsrun"
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

// inNS runs fn on a locked OS thread inside the named namespace (see
// netnsrun.Do; sysfs gives the thread the namespace's own /sys).
func inNS(name string, sysfs bool, fn func() error) error {
	return netnsrun.Do(filepath.Join(netnsDir, name), sysfs, fn)
}

// startInNS starts cmd inside the named namespace (with its own sysfs) and,
// if cpus is non-empty, pinned to those CPUs. The child inherits namespace,
// mounts and affinity from the locked thread that forks it.
func startInNS(name string, cpus []int, cmd *exec.Cmd) error {
	return inNS(name, true, func() error { return startPinned(cpus, cmd) })
}

// startPinned starts cmd from the calling thread (whose namespaces it
// inherits), pinned to cpus when cpus is non-empty.
func startPinned(cpus []int, cmd *exec.Cmd) error {
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
}
