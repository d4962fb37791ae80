package netns

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ShareDir makes dir, where namespaces are bind-mounted onto files, a
// shared mount point of its own, as iproute2's `ip netns add` does before
// its first namespace. A namespace mounted while dir is a plain directory
// is hidden the moment anyone else (ip netns, a CNI plugin, podman) turns
// dir into that mount point: its file is then no mount in the new mount,
// so it can neither be unmounted nor removed (EBUSY) and the namespace
// leaks. Making dir the mount point first keeps every namespace's mount
// in the mount everyone sees; when dir already is one, only the sharing
// is (re)applied.
func ShareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns dir: %w", err)
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if !errors.Is(err, unix.EINVAL) {
		if err != nil {
			return fmt.Errorf("share %s: %w", dir, err)
		}
		return nil
	}
	// not a mount point yet: bind it onto itself, then share it
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("share %s: %w", dir, err)
	}
	return nil
}
