package testbed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/rxlane/rxlane/internal/netns"
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

func createNS(name string) error { return netns.NewNamed(name) }

func deleteNS(name string) error { return netns.DeleteNamed(name) }

// inNS runs fn on a locked OS thread inside the named namespace (see
// netns.Do; sysfs gives the thread the namespace's own /sys).
func inNS(name string, sysfs bool, fn func() error) error {
	return netns.Do(filepath.Join(netnsDir, name), sysfs, fn)
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
