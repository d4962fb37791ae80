// Package bpffs makes sure a directory for pinned BPF objects lies on a
// BPF filesystem, mounting the conventional one at /sys/fs/bpf when it is
// absent.
//
// rxlane mounts /sys/fs/bpf itself and leaves it mounted, as systemd does
// at boot on most distributions: an empty bpffs costs nothing, other
// tools (bpftool, Cilium) expect it there, and unmounting it would free
// every object anyone pinned under it since (each pin lives only as long
// as its bpffs instance), which rxlane cannot rule out without racing
// those tools. What rxlane pins it removes again; the mount stays.
package bpffs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Root is where distributions mount the BPF filesystem.
const Root = "/sys/fs/bpf"

// LockFile serialises the check-and-mount of Root among rxlane processes:
// two mounts stacked on Root would hide the first one's pins.
var LockFile = "/run/rxlane/bpffs.lock"

// IsBPFFS says whether path (which must exist) is on a BPF filesystem.
func IsBPFFS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && uint32(st.Type) == unix.BPF_FS_MAGIC
}

// existingAncestor is the nearest ancestor of path (or path) that exists.
func existingAncestor(path string) string {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil || p == "/" {
			return p
		}
	}
}

// Ensure makes sure dir can hold pins: its nearest existing ancestor is on
// a BPF filesystem, or dir lies under Root and Root gets one mounted
// (mode 0700, nosuid, nodev, noexec, as systemd mounts it). It does not
// create dir.
func Ensure(dir string) error {
	if IsBPFFS(existingAncestor(dir)) {
		return nil
	}
	clean := filepath.Clean(dir)
	if clean != Root && !strings.HasPrefix(clean, Root+"/") {
		return fmt.Errorf("%s is not on a BPF filesystem: mount one above it (mount -t bpf bpf DIR) or pin under %s", dir, Root)
	}
	if err := os.MkdirAll(filepath.Dir(LockFile), 0o755); err != nil {
		return fmt.Errorf("lock for mounting %s: %w", Root, err)
	}
	lf, err := os.OpenFile(LockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("lock for mounting %s: %w", Root, err)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock for mounting %s: %w", Root, err)
	}
	if IsBPFFS(Root) {
		return nil // another process mounted it meanwhile
	}
	if _, err := os.Stat(Root); err != nil {
		return fmt.Errorf("cannot mount the BPF filesystem: %w (is sysfs mounted at /sys?)", err)
	}
	if err := unix.Mount("bpf", Root, "bpf", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("mount the BPF filesystem at %s: %w (needs root, CAP_SYS_ADMIN)", Root, err)
		}
		return fmt.Errorf("mount the BPF filesystem at %s: %w", Root, err)
	}
	return nil
}
